"""Turn a stored row (and its failed attempts) into Django's TaskResult."""

from dataclasses import fields
from typing import Any

from django.tasks import Task as DjangoTask
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask
from django.utils.module_loading import import_string

from ox.exceptions import TaskCancelled, class_path
from ox.metadata import OxTaskResult
from ox.models import Attempt, Outcome, Status
from ox.models import TaskBase as TaskRow  # a row of ox_task or of the archive

STATUS_FOR_DJANGO = {
    # A workflow's task waiting for the ones before it (ox.workflow): not started, as READY.
    Status.PENDING: TaskResultStatus.READY,
    Status.READY: TaskResultStatus.READY,
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.SUCCESSFUL: TaskResultStatus.SUCCESSFUL,
    Status.FAILED: TaskResultStatus.FAILED,
    # Django has no CANCELLED: it reads as FAILED, with a TaskError that says why.
    Status.CANCELLED: TaskResultStatus.FAILED,
}
CANCELLED_BEFORE_START = "The task was cancelled before it started."
CANCELLED_BY_REQUEST = "The task was cancelled while it ran; it will not run again."


def resolve_task(task_path: str) -> DjangoTask:
    try:
        task = import_string(task_path)
    except ImportError as exc:
        raise InvalidTask(f"Task path {task_path!r} no longer imports: {exc}") from exc
    if not isinstance(task, DjangoTask):
        raise InvalidTask(f"{task_path!r} is not a Task (decorate the function with @task)")
    return task


def with_row_settings(task: DjangoTask, priority: int, queue: str, run_after: Any, backend: str) -> DjangoTask:
    """The task as it was enqueued. Built without re-validating: the row exists whatever the
    settings say today (a queue removed since, say)."""
    if (task.priority, task.queue_name, task.run_after, task.backend) == (priority, queue, run_after, backend):
        return task
    copy = object.__new__(type(task))
    for f in fields(task):
        object.__setattr__(copy, f.name, getattr(task, f.name))
    object.__setattr__(copy, "priority", priority)
    object.__setattr__(copy, "queue_name", queue)
    object.__setattr__(copy, "run_after", run_after)
    object.__setattr__(copy, "backend", backend)
    return copy


def claimed_unstarted(row: TaskRow) -> bool:
    """Claimed (RUNNING in the table, leased) but its body has not started: it may be
    prefetched behind a slow task. The first write after the body starts sets
    last_attempted_at; through Django's API the task is READY until then."""
    return row.status == Status.RUNNING and row.last_attempted_at is None


def attempts_to_load(row: TaskRow) -> bool:
    """Whether the row can have Attempt rows; the happy path writes none, so most reads of a
    finished task cost one query."""
    final_attempt_in_row = row.status in (Status.RUNNING, Status.SUCCESSFUL)
    return row.status == Status.CANCELLED or row.attempts - int(final_attempt_in_row) > 0


def errors_and_workers(row: TaskRow, attempts: list[Attempt]) -> tuple[list[TaskError], list[str]]:
    errors = [
        TaskError(exception_class_path=a.exception_class_path or class_path(Exception), traceback=a.traceback)
        for a in attempts
    ]
    worker_ids = [a.worker_id for a in attempts]
    if row.status == Status.SUCCESSFUL or (row.status == Status.RUNNING and not claimed_unstarted(row)):
        worker_ids.append(row.worker_id)
    if row.status == Status.CANCELLED and not any(a.outcome == Outcome.CANCELLED for a in attempts):
        text = CANCELLED_BEFORE_START if not attempts else CANCELLED_BY_REQUEST
        errors.append(TaskError(exception_class_path=class_path(TaskCancelled), traceback=text))
    return errors, worker_ids


def ready_result(row: Any, task: DjangoTask, backend_alias: str) -> TaskResult:
    """The TaskResult of a task just enqueued (row: an ox.sql.NewTask). Built field by field:
    TaskResult's __init__ would walk the arguments through JSON again."""
    enqueued_as = (row.priority, row.queue, backend_alias)
    if row.scheduled_for is not None or (task.priority, task.queue_name, task.backend) != enqueued_as:
        task = with_row_settings(task, row.priority, row.queue, row.scheduled_for, backend_alias)
    result = object.__new__(OxTaskResult)
    put = object.__setattr__  # frozen dataclass: how its own __init__ sets fields
    put(result, "task", task)
    put(result, "id", str(row.id))
    put(result, "status", TaskResultStatus.READY)
    put(result, "enqueued_at", row.enqueued_at)
    put(result, "started_at", None)
    put(result, "finished_at", None)
    put(result, "last_attempted_at", None)
    put(result, "args", row.args)
    put(result, "kwargs", row.kwargs)
    put(result, "backend", backend_alias)
    put(result, "errors", [])
    put(result, "worker_ids", [])
    put(result, "_return_value", None)
    put(result, "metadata", {} if row.metadata is None else dict(row.metadata))
    return result


def build_result(
    row: TaskRow, attempts: list[Attempt], backend_alias: str, task: DjangoTask | None = None
) -> TaskResult:
    if task is None:
        task = resolve_task(row.task_path)
    task = with_row_settings(task, row.priority, row.queue, row.scheduled_for, backend_alias)
    errors, worker_ids = errors_and_workers(row, attempts)
    status = STATUS_FOR_DJANGO[Status(row.status)]
    last_attempted_at = row.last_attempted_at
    if claimed_unstarted(row):
        status = TaskResultStatus.READY
        last_attempted_at = max((a.started_at for a in attempts if a.started_at), default=None)
    result = OxTaskResult(
        task=task,
        id=str(row.id),
        status=status,
        enqueued_at=row.enqueued_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        last_attempted_at=last_attempted_at,
        args=row.args,
        kwargs=row.kwargs,
        backend=backend_alias,
        errors=errors,
        worker_ids=worker_ids,
        metadata=row.metadata if isinstance(row.metadata, dict) else {},
    )
    if row.status == Status.SUCCESSFUL:
        object.__setattr__(result, "_return_value", row.return_value)
    return result
