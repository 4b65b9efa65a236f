"""Admin for the queue: tasks read-only except through the Retry and Cancel actions (the same
ox.operations the dashboard calls), attempts inline with readable tracebacks, workers read-only."""

import uuid
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from ox import operations
from ox.models import Attempt, Task, Worker
from ox.operations import Changed


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


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    can_delete = False
    fields = ("number", "outcome", "worker_id", "started_at", "finished_at", "exception_class_path", "traceback_pre")
    readonly_fields = fields
    ordering = ("number",)

    @admin.display(description="traceback")
    def traceback_pre(self, obj: Attempt) -> str:
        return format_html('<pre style="white-space: pre-wrap; max-width: 70em">{}</pre>', obj.traceback)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = ("id", "task_path", "queue", "status", "attempts", "max_attempts", "enqueued_at", "finished_at")
    list_filter = ("status", "queue", "cancel_requested")
    search_fields = ("task_path",)
    date_hierarchy = "enqueued_at"
    ordering = ("-id",)
    inlines = [AttemptInline]
    actions = ["retry_tasks", "cancel_tasks"]
    # An exact total over millions of finished tasks costs more than the page.
    show_full_result_count = False
    list_per_page = 50

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # Status changes go through the actions only: ox.operations keep the row consistent.
        return [f.name for f in self.model._meta.fields]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Task], search_term: str
    ) -> tuple[QuerySet[Task], bool]:
        try:
            return queryset.filter(pk=uuid.UUID(search_term.strip())), False
        except ValueError:
            return super().get_search_results(request, queryset, search_term)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Retry selected tasks (failed or cancelled)", permissions=["change"])
    def retry_tasks(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        selected = queryset.count()
        _report(self, request, operations.retry(queryset), selected)

    @admin.action(description="Cancel selected tasks (ready or running)", permissions=["change"])
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        selected = queryset.count()
        _report(self, request, operations.cancel(queryset), selected)


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
