"""Run one claimed task: decode it, call it (in a thread or on the event loop), and describe
what happened. Nothing here writes the queue's tables; the worker loop does that."""

import inspect
import json
import logging
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import close_old_connections, reset_queries
from django.tasks import Task as DjangoTask
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_started

from ox import clock, steps, tracing
from ox.backoff import retry_delay
from ox.conf import OxOptions
from ox.exceptions import TaskCancelled, TaskInterrupt, TaskTimeout, TaskUnrunnable, class_path
from ox.interrupt import Interrupter
from ox.metadata import OxTaskContext, OxTaskResult, at_end, context_for, end_text
from ox.models import Outcome
from ox.results import resolve_task, with_row_settings
from ox.sql import Claimed
from ox.storable import NotStorable, return_json, storable_text

SUCCESSFUL = "successful"

logger = logging.getLogger("ox.worker")


@dataclass(slots=True)
class Prepared:
    claimed: Claimed
    task: DjangoTask
    args: list[Any]
    kwargs: dict[str, Any]
    result: TaskResult
    timeout: float | None
    is_async: bool
    using: str = ""  # the database the task's metadata is written to (ox.metadata)
    context: OxTaskContext | None = None  # given to a task that takes one (ox.metadata)
    span: Any = None  # the attempt's OpenTelemetry span (ox.tracing), when tracing is on

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
    metadata_json: str | None = None  # a success's last metadata, written with its completion

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
    result = object.__new__(OxTaskResult)
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
        ("metadata", {}),
    ):
        object.__setattr__(result, name, value)
    return result


def prepare(
    claimed: Claimed,
    backend_alias: str,
    worker_id: str,
    history: tuple[list[TaskError], list[str]],
    timeout: float | None,
    using: str = "default",
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
    if claimed.metadata_json is not None:
        try:
            metadata = json.loads(claimed.metadata_json)
        except (ValueError, RecursionError, MemoryError) as exc:
            return unrunnable(claimed, f"The stored metadata does not decode: {exc!r}")
        if isinstance(metadata, dict):
            object.__setattr__(result, "metadata", metadata)
    return Prepared(
        claimed=claimed,
        task=info.task,
        args=args,
        kwargs=kwargs,
        result=result,
        timeout=info.timeout if info.timeout is not None else timeout,
        is_async=info.is_async,
        using=using,
    )


def misfit(prep: Prepared, exc: BaseException) -> Finished | None:
    """A TypeError raised by the call itself, before any line of the function ran: the
    stored arguments no longer fit its signature. Permanent, so no retry."""
    if isinstance(exc, TypeError) and exc.__traceback__ is not None and exc.__traceback__.tb_next is None:
        finished = unrunnable(prep.claimed, f"The stored arguments no longer fit {prep.claimed.task_path}: {exc}")
        finished.task, finished.result = prep.task, prep.result  # task_finished is sent for it
        return finished
    return None


def call_args(prep: Prepared) -> list[Any]:
    if not prep.task.takes_context:
        return prep.args
    claimed = prep.claimed
    prep.context = context_for(prep.result, claimed.id, claimed.fence, prep.using)  # type: ignore[arg-type]
    return [prep.context, *prep.args]


def start_span(prep: Prepared) -> None:
    """The attempt's span (ox.tracing). Tracing is the user's configuration: whatever it
    raises is logged, and the task runs untraced."""
    if not tracing.enabled():
        return
    c = prep.claimed
    try:
        metadata = getattr(prep.result, "metadata", {})
        prep.span = tracing.start_attempt(c.task_path, c.queue, str(c.id), c.attempts, metadata)
    except Exception:  # noqa: BLE001
        logger.exception("ox: could not start the span of task %s", c.id)


def settle_metadata(prep: Prepared, finished: Finished) -> None:
    """The attempt's metadata at its end: a success carries it to its completion (one
    statement writes both, no write of its own: bench cell progress_metadata); any other
    outcome writes it now, before the outcome is recorded (ox.metadata.at_end)."""
    if prep.context is None:
        return
    if finished.kind == SUCCESSFUL:
        text = end_text(prep.context)  # a task thread: it may wait for the heartbeat's write
        finished.metadata_json = text if isinstance(text, str) else None
    else:
        at_end(prep.context)


def end_span(prep: Prepared, finished: Finished | None) -> None:
    span, prep.span = prep.span, None
    if span is None:
        return
    try:
        if finished is None:
            span.end(None, "unknown", failed=True)
        else:
            span.end(finished.exception, finished.kind, failed=finished.kind != SUCCESSFUL)
    except Exception:  # noqa: BLE001
        logger.exception("ox: could not end the span of task %s", prep.claimed.id)


def started(prep: Prepared) -> datetime:
    """The body is about to run: from now the task reads as RUNNING."""
    now = _now()
    result = prep.result
    object.__setattr__(result, "status", TaskResultStatus.RUNNING)
    object.__setattr__(result, "started_at", result.started_at or now)
    object.__setattr__(result, "last_attempted_at", now)
    return now


def finish_value(prep: Prepared, started: datetime, value: Any) -> Finished:
    if value is None:  # the common case, without the walk
        return Finished(prep.claimed, SUCCESSFUL, started, _now(), task=prep.task, result=prep.result)
    try:
        text = return_json(value)
    except NotStorable as exc:
        # The body ran to the end; running it again would return the same value.
        finished = finish_error(prep, started, exc, Outcome.FAILED)
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


def finish_error(prep: Prepared, started: datetime, exc: BaseException, kind: str) -> Finished:
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


def kind_of(exc: BaseException) -> str:
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
    scope = steps.enter(prep.claimed.id, prep.claimed.fence, prep.claimed.attempts, prep.using)
    start_span(prep)
    try:
        try:
            task_started.send(sender=sender, task_result=prep.result)
            value = prep.task.func(*call_args(prep), **prep.kwargs)
            finished = finish_value(prep, begun, value)
        except TaskInterrupt as exc:
            finished = finish_error(prep, begun, exc, kind_of(exc))
        except BaseException as exc:  # noqa: BLE001  (SystemExit from a task is the task's failure)
            finished = misfit(prep, exc) or finish_error(prep, begun, exc, Outcome.FAILED)
        finished = decide_retry(finished, options)
    except TaskInterrupt as exc:  # landed while we were recording the outcome
        finished = finished or finish_error(prep, begun, exc, kind_of(exc))
    finally:
        steps.leave(scope)
        interrupter.leave(prep.key)
    end_span(prep, finished)
    settle_metadata(prep, finished)
    _after_task()
    return finished
