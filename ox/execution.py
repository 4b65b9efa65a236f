"""Run one claimed task: decode it, call it (in a thread or on the event loop), and describe
what happened. Nothing here writes the queue's tables; the worker loop does that."""

import asyncio
import inspect
import json
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import close_old_connections, reset_queries
from django.tasks import Task as DjangoTask
from django.tasks import TaskContext, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_started
from django.utils import timezone
from django.utils.json import normalize_json

from ox.exceptions import TaskCancelled, TaskInterrupt, TaskTimeout, TaskUnrunnable, class_path
from ox.interrupt import Interrupter
from ox.jsoncheck import json_problem
from ox.models import Outcome
from ox.results import resolve_task, with_row_settings
from ox.sql import Claimed

SUCCESSFUL = "successful"


@dataclass(slots=True)
class Prepared:
    claimed: Claimed
    task: DjangoTask
    args: list[Any]
    kwargs: dict[str, Any]
    result: TaskResult
    timeout: float | None
    is_async: bool


@dataclass(slots=True)
class Finished:
    claimed: Claimed
    kind: str  # SUCCESSFUL or an ox.models.Outcome value
    started_at: datetime
    finished_at: datetime
    return_json: str = "null"
    exception_class_path: str = ""
    traceback: str = ""
    exception: BaseException | None = field(default=None, repr=False)
    task: DjangoTask | None = None
    result: TaskResult | None = None
    retryable: bool = True


def describe(exc: BaseException) -> tuple[str, str]:
    """Class path and traceback text, even for exceptions whose str() or repr() raise."""
    path = class_path(type(exc))
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:  # noqa: BLE001
        text = f"{path}: <the exception could not be formatted>"
    return path, text.replace("\x00", "\\x00")  # PostgreSQL text cannot hold NUL


def unrunnable(
    claimed: Claimed, message: str, *, retryable: bool = False, cause: BaseException | None = None
) -> Finished:
    now = timezone.now()
    exc = TaskUnrunnable(message)
    text = f"{class_path(TaskUnrunnable)}: {message}\n"
    if cause is not None:
        text = describe(cause)[1] + "\n" + text
    return Finished(
        claimed=claimed,
        kind=Outcome.FAILED,
        started_at=now,
        finished_at=now,
        exception_class_path=class_path(TaskUnrunnable),
        traceback=text,
        exception=exc,
        retryable=retryable,
    )


_signatures: dict[Any, inspect.Signature] = {}


def _signature(func: Any) -> inspect.Signature:
    sig = _signatures.get(func)
    if sig is None:
        sig = _signatures[func] = inspect.signature(func)
    return sig


def prepare(
    claimed: Claimed,
    backend_alias: str,
    worker_id: str,
    history: tuple[list[TaskError], list[str]],
    timeout: float | None,
) -> "Prepared | Finished":
    """Everything that can go wrong before the call: the path, the row, the signature."""
    try:
        task = resolve_task(claimed.task_path)
    except Exception as exc:  # noqa: BLE001
        # Retried by policy: during a rolling deploy an old worker may not know a new task.
        return unrunnable(claimed, str(exc), retryable=True, cause=exc)
    try:
        args = json.loads(claimed.args_json)
        kwargs = json.loads(claimed.kwargs_json)
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ValueError("args must be a JSON array and kwargs a JSON object")
    except ValueError as exc:
        return unrunnable(claimed, f"The stored arguments do not decode: {exc}")
    call_args = [None, *args] if task.takes_context else args
    try:
        _signature(task.func).bind(*call_args, **kwargs)
    except TypeError as exc:
        return unrunnable(claimed, f"The stored arguments no longer fit {claimed.task_path}: {exc}")
    errors, previous_workers = history
    result = TaskResult(
        task=with_row_settings(task, claimed.priority, claimed.queue, None),
        id=str(claimed.id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=claimed.enqueued_at,
        started_at=claimed.started_at,
        finished_at=None,
        last_attempted_at=claimed.last_attempted_at,
        args=args,
        kwargs=kwargs,
        backend=backend_alias,
        errors=list(errors),
        worker_ids=[*previous_workers, worker_id],
    )
    task_timeout = getattr(task, "timeout", None)
    return Prepared(
        claimed=claimed,
        task=task,
        args=args,
        kwargs=kwargs,
        result=result,
        timeout=task_timeout if task_timeout is not None else timeout,
        is_async=inspect.iscoroutinefunction(task.func),
    )


def _call_args(prep: Prepared) -> list[Any]:
    return [TaskContext(task_result=prep.result), *prep.args] if prep.task.takes_context else prep.args


def _finish_value(prep: Prepared, started: datetime, value: Any) -> Finished:
    problem = json_problem(value, "the return value")
    if problem:
        exc = TypeError(f"Task return values must survive a JSON round trip: {problem}.")
        return _finish_error(prep, started, exc, Outcome.FAILED)
    return Finished(
        claimed=prep.claimed,
        kind=SUCCESSFUL,
        started_at=started,
        finished_at=timezone.now(),
        return_json=json.dumps(normalize_json(value)),
        task=prep.task,
        result=prep.result,
    )


def _finish_error(prep: Prepared, started: datetime, exc: BaseException, kind: str) -> Finished:
    path, text = describe(exc)
    return Finished(
        claimed=prep.claimed,
        kind=kind,
        started_at=started,
        finished_at=timezone.now(),
        exception_class_path=path,
        traceback=text,
        exception=exc,
        task=prep.task,
        result=prep.result,
    )


def _kind_of(exc: BaseException) -> str:
    if isinstance(exc, TaskTimeout):
        return Outcome.TIMED_OUT
    if isinstance(exc, TaskCancelled):
        return Outcome.CANCELLED
    return Outcome.FAILED


def run_sync(prep: Prepared, interrupter: Interrupter, sender: type) -> Finished:
    """Run a sync task in the calling (pool) thread, with Django's per-request connection
    handling around it."""
    reset_queries()
    close_old_connections()
    started = timezone.now()
    finished: Finished | None = None
    interrupter.enter(prep.claimed.id)
    try:
        try:
            task_started.send(sender=sender, task_result=prep.result)
            value = prep.task.func(*_call_args(prep), **prep.kwargs)
            finished = _finish_value(prep, started, value)
        except TaskInterrupt as exc:
            finished = _finish_error(prep, started, exc, _kind_of(exc))
        except BaseException as exc:  # noqa: BLE001  (SystemExit from a task is the task's failure)
            finished = _finish_error(prep, started, exc, Outcome.FAILED)
    except TaskInterrupt as exc:  # landed while we were recording the outcome
        finished = finished or _finish_error(prep, started, exc, _kind_of(exc))
    finally:
        interrupter.leave(prep.claimed.id)
    try:
        close_old_connections()
    except Exception:  # noqa: BLE001, S110  (a broken connection is closed anyway)
        pass
    return finished


class AsyncRunner:
    """Async tasks run concurrently on one event loop (in its own thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._inner: dict[Any, asyncio.Task[Any]] = {}
        self._reasons: dict[Any, type[TaskInterrupt]] = {}

    async def run(self, prep: Prepared, sender: type) -> Finished:
        started = timezone.now()
        key = prep.claimed.id
        try:
            await task_started.asend(sender=sender, task_result=prep.result)
            inner = asyncio.ensure_future(prep.task.func(*_call_args(prep), **prep.kwargs))
            self._inner[key] = inner
            try:
                async with asyncio.timeout(prep.timeout) as scope:
                    value = await inner
            except TimeoutError as exc:
                if scope.expired():
                    return _finish_error(
                        prep, started, TaskTimeout(f"timed out after {prep.timeout} s"), Outcome.TIMED_OUT
                    )
                return _finish_error(prep, started, exc, Outcome.FAILED)
            except asyncio.CancelledError:
                reason = self._reasons.get(key)
                if reason is None:
                    raise  # the loop itself is shutting down
                return _finish_error(prep, started, reason("interrupted"), _kind_of(reason("")))
            return _finish_value(prep, started, value)
        except Exception as exc:  # noqa: BLE001
            return _finish_error(prep, started, exc, Outcome.FAILED)
        finally:
            self._inner.pop(key, None)
            self._reasons.pop(key, None)

    def interrupt(self, task_id: Any, exc_type: type[TaskInterrupt]) -> bool:
        inner = self._inner.get(task_id)
        if inner is None:
            return False
        self._reasons[task_id] = exc_type
        self.loop.call_soon_threadsafe(inner.cancel)
        return True
