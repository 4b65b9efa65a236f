"""Admin for the queue: tasks read-only except through the Retry and Cancel actions (the same
ox.operations the dashboard calls), attempts inline with readable tracebacks, workers read-only,
queues read-only except through the Pause and Resume actions (ox.flow.queues, as the dashboard
and `manage.py ox_queue` do).

The task list stays cheap on a table of millions: a capped count, newest first only, filters
and search that each read an index (no date_hierarchy, which reads the whole table for its date
range, and no list filter that asks the table for its DISTINCT values)."""

import uuid
from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from ox import operations
from ox.archive import attempts_of
from ox.flow import queues
from ox.models import ArchivedTask, Attempt, QueueState, Task, Worker
from ox.operations import Changed
from ox.paging import CappedPaginator
from ox.stats import ANY_STATUS, ID_CLOCK_SLACK, configured_queues, id_floor


def _report(modeladmin: admin.ModelAdmin, request: HttpRequest, changed: Changed, selected: int) -> None:
    parts = [
        f"{n} {what}"
        for n, what in (
            (changed.retried, "retried"),
            (changed.cancelled, "cancelled"),
            (changed.cancel_requested, "running asked to cancel"),
        )
        if n
    ]
    unchanged = selected - changed.retried - changed.cancelled - changed.cancel_requested
    if unchanged:
        parts.append(f"{unchanged} unchanged (not in a state that allows it)")
    level = messages.SUCCESS if changed else messages.WARNING
    modeladmin.message_user(request, f"{selected} selected: {'; '.join(parts)}.", level)


def _any_status(queryset: QuerySet[Any]) -> Q:
    """ANY_STATUS on ox_task (partial indexes per status); the archive's indexes are plain."""
    return ANY_STATUS if queryset.model is Task else Q()


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = ("number", "outcome", "worker_id", "started_at", "finished_at", "exception_class_path", "traceback_pre")
    readonly_fields = fields
    ordering = ("number",)

    @admin.display(description="traceback")
    def traceback_pre(self, obj: Attempt) -> str:
        # A class, not a style attribute: the Content-Security-Policy allows no inline styles.
        return format_html('<pre class="ox-traceback">{}</pre>', obj.traceback)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class QueueFilter(admin.SimpleListFilter):
    """The queues the settings declare, not SELECT DISTINCT queue over the whole table."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(q, q) for q in configured_queues()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Task]) -> QuerySet[Task]:
        value = self.value()
        # Per-status partial indexes (ox.stats.ANY_STATUS): a queue with no rows is cheap too.
        return queryset.filter(_any_status(queryset), queue=value) if value else queryset


class EnqueuedFilter(admin.SimpleListFilter):
    """Recent enqueues through the time-ordered primary key (ids are UUIDv7)."""

    title = "enqueued"
    parameter_name = "enqueued"
    SPANS = {
        "1h": ("Last hour", timedelta(hours=1)),
        "24h": ("Last 24 h", timedelta(days=1)),
        "7d": ("Last 7 days", timedelta(days=7)),
    }

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(key, label) for key, (label, _) in self.SPANS.items()]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Task]) -> QuerySet[Task]:
        span = self.SPANS.get(self.value() or "")
        if span is None:
            return queryset
        since = timezone.now() - span[1]
        return queryset.filter(id__gte=id_floor(since - ID_CLOCK_SLACK), enqueued_at__gte=since)


class TaskChangeList(ChangeList):
    def get_ordering(self, request: HttpRequest, queryset: QuerySet[Task]) -> list[str]:
        # Newest first, always: a sort on another column (?o=2 by queue) is a sort of the whole
        # table, and the column headers are not clickable anyway (sortable_by is empty).
        return ["-id"]


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("id", "task_path", "queue", "status", "attempts", "max_attempts", "enqueued_at", "finished_at")
    list_filter = ("status", QueueFilter, EnqueuedFilter)
    search_fields = ("task_path",)  # what shows the search box; get_search_results decides
    search_help_text = "A task id, or a task's exact path (e.g. demo.tasks.add)."
    sortable_by = ()
    ordering = ("-id",)
    inlines = [AttemptInline]
    actions = ["retry_tasks", "cancel_tasks"]
    # Counts stop at 10,000 (the page says "more than"): an exact total over millions of
    # finished tasks costs more than the page.
    paginator = CappedPaginator
    show_full_result_count = False
    list_per_page = 50

    class Media:
        css = {"all": ["ox/admin.css"]}

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return TaskChangeList

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Status changes go through the actions only: ox.operations keep the row consistent.
        return [f.name for f in self.model._meta.fields]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Task], search_term: str
    ) -> tuple[QuerySet[Task], bool]:
        """A task id (the primary key) or an exact task path (per-status partial indexes). A
        substring search (task_path ILIKE '%...%') would read every row of the table."""
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            return queryset.filter(_any_status(queryset), task_path=term), False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def response_action(self, request: HttpRequest, queryset: QuerySet[Task], **kwargs: Any) -> HttpResponse | None:
        # The admin filters pk__in by the posted selection, and a value that is no UUID makes
        # the UUID field raise there: a 500. Refuse such a selection with a message instead.
        try:
            [uuid.UUID(value) for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)]
        except ValueError:
            self.message_user(request, "The selection holds values that are not task ids.", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset, **kwargs)

    @admin.action(description="Retry selected tasks (failed or cancelled)", permissions=["change"])
    def retry_tasks(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        selected = queryset.count()
        _report(self, request, operations.retry(queryset), selected)

    @admin.action(description="Cancel selected tasks (ready or running)", permissions=["change"])
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        selected = queryset.count()
        _report(self, request, operations.cancel(queryset), selected)


@admin.register(ArchivedTask)
class ArchivedTaskAdmin(TaskAdmin):
    """Finished tasks moved to ox_task_archive (ox.archive): read-only, with Retry (which moves
    a failed or cancelled one back into ox_task as READY). Seen and retried under the Task
    permissions (ox.view_task, ox.change_task), as the dashboard does."""

    inlines = []
    actions = ["retry_tasks"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*super().get_readonly_fields(request, obj), "attempt_rows"]

    @admin.display(description="failed attempts")
    def attempt_rows(self, obj: ArchivedTask) -> str:
        # No inline: Attempt's foreign key names ox_task, and the task's row is not there.
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
            '<td><pre class="ox-traceback">{}</pre></td></tr>',
            (
                (a.number, a.outcome, a.worker_id, a.finished_at, a.exception_class_path, a.traceback)
                for a in attempts_of(obj)
            ),
        )
        return format_html("<table>{}</table>", rows) if rows else "-"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("ox.view_task") or self.has_retry_permission(request)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("ox.change_task")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Retry selected tasks (failed or cancelled)", permissions=["retry"])
    def retry_tasks(self, request: HttpRequest, queryset: QuerySet[ArchivedTask]) -> None:
        selected = queryset.count()
        _report(self, request, operations.retry(queryset), selected)


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("id", "host", "pid", "concurrency", "started_at", "heartbeat_at", "stopped_at")
    list_filter = ("host",)
    search_fields = ("id", "host")
    ordering = ("-heartbeat_at",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(QueueState)
class QueueStateAdmin(admin.ModelAdmin):
    """ox_queue: seen and paused under the Task permissions (ox.view_task, ox.change_task), as
    the dashboard's Queues page does, so who may pause a queue is one rule in both places.
    Rows are never edited here: a save would bypass set_limits()' checks and the NOTIFY that
    wakes idle workers, and a deleted row is a lost pause. Limits are overridden from the
    dashboard or `manage.py ox_queue limits`."""

    list_display = ("name", "paused", "overrides", "updated_at", "updated_by")
    list_filter = ("paused",)
    ordering = ("name",)
    actions = ["pause_queues", "resume_queues"]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("ox.view_task") or self.has_pause_permission(request)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("ox.change_task")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _each(self, request: HttpRequest, queryset: QuerySet[QueueState], pause: bool) -> None:
        # One call per queue through ox.flow.queues (row lock, updated_by, NOTIFY on commit),
        # never queryset.update(), which would skip all three.
        names = list(queryset.order_by("name").values_list("name", flat=True))
        act = queues.pause if pause else queues.resume
        for name in names:
            act(name, by=request.user.get_username())
        done = "paused" if pause else "resumed"
        self.message_user(request, f"{len(names)} {done}: {', '.join(names)}.", messages.SUCCESS)

    @admin.action(description="Pause selected queues", permissions=["pause"])
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[QueueState]) -> None:
        self._each(request, queryset, pause=True)

    @admin.action(description="Resume selected queues", permissions=["pause"])
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[QueueState]) -> None:
        self._each(request, queryset, pause=False)
