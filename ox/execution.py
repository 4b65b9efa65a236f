"""Run one claimed task: decode it, call it (in a thread or on the event loop), and describe
what happened. Nothing here writes the queue's tables; the worker loop does that."""

import asyncio
import inspect
import json
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import close_old_connections, reset_queries
from django.tasks import Task as DjangoTask
from django.tasks import TaskContext, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_started

from ox import clock
from ox.backoff import retry_delay
from ox.conf import OxOptions
from ox.exceptions import TaskCancelled, TaskInterrupt, TaskTimeout, TaskUnrunnable, class_path
from ox.interrupt import Interrupter
from ox.models import Outcome
from ox.results import resolve_task, with_row_settings
from ox.sql import Claimed
from ox.storable import NotStorable, return_json, storable_text

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

    @property
    def key(self) -> tuple[Any, int]:
        return self.claimed.key


@dataclass(slots=True)
class Finished:
    claimed: Claimed
    kind: str  # SUCCESSFUL or an ox.models.Outcome value
    started_at: datetime | None  # None: the body never started (skipped, cancelled first)
    finished_at: datetime
    return_json: str = "null"
    exception_class_path: str = ""
    traceback: str = ""
    exception: BaseException | None = field(default=None, repr=False)
    task: DjangoTask | None = None
    result: TaskResult | None = None
    retryable: bool = True
    retry_in: float | None = None  # seconds until the next attempt; None: this one is final
    note: str = ""  # what ox adds to the traceback (a misbehaving backoff, say)

    @property
    def key(self) -> tuple[Any, int]:
        return self.claimed.key


def _now() -> datetime:
    # The database's clock as last read (ox.clock): task threads never touch the connection.
    return clock.estimated_now()


def describe(exc: BaseException) -> tuple[str, str]:
    """Class path and traceback text, even for exceptions whose str() or repr() raise."""
    path = storable_text(class_path(type(exc)))
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:  # noqa: BLE001
        text = f"{path}: <the exception could not be formatted>"
    # A message may hold NUL or a lone surrogate (an undecodable file name): neither
    # database stores those as text, and the error must not be lost for it.
    return path, storable_text(text)


def unrunnable(
    claimed: Claimed, message: str, *, retryable: bool = False, cause: BaseException | None = None
) -> Finished:
    now = _now()
    message = storable_text(message)
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


@dataclass(frozen=True, slots=True)
class _Resolved:
    task: DjangoTask
    is_async: bool
    timeout: float | None


_resolved: dict[str, _Resolved] = {}  # task path -> what the worker needs of it (imports are for life)


def _resolve(task_path: str) -> _Resolved:
    info = _resolved.get(task_path)
    if info is None:
        task = resolve_task(task_path)
        info = _resolved[task_path] = _Resolved(
            task, inspect.iscoroutinefunction(task.func), getattr(task, "timeout", None)
        )
    return info


def running_result(
    task: DjangoTask,
    claimed: Claimed,
    args: list[Any],
    kwargs: dict[str, Any],
    backend_alias: str,
    errors: list[TaskError],
    worker_ids: list[str],
) -> TaskResult:
    """Django's TaskResult for a task being run. Built field by field: TaskResult's own
    __init__ normalizes args through JSON again, and these just came out of JSON."""
    result = object.__new__(TaskResult)
    for name, value in (
        ("task", with_row_settings(task, claimed.priority, claimed.queue, claimed.scheduled_for, backend_alias)),
        ("id", str(claimed.id)),
        ("status", TaskResultStatus.READY),  # RUNNING once its body starts (started())
        ("enqueued_at", claimed.enqueued_at),
        ("started_at", claimed.started_at),
        ("finished_at", None),
        ("last_attempted_at", None),
        ("args", args),
        ("kwargs", kwargs),
        ("backend", backend_alias),
        ("errors", errors),
        ("worker_ids", worker_ids),
        ("_return_value", None),
    ):
        object.__setattr__(result, name, value)
    return result


def prepare(
    claimed: Claimed,
    backend_alias: str,
    worker_id: str,
    history: tuple[list[TaskError], list[str]],
    timeout: float | None,
) -> "Prepared | Finished":
    """Everything that can go wrong before the call: the path and the row. (Arguments that
    no longer fit the function are caught at the call, see misfit().)"""
    try:
        info = _resolve(claimed.task_path)
    except Exception as exc:  # noqa: BLE001
        # Retried by policy: during a rolling deploy an old worker may not know a new task.
        return unrunnable(claimed, str(exc), retryable=True, cause=exc)
    try:
        args = json.loads(claimed.args_json)
        kwargs = json.loads(claimed.kwargs_json)
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ValueError("args must be a JSON array and kwargs a JSON object")
    except (ValueError, RecursionError, MemoryError) as exc:  # RecursionError: nested too deep
        return unrunnable(claimed, f"The stored arguments do not decode: {exc!r}")
    errors, previous_workers = history
    result = running_result(
        info.task, claimed, args, kwargs, backend_alias, list(errors), [*previous_workers, worker_id]
    )
    return Prepared(
        claimed=claimed,
        task=info.task,
        args=args,
        kwargs=kwargs,
        result=result,
        timeout=info.timeout if info.timeout is not None else timeout,
        is_async=info.is_async,
    )


def misfit(prep: Prepared, exc: BaseException) -> Finished | None:
    """A TypeError raised by the call itself, before any line of the function ran: the
    stored arguments no longer fit its signature. Permanent, so no retry."""
    if isinstance(exc, TypeError) and exc.__traceback__ is not None and exc.__traceback__.tb_next is None:
        finished = unrunnable(prep.claimed, f"The stored arguments no longer fit {prep.claimed.task_path}: {exc}")
        finished.task, finished.result = prep.task, prep.result  # task_finished is sent for it
        return finished
    return None


def _call_args(prep: Prepared) -> list[Any]:
    return [TaskContext(task_result=prep.result), *prep.args] if prep.task.takes_context else prep.args


def started(prep: Prepared) -> datetime:
    """The body is about to run: from now the task reads as RUNNING."""
    now = _now()
    result = prep.result
    object.__setattr__(result, "status", TaskResultStatus.RUNNING)
    object.__setattr__(result, "started_at", result.started_at or now)
    object.__setattr__(result, "last_attempted_at", now)
    return now


def _finish_value(prep: Prepared, started: datetime, value: Any) -> Finished:
    if value is None:  # the common case, without the walk
        return Finished(prep.claimed, SUCCESSFUL, started, _now(), task=prep.task, result=prep.result)
    try:
        text = return_json(value)
    except NotStorable as exc:
        # The body ran to the end; running it again would return the same value.
        finished = _finish_error(prep, started, exc, Outcome.FAILED)
        if exc.__cause__ is not None:  # what Django's backends record: normalize_json's TypeError
            finished.exception_class_path = class_path(type(exc.__cause__))
        finished.retryable = False
        return finished
    return Finished(
        claimed=prep.claimed,
        kind=SUCCESSFUL,
        started_at=started,
        finished_at=_now(),
        return_json=text,
        task=prep.task,
        result=prep.result,
    )


def _finish_error(prep: Prepared, started: datetime, exc: BaseException, kind: str) -> Finished:
    path, text = describe(exc)
    return Finished(
        claimed=prep.claimed,
        kind=kind,
        started_at=started,
        finished_at=_now(),
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


def decide_retry(finished: Finished, options: OxOptions) -> Finished:
    """Whether and when a failed attempt runs again. Runs where the task ran (its thread,
    or the event loop), not on the worker loop: a backoff is user code and may be slow."""
    claimed = finished.claimed
    if finished.kind in (SUCCESSFUL, Outcome.CANCELLED) or not finished.retryable:
        return finished
    if claimed.attempts >= claimed.max_attempts:
        return finished
    exc = finished.exception or Exception(finished.kind)
    finished.retry_in, finished.note = retry_delay(finished.task, exc, finished.result, claimed.attempts, options)
    return finished


_thread_state = threading.local()


def _before_task() -> None:
    """Django's request-start hygiene: fresh query log, no connection past its age. The
    check is skipped when this thread ran the same check a moment ago, after its last task."""
    if settings.DEBUG:
        reset_queries()
    if time.monotonic() - getattr(_thread_state, "checked_at", 0.0) > 1.0:
        try:
            close_old_connections()
        except Exception:  # noqa: BLE001, S110  (a broken connection is closed anyway)
            pass


def _after_task() -> None:
    try:
        close_old_connections()
    except Exception:  # noqa: BLE001, S110  (a broken connection is closed anyway)
        pass
    _thread_state.checked_at = time.monotonic()


def run_sync(prep: Prepared, interrupter: Interrupter, sender: type, options: OxOptions) -> Finished:
    """Run a sync task in the calling (pool) thread, with Django's per-request connection
    handling around it."""
    _before_task()
    begun = started(prep)
    finished: Finished | None = None
    interrupter.enter(prep.key)
    try:
        try:
            task_started.send(sender=sender, task_result=prep.result)
            value = prep.task.func(*_call_args(prep), **prep.kwargs)
            finished = _finish_value(prep, begun, value)
        except TaskInterrupt as exc:
            finished = _finish_error(prep, begun, exc, _kind_of(exc))
        except BaseException as exc:  # noqa: BLE001  (SystemExit from a task is the task's failure)
            finished = misfit(prep, exc) or _finish_error(prep, begun, exc, Outcome.FAILED)
        finished = decide_retry(finished, options)
    except TaskInterrupt as exc:  # landed while we were recording the outcome
        finished = finished or _finish_error(prep, begun, exc, _kind_of(exc))
    finally:
        interrupter.leave(prep.key)
    _after_task()
    return finished


class _Raised:
    """What a task raised, carried out of its asyncio Task as a value: SystemExit or
    KeyboardInterrupt raised out of a Task would stop the event loop itself."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def _guarded(coroutine: Any, prep: Prepared, sender: type) -> Any:
    try:
        try:
            await task_started.asend(sender=sender, task_result=prep.result)
        except BaseException:
            coroutine.close()  # never started: no "never awaited" warning
            raise
        return await coroutine
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # ox cancelled it (a cancel, a timeout)
        return _Raised(exc)  # the task raised CancelledError itself: its own failure
    except BaseException as exc:  # noqa: BLE001
        return _Raised(exc)


class AsyncRunner:
    """Async tasks run concurrently on one event loop (in its own thread). Every in-flight
    structure is keyed by the claim (task id, fence)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._inner: dict[Any, asyncio.Task[Any]] = {}
        self._reasons: dict[Any, type[TaskInterrupt]] = {}

    async def run(self, prep: Prepared, sender: type, options: OxOptions) -> Finished:
        key = prep.key
        begun = started(prep)
        try:
            try:
                # Creating the coroutine runs none of the body: a TypeError here means the
                # stored arguments no longer fit the function.
                coroutine = prep.task.func(*_call_args(prep), **prep.kwargs)
            except BaseException as exc:  # noqa: BLE001
                return decide_retry(misfit(prep, exc) or _finish_error(prep, begun, exc, Outcome.FAILED), options)
            inner = asyncio.ensure_future(_guarded(coroutine, prep, sender))
            self._inner[key] = inner
            try:
                async with asyncio.timeout(prep.timeout) as scope:
                    outcome = await inner
                if scope.expired():  # the task swallowed the cancellation and returned late
                    raise TimeoutError
            except TimeoutError:
                if not scope.expired():
                    raise
                timeout = TaskTimeout(f"timed out after {prep.timeout} s")
                return decide_retry(_finish_error(prep, begun, timeout, Outcome.TIMED_OUT), options)
            except asyncio.CancelledError:
                reason = self._reasons.get(key)
                if reason is None:
                    raise  # the loop itself is shutting down
                return decide_retry(_finish_error(prep, begun, reason("interrupted"), _kind_of(reason(""))), options)
            if isinstance(outcome, _Raised):
                reason = self._reasons.get(key)
                kind = _kind_of(reason("")) if reason is not None else _kind_of(outcome.exc)
                return decide_retry(_finish_error(prep, begun, outcome.exc, kind), options)
            return decide_retry(_finish_value(prep, begun, outcome), options)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            return _finish_error(prep, begun, RuntimeError("the task was cancelled by its event loop"), Outcome.FAILED)
        except BaseException as exc:  # noqa: BLE001  (whatever happens, the task reports)
            return _finish_error(prep, begun, exc, Outcome.FAILED)
        finally:
            self._inner.pop(key, None)
            self._reasons.pop(key, None)

    def interrupt(self, key: Any, exc_type: type[TaskInterrupt]) -> bool:
        inner = self._inner.get(key)
        if inner is None:
            return False
        self._reasons[key] = exc_type
        self.loop.call_soon_threadsafe(inner.cancel)
        return True
