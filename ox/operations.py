"""Operator actions: cancel and retry. The admin and the dashboard call these, nothing else
changes a task's status outside the worker."""

import uuid
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import Case, F, QuerySet, Value, When
from django.tasks import task_backends

from ox import clock
from ox.archive import ID_CHUNK, RETRYABLE, move_back
from ox.models import ArchivedTask, Status, Task


@dataclass(frozen=True)
class Changed:
    cancelled: int = 0  # READY tasks now CANCELLED
    cancel_requested: int = 0  # RUNNING tasks their worker will interrupt
    retried: int = 0  # FAILED/CANCELLED tasks back to READY
    # Unique tasks left as they are: another task holds their key now (ox.flow.unique).
    duplicates: int = 0

    def __bool__(self) -> bool:
        return bool(self.cancelled or self.cancel_requested or self.retried)


def _ids(task_ids: Any) -> list[uuid.UUID]:
    if isinstance(task_ids, (str, uuid.UUID)):
        task_ids = [task_ids]
    return [uuid.UUID(str(t)) for t in task_ids]


def _as_queryset(task_ids: Any) -> QuerySet[Task]:
    if isinstance(task_ids, QuerySet):
        return task_ids
    return Task.objects.filter(pk__in=_ids(task_ids))


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
        waits = [Status.READY, Status.PENDING]  # PENDING: a workflow's task not yet READY
        changed = (
            qs.filter(status__in=[*waits, Status.RUNNING])
            .exclude(status=Status.RUNNING, cancel_requested=True)
            .update(
                finished_at=Case(When(status__in=waits, then=Value(now)), default=F("finished_at")),
                lease_expires_at=Case(When(status__in=waits, then=Value(None)), default=F("lease_expires_at")),
                cancel_requested=Case(When(status=Status.RUNNING, then=Value(True)), default=F("cancel_requested")),
                # Last: MySQL assigns left to right, each SET seeing the ones before it.
                status=Case(When(status__in=waits, then=Value(Status.CANCELLED)), default=F("status")),
            )
        )
        # Counted by the timestamp just written, not through the caller's filter (which may
        # say status=READY and no longer match what it cancelled).
        ended = Task.objects.using(db).filter(status=Status.CANCELLED, finished_at=now)
        cancelled = ended.count() if changed else 0
        if cancelled:
            flows = ended.filter(workflow_id__isnull=False).values_list("id", flat=True)
            _join_cancelled(connections[db], list(flows), now)
    return Changed(cancelled=cancelled, cancel_requested=changed - cancelled)


def _join_cancelled(conn: Any, ids: list[Any], now: Any) -> None:
    """What the workflow policy says follows a cancelled task, in the cancel's transaction."""
    from ox.workflow import join

    with conn.cursor() as cursor:
        for task_id in ids:
            join.ended_badly(conn, cursor, task_id, Status.CANCELLED.value, now)


def _budget(task_path: str) -> int:
    """A fresh attempt budget: the task's max_attempts (or the backend default) today."""
    from ox.results import resolve_task

    try:
        task = resolve_task(task_path)
    except Exception:  # noqa: BLE001  (a task that no longer imports still gets one more try)
        return 1
    backend = task_backends[task.backend]
    return getattr(task, "max_attempts", None) or backend.config.max_attempts


def _reopen(qs: QuerySet[Task], now: Any) -> tuple[int, int]:
    """FAILED/CANCELLED rows of ox_task in `qs` back to READY, a fresh budget per task path.
    Returns (reopened, duplicates): a unique task whose key another task holds now (its key
    was free while it was finished) stays as it is, one by one in a savepoint, so the rest
    of the batch is retried."""
    reopened = duplicates = 0
    changes = {
        "status": Status.READY,
        "run_after": now,
        "finished_at": None,
        "cancel_requested": False,
        "lease_expires_at": None,
        "return_value": None,
    }
    for path in qs.values_list("task_path", flat=True).distinct().order_by():
        budget = F("attempts") + _budget(path)
        of_path = qs.filter(task_path=path)
        reopened += of_path.filter(unique_key__isnull=True).update(**changes, max_attempts=budget)
        for pk in of_path.filter(unique_key__isnull=False).values_list("pk", flat=True).order_by("pk"):
            try:
                with transaction.atomic(using=qs.db):
                    # The status again: the row may have been retried and claimed meanwhile.
                    one = Task.objects.using(qs.db).filter(pk=pk, status__in=RETRYABLE)
                    reopened += one.update(**changes, max_attempts=budget)
            except IntegrityError:
                duplicates += 1
    return reopened, duplicates


def _retry_sets(task_ids: Any, archived: QuerySet[ArchivedTask] | None) -> tuple[QuerySet[Task] | None, Any]:
    """(ox_task rows, archive rows) that `retry` is asked for. Ids name either table; a
    queryset names its own table, and for a Task queryset `archived` says which archived ones
    go too (the dashboard's "retry all matching" applies its filter to both)."""
    if isinstance(task_ids, QuerySet) and task_ids.model is ArchivedTask:
        return None, task_ids
    if isinstance(task_ids, QuerySet):
        return task_ids, archived
    ids = _ids(task_ids)
    return Task.objects.filter(pk__in=ids), ArchivedTask.objects.filter(pk__in=ids)


def retry(task_ids: Any, archived: QuerySet[ArchivedTask] | None = None) -> Changed:
    """FAILED or CANCELLED tasks go back to READY now, with a fresh attempt budget. Their
    attempts keep counting (and their Attempt rows stay), so history reads in order. Tasks in
    the archive (ox.archive) are moved back into ox_task first, in the same transaction.

    Each task is retried once even while the archiver moves it: ox_task is updated first, and
    a row the archiver holds makes that UPDATE wait, then find the row gone; the archive is
    read in a later statement, whose snapshot (READ COMMITTED) has the archiver's commit, so
    the row is moved back from there. A row this UPDATE reached first is locked until commit:
    the archiver skips it."""
    hot, archive = _retry_sets(task_ids, archived)
    db = (hot if hot is not None else archive).db or router.db_for_write(Task)
    now = clock.db_now(connections[db])
    retried = duplicates = 0
    flows: list[uuid.UUID] = []
    with transaction.atomic(using=db):
        if hot is not None:
            flows += hot.filter(status__in=RETRYABLE, workflow_id__isnull=False).values_list("pk", flat=True)
            retried, duplicates = _reopen(hot.filter(status__in=RETRYABLE), now)
        if archive is not None:
            ids = list(archive.filter(status__in=RETRYABLE).values_list("pk", flat=True).order_by())
            moved = move_back(connections[db], ids) if ids else []
            for start in range(0, len(moved), ID_CHUNK):
                chunk = moved[start : start + ID_CHUNK]
                of_chunk = Task.objects.using(db).filter(pk__in=chunk, status__in=RETRYABLE)
                flows += of_chunk.filter(workflow_id__isnull=False).values_list("pk", flat=True)
                done, dup = _reopen(of_chunk, now)
                retried, duplicates = retried + done, duplicates + dup
        if flows:
            _wait_again(db, flows)
    return Changed(retried=retried, duplicates=duplicates)


def _wait_again(db: str, ids: list[uuid.UUID]) -> None:
    """Workflow tasks just made READY that still wait for tasks before them (cancelled while
    PENDING, their predecessors not ended): PENDING again, waiting for those, rather than
    READY at once and run before their predecessors with None for their results. The rows
    are locked by the retry's UPDATE: a join that ends a predecessor now waits, then counts
    them down as usual."""
    from django.db.models import Count

    from ox.workflow.models import Edge

    for start in range(0, len(ids), ID_CHUNK):
        chunk = ids[start : start + ID_CHUNK]
        open_edges = (
            Edge.objects.using(db)
            .filter(child_id__in=chunk, done=False)
            .values("child_id")
            .annotate(n=Count("id"))
            .values_list("child_id", "n")
            .order_by()
        )
        for child, n in open_edges:
            Task.objects.using(db).filter(pk=child, status=Status.READY).update(status=Status.PENDING, waiting=n)
