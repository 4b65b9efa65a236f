"""Enqueue: one INSERT on the database the router gives ox.Task (bulk: one statement per batch)."""

import inspect
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, router, transaction
from django.tasks import Task as DjangoTask
from django.tasks import TaskResult
from django.tasks.signals import task_enqueued

from ox import clock, sql, tracing
from ox.db import driver
from ox.db.dialect import after_deadlock, runs_again
from ox.flow.unique import DuplicateTask, ExistingTaskResult, as_existing, limit_key
from ox.ids import uuid7
from ox.jsoncheck import jsonable
from ox.models import Task as TaskRow
from ox.results import ready_result

if TYPE_CHECKING:
    from ox.backend import OxBackend


def database_for(backend: "OxBackend") -> str:
    return backend.config.database or router.db_for_write(TaskRow)


def resolve_run_after(run_after: datetime | timedelta | None, now: datetime) -> datetime:
    if run_after is None:
        return now
    if isinstance(run_after, timedelta):
        return now + run_after
    return run_after


def is_async_task(task: DjangoTask) -> bool:
    return inspect.iscoroutinefunction(task.func)


def new_task(
    backend: "OxBackend", task: DjangoTask, args: Sequence[Any], kwargs: dict[str, Any], now: datetime
) -> sql.NewTask:
    """The row one call will insert; refuses arguments that would not survive JSON."""
    row = sql.NewTask(
        id=uuid7(),
        task_path=task.module_path,
        queue=task.queue_name,
        priority=task.priority,
        args=jsonable(list(args), "args"),
        kwargs=jsonable(dict(kwargs), "kwargs"),
        run_after=resolve_run_after(task.run_after, now),
        enqueued_at=now,
        max_attempts=getattr(task, "max_attempts", None) or backend.config.max_attempts,
        is_async=is_async_task(task),
        scheduled_for=None if task.run_after is None else resolve_run_after(task.run_after, now),
        metadata=tracing.with_trace_context(getattr(task, "metadata", None)),
    )
    return with_flow(task, row, now)


def with_flow(task: DjangoTask, row: sql.NewTask, now: datetime) -> sql.NewTask:
    """The row's flow-control columns (ox.flow): its unique key and its limit key."""
    plan = getattr(task, "unique_plan", None)
    if plan is not None:
        row.unique_key, row.unique_until = plan.key(row.args, row.kwargs, now)
        row.unique_states = plan.hold_bits
    explicit = getattr(task, "limit_key", None)
    by = getattr(task, "limit_by", None)
    if explicit is not None:
        row.limit_key = explicit
    elif by is not None:
        row.limit_key = limit_key(task, by, row.args, row.kwargs)
    return row


# A unique insert meets a holder that finishes before it can be read this many times in a
# row at most before the enqueue gives up (each try is one INSERT and one SELECT).
UNIQUE_TRIES = 10


def insert_or_find(conn: Any, row: sql.NewTask, prepare: bool = False) -> "uuid.UUID | None":
    """Insert the row; for a unique one whose key is held, the holder's id instead (None:
    inserted). `prepare`: see prepares()."""
    if row.unique_key is None:
        sql.insert_tasks(conn, [row], prepare)
        return None
    for _try in range(UNIQUE_TRIES):
        if sql.insert_unique(conn, row, prepare):
            return None
        holder = sql.holder_of(conn, row.unique_key)
        if holder is not None:
            return holder
        # The holder finished (or was pruned) between the INSERT and the SELECT: go again.
    raise DatabaseError(f"could not enqueue {row.task_path}: its unique key kept changing hands")


def prepares(backend: "OxBackend") -> bool:
    """Whether one call's INSERT may be a prepared statement on the producer's connection:
    unless a transaction pooler is in the way (POOLER), which would hand the statement's
    server session to another client (ox.db.postgresql.prepared.write; PostgreSQL only)."""
    return not backend.config.pooled


def duplicate_result(backend: "OxBackend", task: DjangoTask, holder: "uuid.UUID") -> ExistingTaskResult:
    """The answer to a duplicate enqueue: the holder's result, or DuplicateTask."""
    existing = as_existing(backend.get_result(str(holder)))
    if task.unique.on_duplicate == "raise":  # type: ignore[attr-defined]  (only OxTask is unique)
        raise DuplicateTask(existing)
    return existing


def enqueue_one(backend: "OxBackend", task: DjangoTask, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
    backend.validate_task(task)
    conn = connections[database_for(backend)]
    row = new_task(backend, task, args, kwargs, clock.db_now(conn))
    holder = insert_or_find(conn, row, prepares(backend))
    if holder is not None:
        return duplicate_result(backend, task, holder)
    result = ready_result(row, task, backend.alias)
    task_enqueued.send(type(backend), task_result=result)
    return result


async def aenqueue_one(
    backend: "OxBackend", task: DjangoTask, args: Sequence[Any], kwargs: dict[str, Any]
) -> TaskResult:
    backend.validate_task(task)

    def insert() -> sql.NewTask | ExistingTaskResult:
        conn = connections[database_for(backend)]
        row = new_task(backend, task, args, kwargs, clock.db_now(conn))
        holder = insert_or_find(conn, row, prepares(backend))
        return row if holder is None else duplicate_result(backend, task, holder)

    # Django's database layer is synchronous; run the INSERT where the ORM's async API would.
    row = await sync_to_async(insert)()
    if isinstance(row, ExistingTaskResult):
        return row
    result = ready_result(row, task, backend.alias)
    await task_enqueued.asend(type(backend), task_result=result)
    return result


def enqueue_many(
    task: DjangoTask, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]], batch_size: int = 5000
) -> list[TaskResult]:
    """Enqueue many calls of one task: every call is validated before any row is written,
    then rows go in with one INSERT per batch. A unique task's calls go in one by one, in
    one transaction: a call whose key an earlier call of the batch or a task in the table
    holds gets that task's result (or DuplicateTask, with nothing of the batch written)."""
    backend = task.get_backend()
    backend.validate_task(task)
    conn = connections[database_for(backend)]
    now = clock.db_now(conn)
    # new_task() inlined: at 10,000 calls its per-call overhead is a third of the cost.
    path, queue, priority = task.module_path, task.queue_name, task.priority
    run_after = resolve_run_after(task.run_after, now)
    scheduled_for = None if task.run_after is None else run_after
    max_attempts = getattr(task, "max_attempts", None) or backend.config.max_attempts
    kind = is_async_task(task)
    metadata = tracing.with_trace_context(getattr(task, "metadata", None))
    rows = [
        sql.NewTask(
            uuid7(),
            path,
            queue,
            priority,
            jsonable(list(args), "args") if args else [],
            jsonable(dict(kwargs), "kwargs") if kwargs else {},
            run_after,
            now,
            max_attempts,
            kind,
            scheduled_for,
            metadata=metadata,
        )
        for args, kwargs in calls
    ]
    if getattr(task, "unique", None) is not None or getattr(task, "limit_key", None) or getattr(task, "limit_by", None):
        for row in rows:
            with_flow(task, row, now)
    if getattr(task, "unique", None) is not None:
        return _enqueue_unique(backend, task, conn, rows)
    for start in range(0, len(rows), batch_size):
        sql.insert_tasks(conn, rows[start : start + batch_size])
    results = [ready_result(row, task, backend.alias) for row in rows]
    for result in results:
        task_enqueued.send(type(backend), task_result=result)
    return results


def _enqueue_unique(backend: "OxBackend", task: DjangoTask, conn: Any, rows: list[sql.NewTask]) -> list[TaskResult]:
    """The batch in one transaction. InnoDB: producers waiting on a unique key its holder just
    let go of deadlock with each other, and all but one are rolled back (elsewhere an insert
    waits for the holder and decides). Where ox's transaction is the outermost, a victim's is
    run again and then finds the key held (or free); inside the caller's atomic() the
    caller's work was rolled back too, and the error is raised (so too in a transaction the caller
    opened by turning autocommit off: ox.db.dialect.runs_again)."""
    outermost = runs_again(conn)
    for attempt in range(UNIQUE_TRIES):
        try:
            return _enqueue_unique_once(backend, task, conn, rows)
        except DatabaseError as exc:
            if not outermost or attempt == UNIQUE_TRIES - 1 or not driver(conn).deadlocked(exc):
                raise
            after_deadlock(attempt)
    raise AssertionError("unreachable")


def _enqueue_unique_once(
    backend: "OxBackend", task: DjangoTask, conn: Any, rows: list[sql.NewTask]
) -> list[TaskResult]:
    out: list[TaskResult | uuid.UUID] = []
    fresh: list[TaskResult] = []
    first: dict[str, uuid.UUID] = {}  # key -> the task that holds it for this batch
    with transaction.atomic(using=conn.alias):
        for row in rows:
            assert row.unique_key is not None
            holder = first.get(row.unique_key) or insert_or_find(conn, row, prepares(backend))
            if holder is None:
                first[row.unique_key] = row.id
                result = ready_result(row, task, backend.alias)
                fresh.append(result)
                out.append(result)
            else:
                first[row.unique_key] = holder
                out.append(holder)
        # Duplicates read after every insert, so one within the batch sees its first.
        results = [r if isinstance(r, TaskResult) else duplicate_result(backend, task, r) for r in out]
    for result in fresh:
        task_enqueued.send(type(backend), task_result=result)
    return results
