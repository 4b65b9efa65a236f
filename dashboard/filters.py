"""The task list's filters. Each one narrows on an index, so a filtered page stays cheap on a
table of millions: status and queue through the status and claim indexes, the enqueue range
through the time-ordered primary key."""

from datetime import timedelta

import django_filters
from django import forms
from django.db.models import Q, QuerySet

from ox.models import FINISHED, Status, Task
from ox.stats import id_floor

# How far an id's embedded timestamp may sit from enqueued_at (both are taken at enqueue, a
# few statements apart); the exact enqueued_at condition is applied as well.
ID_CLOCK_SLACK = timedelta(minutes=1)


class DateTimeLocalInput(forms.DateTimeInput):
    input_type = "datetime-local"

    def __init__(self) -> None:
        super().__init__(format="%Y-%m-%dT%H:%M")


class TaskFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=Status.choices, empty_label="any status")
    queue = django_filters.CharFilter(field_name="queue", lookup_expr="exact")
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

    def filter_task(self, queryset: QuerySet[Task], name: str, value: str) -> QuerySet[Task]:
        # Finished rows by path come from the partial index ox_task_done_path; spelling out
        # "finished, or not" lets the planner use it for a rare path instead of walking the
        # whole history (the clause is always true, so no row is lost).
        everything = Q(status__in=FINISHED) | Q(status__in=(Status.READY, Status.RUNNING))
        return queryset.filter(everything, task_path=value)

    def filter_enqueued_after(self, queryset: QuerySet[Task], name: str, value: object) -> QuerySet[Task]:
        return queryset.filter(id__gte=id_floor(value - ID_CLOCK_SLACK), enqueued_at__gte=value)

    def filter_enqueued_before(self, queryset: QuerySet[Task], name: str, value: object) -> QuerySet[Task]:
        return queryset.filter(id__lt=id_floor(value + ID_CLOCK_SLACK), enqueued_at__lte=value)

    @property
    def active(self) -> bool:
        return self.is_bound and any(v not in (None, "") for v in self.form.cleaned_data.values())
