"""Operator actions: cancel and retry. The admin and the dashboard call these, nothing else
changes a task's status outside the worker."""

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connections, router, transaction
from django.db.models import Case, F, QuerySet, Value, When
from django.tasks import task_backends

from ox import clock
from ox.models import Status, Task

RETRYABLE = (Status.FAILED, Status.CANCELLED)


@dataclass(frozen=True)
class Changed:
    cancelled: int = 0  # READY tasks now CANCELLED
    cancel_requested: int = 0  # RUNNING tasks their worker will interrupt
    retried: int = 0  # FAILED/CANCELLED tasks back to READY

    def __bool__(self) -> bool:
        return bool(self.cancelled or self.cancel_requested or self.retried)


def _as_queryset(task_ids: Any) -> QuerySet[Task]:
    if isinstance(task_ids, QuerySet):
        return task_ids
    if isinstance(task_ids, (str, uuid.UUID)):
        task_ids = [task_ids]
    return Task.objects.filter(pk__in=[uuid.UUID(str(t)) for t in task_ids])


def cancel(task_ids: Any) -> Changed:
    """READY tasks become CANCELLED at once; RUNNING ones get cancel_requested: their
    worker interrupts them at its next heartbeat, and whatever the attempt does next
    (fails, times out, is lost or handed back) the task ends CANCELLED, never retried. An
    attempt that succeeds before the interrupt lands stays SUCCESSFUL. Finished tasks are
    left alone."""
    qs = _as_queryset(task_ids)
    db = qs.db or router.db_for_write(Task)
    now = clock.db_now(connections[db])
    with transaction.atomic(using=db):
        # One statement for both, so a task a worker moves between READY and RUNNING at the
        # same moment is changed by whichever rule its latest state calls for.
        changed = (
            qs.filter(status__in=[Status.READY, Status.RUNNING])
            .exclude(status=Status.RUNNING, cancel_requested=True)
            .update(
                status=Case(When(status=Status.READY, then=Value(Status.CANCELLED)), default=F("status")),
                finished_at=Case(When(status=Status.READY, then=Value(now)), default=F("finished_at")),
                lease_expires_at=Case(When(status=Status.READY, then=Value(None)), default=F("lease_expires_at")),
                cancel_requested=Case(When(status=Status.RUNNING, then=Value(True)), default=F("cancel_requested")),
            )
        )
        # Counted by the timestamp just written, not through the caller's filter (which may
        # say status=READY and no longer match what it cancelled).
        cancelled = Task.objects.using(db).filter(status=Status.CANCELLED, finished_at=now).count() if changed else 0
    return Changed(cancelled=cancelled, cancel_requested=changed - cancelled)


def _budget(task_path: str) -> int:
    """A fresh attempt budget: the task's max_attempts (or the backend default) today."""
    from ox.results import resolve_task

    try:
        task = resolve_task(task_path)
    except Exception:  # noqa: BLE001  (a task that no longer imports still gets one more try)
        return 1
    backend = task_backends[task.backend]
    return getattr(task, "max_attempts", None) or backend.config.max_attempts


def retry(task_ids: Any) -> Changed:
    """FAILED or CANCELLED tasks go back to READY now, with a fresh attempt budget. Their
    attempts keep counting (and their Attempt rows stay), so history reads in order."""
    qs = _as_queryset(task_ids).filter(status__in=RETRYABLE)
    retried = 0
    db = qs.db or router.db_for_write(Task)
    now = clock.db_now(connections[db])
    with transaction.atomic(using=db):
        for path in qs.values_list("task_path", flat=True).distinct().order_by():
            retried += qs.filter(task_path=path).update(
                status=Status.READY,
                run_after=now,
                finished_at=None,
                cancel_requested=False,
                lease_expires_at=None,
                max_attempts=F("attempts") + _budget(path),
                return_value=None,
            )
    return Changed(retried=retried)
