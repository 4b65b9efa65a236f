"""The task list's filters. Each one narrows on an index, so a filtered page stays cheap on a
table of millions: status through the status, claim and lease indexes, queue and task path
through per-status partial indexes (ox.stats.ANY_STATUS), the enqueue range through the
time-ordered primary key."""

from datetime import UTC, datetime, timedelta

import django_filters
from django import forms
from django.db.models import QuerySet

from ox.models import Status, Task
from ox.stats import ANY_STATUS, ID_CLOCK_SLACK, id_floor


def shifted(moment: datetime, delta: timedelta) -> datetime:
    """`moment + delta`, held at the calendar's ends: 0001-01-01 or 9999-12-31 is a fine bound
    for a filter ("everything before"), and must not overflow into a 500."""
    try:
        return moment + delta
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC) if delta > timedelta(0) else datetime.min.replace(tzinfo=UTC)


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
        # index probes, not a table scan.
        return queryset.filter(ANY_STATUS, queue=value)

    def filter_task(self, queryset: QuerySet[Task], name: str, value: str) -> QuerySet[Task]:
        # Finished rows by path from ox_task_done_path; READY and RUNNING rows from their own
        # partial indexes (few rows each).
        return queryset.filter(ANY_STATUS, task_path=value)

    def filter_enqueued_after(self, queryset: QuerySet[Task], name: str, value: datetime) -> QuerySet[Task]:
        return queryset.filter(id__gte=id_floor(shifted(value, -ID_CLOCK_SLACK)), enqueued_at__gte=value)

    def filter_enqueued_before(self, queryset: QuerySet[Task], name: str, value: datetime) -> QuerySet[Task]:
        return queryset.filter(id__lt=id_floor(shifted(value, ID_CLOCK_SLACK)), enqueued_at__lte=value)

    def filter_fields(self) -> list[tuple[str, str]]:
        """(name, raw value) of this filter's own fields that were given, nothing else from the
        request: what a confirmation form may carry over and a link may repeat."""
        return [(name, self.data[name]) for name in self.form.fields if self.is_bound and self.data.get(name)]

    @property
    def active(self) -> bool:
        return self.is_bound and any(v not in (None, "") for v in self.form.cleaned_data.values())
