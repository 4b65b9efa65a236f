"""Enqueue: one INSERT on the database the router gives ox.Task (bulk: one statement per batch)."""

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import router
from django.tasks import Task as DjangoTask
from django.tasks import TaskResult
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.json import normalize_json

from ox.jsoncheck import ensure_json
from ox.models import Task as TaskRow
from ox.results import build_result

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


def build_row(
    backend: "OxBackend", task: DjangoTask, args: Sequence[Any], kwargs: dict[str, Any], now: datetime
) -> TaskRow:
    ensure_json(list(args), "args")
    ensure_json(kwargs, "kwargs")
    max_attempts = getattr(task, "max_attempts", None) or backend.config.max_attempts
    return TaskRow(
        task_path=task.module_path,
        queue=task.queue_name,
        priority=task.priority,
        args=normalize_json(list(args)),
        kwargs=normalize_json(dict(kwargs)),
        run_after=resolve_run_after(task.run_after, now),
        enqueued_at=now,
        max_attempts=max_attempts,
    )


def enqueue_one(backend: "OxBackend", task: DjangoTask, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
    backend.validate_task(task)
    row = build_row(backend, task, args, kwargs, timezone.now())
    row.save(using=database_for(backend), force_insert=True)
    result = build_result(row, [], backend.alias, task)
    task_enqueued.send(type(backend), task_result=result)
    return result


async def aenqueue_one(
    backend: "OxBackend", task: DjangoTask, args: Sequence[Any], kwargs: dict[str, Any]
) -> TaskResult:
    backend.validate_task(task)
    row = build_row(backend, task, args, kwargs, timezone.now())
    await row.asave(using=database_for(backend), force_insert=True)
    result = build_result(row, [], backend.alias, task)
    await task_enqueued.asend(type(backend), task_result=result)
    return result


def enqueue_many(
    task: DjangoTask, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]], batch_size: int = 1000
) -> list[TaskResult]:
    """Enqueue many calls of one task: every call is validated before any row is written,
    then rows go in with multi-row INSERTs."""
    backend = task.get_backend()
    backend.validate_task(task)
    now = timezone.now()
    rows = [build_row(backend, task, args, kwargs, now) for args, kwargs in calls]
    TaskRow.objects.using(database_for(backend)).bulk_create(rows, batch_size=batch_size)
    results = [build_result(row, [], backend.alias, task) for row in rows]
    for result in results:
        task_enqueued.send(type(backend), task_result=result)
    return results
