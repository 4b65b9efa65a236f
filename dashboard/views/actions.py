"""Retry and cancel: POST only, ox.change_task only, and always through ox.operations, the
same functions the admin's actions call."""

import uuid
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from dashboard.access import can_change_tasks, change_task_required, view_task_required
from dashboard.filters import TaskFilter
from ox import operations
from ox.models import ArchivedTask, Task
from ox.operations import RETRYABLE, Changed

ACTIONS = {"retry": operations.retry, "cancel": operations.cancel}


def describe(changed: Changed, asked: int) -> str:
    parts = []
    if changed.retried:
        parts.append(f"{changed.retried} retried")
    if changed.cancelled:
        parts.append(f"{changed.cancelled} cancelled")
    if changed.cancel_requested:
        parts.append(f"{changed.cancel_requested} running asked to cancel")
    unchanged = asked - changed.retried - changed.cancelled - changed.cancel_requested
    if unchanged > 0:
        parts.append(f"{unchanged} unchanged (not in a state that allows it)")
    return "; ".join(parts) or "Nothing changed."


def back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    target = request.POST.get("next", "")
    safe = url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure())
    return HttpResponseRedirect(target if safe and target else default)


def _report(request: HttpRequest, changed: Changed, asked: int) -> None:
    (messages.success if changed else messages.warning)(request, describe(changed, asked))


@change_task_required
def act_on_task(request: HttpRequest, pk: uuid.UUID, action: str) -> HttpResponse:
    # By id: retry finds the task in ox_task or in the archive.
    changed = ACTIONS[action](pk)
    _report(request, changed, 1)
    return back(request, reverse("dashboard:task", args=[pk]))


@change_task_required
def bulk(request: HttpRequest) -> HttpResponse:
    action = request.POST.get("action", "")
    if action not in ACTIONS:
        return HttpResponseBadRequest("action must be retry or cancel")
    try:
        ids = {uuid.UUID(raw) for raw in request.POST.getlist("ids")}
    except ValueError:
        return HttpResponseBadRequest("ids must be task ids")
    if ids:
        _report(request, ACTIONS[action](sorted(ids)), len(ids))
    else:
        messages.warning(request, "Select some tasks first.")
    return back(request, reverse("dashboard:tasks"))


class ConfirmForm(forms.Form):
    """The confirmation's own field: the count it showed, to say so if it changed meanwhile."""

    expected = forms.IntegerField(min_value=0, max_value=2**63 - 1, required=False)  # a row count


def _filter_query(filterset: TaskFilter) -> str:
    return urlencode(filterset.filter_fields())


@view_task_required
def retry_matching(request: HttpRequest) -> HttpResponse:
    """GET: how many retryable tasks the filter matches, and a form to confirm. POST: retry them,
    re-applying the same filter (so a task that changed state meanwhile is left alone). Every
    input is validated before anything is retried: a bad value gets the form's error."""
    if request.method == "POST" and not can_change_tasks(request):
        raise PermissionDenied("Retry and cancel need the ox.change_task permission.")
    data = request.POST if request.method == "POST" else request.GET
    filterset = TaskFilter(data, queryset=Task.objects.all())
    confirm = ConfirmForm(request.POST if request.method == "POST" else None)
    if not filterset.is_valid() or (confirm.is_bound and not confirm.is_valid()):
        context = {"filter": filterset, "confirm": confirm, "count": 0}
        return render(request, "dashboard/retry_matching.html", context, status=400)
    matching = filterset.qs.filter(status__in=RETRYABLE)
    # Failed and cancelled tasks older than ARCHIVE_AFTER are in the archive: the same filter there.
    archived = filterset.for_archive(ArchivedTask.objects.all()).filter(status__in=RETRYABLE)
    if not filterset.reads_archive:
        archived = archived.none()
    if request.method == "POST":
        return _retry_matching(request, matching, archived, filterset, confirm.cleaned_data["expected"])
    context = {
        "filter": filterset,
        "confirm": confirm,
        "count": matching.count() + archived.count(),
        # Only the filter's own fields: a crafted link's extra parameters (a csrfmiddlewaretoken,
        # an "expected") must not ride into the confirmation form.
        "fields": filterset.filter_fields(),
        "query": _filter_query(filterset),
    }
    return render(request, "dashboard/retry_matching.html", context)


@change_task_required
def _retry_matching(
    request: HttpRequest,
    matching: QuerySet[Task],
    archived: QuerySet[ArchivedTask],
    filterset: TaskFilter,
    expected: int | None,
) -> HttpResponse:
    changed = operations.retry(matching, archived=archived)
    message = describe(changed, changed.retried)
    if expected is not None and expected != changed.retried:
        message += f" (the confirmation showed {expected}; tasks changed state in between)"
    (messages.success if changed else messages.warning)(request, message)
    query = _filter_query(filterset)
    return HttpResponseRedirect(f"{reverse('dashboard:tasks')}?{query}" if query else reverse("dashboard:tasks"))
