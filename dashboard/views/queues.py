"""The Queues page: per queue its pause, its limits in force (settings or run-time overrides),
how full they are and what waits (ox.flow.waiting.queue_flows); Pause, Resume and limit
overrides through ox.flow.queues, the same functions `manage.py ox_queue` and the admin call
(so idle workers are NOTIFYed). Acting needs ox.change_task, as retry and cancel do."""

from dataclasses import dataclass, field

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.urls import reverse

from dashboard.access import can_change_tasks, change_task_required, view_task_required
from dashboard.queue_forms import LimitForm, initial_for
from dashboard.rendering import render_page
from ox.flow import queues
from ox.flow.limits import LIMIT_FIELDS, QueueLimits, Rate, merged
from ox.flow.waiting import QueueFlow, queue_flows, settings_limits
from ox.models import QueueState
from ox.stats import configured_queues


@dataclass(frozen=True)
class LimitRow:
    field: str
    value: str  # in force: "3", "50/s", or "none" when an override lifted it
    source: str  # "settings" or "override"
    settings: str  # the settings' value ("" when the settings set none)


@dataclass
class QueueRow:
    flow: QueueFlow
    limits: list[LimitRow]
    form: LimitForm
    state: QueueState | None = None  # who changed the queue last, and when
    errors: list[str] = field(default_factory=list)


def _text(value: int | Rate | None) -> str:
    return "" if value is None else str(value)


def limit_rows(limits: QueueLimits, settings: QueueLimits, overrides: dict[str, object]) -> list[LimitRow]:
    """The limits worth a line: those in force, and those an override lifted."""
    rows = []
    for name in LIMIT_FIELDS:
        now, base = getattr(limits, name), getattr(settings, name)
        if now is None and name not in overrides:
            continue
        source = "override" if name in overrides else "settings"
        rows.append(LimitRow(name, _text(now) or "none", source, _text(base)))
    return rows


def _rows(bound: LimitForm | None = None) -> list[QueueRow]:
    flows = queue_flows()
    states = QueueState.objects.in_bulk([f.name for f in flows])
    rows = []
    for i, flow in enumerate(flows):
        auto_id = f"q{i}-%s"  # one form per queue on the page: ids must not repeat
        mine = bound is not None and bound.data.get("queue") == flow.name
        form = bound if mine else LimitForm(initial=initial_for(flow.name, flow.view.overrides), auto_id=auto_id)
        if mine:
            form.auto_id = auto_id
        for name in LIMIT_FIELDS:
            # An empty field means "the settings' value": show that value in it.
            form.fields[name].widget.attrs["placeholder"] = _text(getattr(flow.view.settings, name)) or "no limit"
        limits = limit_rows(flow.limits, flow.view.settings, flow.view.overrides)
        rows.append(QueueRow(flow, limits, form, states.get(flow.name)))
    return rows


def _page(request: HttpRequest, bound: LimitForm | None = None, status: int = 200) -> HttpResponse:
    context = {"rows": _rows(bound), "can_change": can_change_tasks(request)}
    response = render_page(request, "dashboard/queues.html", context, "live")
    response.status_code = status
    return response


@view_task_required
def queue_list(request: HttpRequest) -> HttpResponse:
    return _page(request)


def _known(name: str) -> bool:
    """A queue the page lists: configured, limited in the settings, or with a row. With no
    QUEUES declared any valid name is a queue, as `manage.py ox_queue` has it."""
    if not configured_queues():
        return True
    return name in {v.name for v in queues.views(settings_limits(), configured_queues())}


def _queue(request: HttpRequest) -> str | None:
    name = request.POST.get("queue", "")
    try:
        queues.check_name(name)
    except ValueError:
        return None
    return name if _known(name) else None


def _by(request: HttpRequest) -> str:
    return request.user.get_username()


@change_task_required
def pause_or_resume(request: HttpRequest, action: str) -> HttpResponse:
    name = _queue(request)
    if name is None:
        return HttpResponseBadRequest("queue must be one of the queues listed")
    (queues.pause if action == "pause" else queues.resume)(name, by=_by(request))
    messages.success(request, f"{name}: {'paused' if action == 'pause' else 'resumed'}")
    return HttpResponseRedirect(reverse("dashboard:queues"))


@change_task_required
def limit(request: HttpRequest) -> HttpResponse:
    name = _queue(request)
    if name is None:
        return HttpResponseBadRequest("queue must be one of the queues listed")
    form = LimitForm(request.POST)
    if "reset" in request.POST:
        overrides: dict[str, object] = {}
    elif form.is_valid():
        overrides = form.overrides()
    else:
        return _page(request, form, status=400)
    try:
        state = queues.set_limits(name, overrides, by=_by(request))
    except ValueError as exc:
        # set_limits checks every field before it writes: nothing changed.
        form.is_valid()  # add_error needs cleaned_data (the reset path did not validate)
        form.add_error(None, str(exc))
        return _page(request, form, status=400)
    now = merged(settings_limits().get(name, QueueLimits()), state.overrides).describe()
    if overrides:
        messages.success(request, f"{name}: limits now {now}")
    else:
        messages.success(request, f"{name}: limits back to the settings ({now})")
    return HttpResponseRedirect(reverse("dashboard:queues"))
