"""The task list's filters. Each one narrows on an index, so a filtered page stays cheap on a
table of millions: status through the status, claim and lease indexes, queue and task path
through per-status partial indexes (ox.stats.ANY_STATUS), the enqueue range through the
time-ordered primary key.

Finished tasks are in ox_task for ARCHIVE_AFTER, then in ox_task_archive (ox.archive): the
same filter applies to both (`for_archive`), whose plain indexes (queue, id), (task_path, id),
(status, id) and the primary key serve it there."""

from datetime import UTC, datetime, timedelta
from typing import Any

import django_filters
from django import forms
from django.db.models import Q, QuerySet

from ox.models import FINISHED, Status, Task
from ox.stats import ANY_STATUS, ID_CLOCK_SLACK, id_floor


def shifted(moment: datetime, delta: timedelta) -> datetime:
    """`moment + delta`, held at the calendar's ends: 0001-01-01 or 9999-12-31 is a fine bound
    for a filter ("everything before"), and must not overflow into a 500."""
    try:
        return moment + delta
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC) if delta > timedelta(0) else datetime.min.replace(tzinfo=UTC)


def _any_status(queryset: QuerySet[Any]) -> Q:
    """ox.stats.ANY_STATUS on ox_task, whose indexes are partial per status; nothing elsewhere."""
    return ANY_STATUS if queryset.model is Task else Q()


class DateTimeLocalInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self) -> None:
        super().__init__(format="%Y-%m-%dT%H:%M")


class TaskFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=Status.choices, empty_label="any status")
    queue = django_filters.CharFilter(method="filter_queue", label="Queue")
    task = django_filters.CharFilter(method="filter_task", label="Task path")
    enqueued_after = django_filters.DateTimeFilter(
        method="filter_enqueued_after", label="Enqueued after", widget=DateTimeLocalInput()
    )
    enqueued_before = django_filters.DateTimeFilter(
        method="filter_enqueued_before", label="Enqueued before", widget=DateTimeLocalInput()
    )
    id = django_filters.UUIDFilter(field_name="id", label="Task id")

    class Meta:
        model = Task
        fields = ["status", "queue", "task", "enqueued_after", "enqueued_before", "id"]

    def filter_queue(self, queryset: QuerySet[Task], name: str, value: str) -> QuerySet[Task]:
        # Finished rows by queue from ox_task_done_queue, READY ones from the claim index,
        # RUNNING ones from the lease index: a queue that matches nothing costs three small
        # index probes, not a table scan. The archive's (queue, id) index is not partial.
        return queryset.filter(_any_status(queryset), queue=value)

    def filter_task(self, queryset: QuerySet[Task], name: str, value: str) -> QuerySet[Task]:
        # Finished rows by path from ox_task_done_path; READY and RUNNING rows from their own
        # partial indexes (few rows each).
        return queryset.filter(_any_status(queryset), task_path=value)

    # An id range widened by the slack, and the exact enqueued_at condition only where the id
    # alone cannot tell (within the slack of the bound): the same rows as applying it to all,
    # and the planner, which takes id and enqueued_at for independent, then estimates the
    # matches as the id range's. With `AND enqueued_at >= value` on every row it counted both
    # ranges' selectivities twice, and on a big archive took a bitmap scan of the whole range
    # and a sort over an index scan that stops at the page (measured: tests/test_archive_plans.py).
    def filter_enqueued_after(self, queryset: QuerySet[Task], name: str, value: datetime) -> QuerySet[Task]:
        sure = Q(id__gte=id_floor(shifted(value, ID_CLOCK_SLACK)))
        return queryset.filter(sure | Q(enqueued_at__gte=value), id__gte=id_floor(shifted(value, -ID_CLOCK_SLACK)))

    def filter_enqueued_before(self, queryset: QuerySet[Task], name: str, value: datetime) -> QuerySet[Task]:
        sure = Q(id__lt=id_floor(shifted(value, -ID_CLOCK_SLACK)))
        return queryset.filter(sure | Q(enqueued_at__lte=value), id__lt=id_floor(shifted(value, ID_CLOCK_SLACK)))

    def filter_fields(self) -> list[tuple[str, str]]:
        """(name, raw value) of this filter's own fields that were given, nothing else from the
        request: what a confirmation form may carry over and a link may repeat."""
        return [(name, self.data[name]) for name in self.form.fields if self.is_bound and self.data.get(name)]

    @property
    def reads_archive(self) -> bool:
        """Whether the archive can hold matches: it has finished tasks only, so a READY or
        RUNNING filter reads ox_task alone."""
        if not self.is_bound:
            return True
        return self.form.cleaned_data.get("status") in (None, "", *FINISHED)

    def for_archive(self, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """This (valid) filter applied to a queryset of ox.models.ArchivedTask."""
        return self.filter_queryset(queryset) if self.is_bound else queryset

    @property
    def active(self) -> bool:
        return self.is_bound and any(v not in (None, "") for v in self.form.cleaned_data.values())
