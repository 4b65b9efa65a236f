"""Async tasks: they run concurrently on one event loop (in a thread of its own), each in an
asyncio Task of its own, interrupted by cancelling that Task."""

import asyncio
from typing import Any

from django.tasks.signals import task_started

from ox import steps
from ox.conf import OxOptions
from ox.exceptions import TaskInterrupt, TaskTimeout
from ox.execution import (
    SUCCESSFUL,
    Finished,
    Prepared,
    call_args,
    decide_retry,
    end_span,
    finish_error,
    finish_value,
    kind_of,
    misfit,
    start_span,
    started,
)
from ox.metadata import Busy, at_end, end_text, in_pool_thread
from ox.models import Outcome


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
        finished = await self._run(prep, sender, options)
        end_span(prep, finished)
        if prep.context is not None:
            if finished.kind == SUCCESSFUL:
                # Carried to the completion's statement: no write, and no trip to a thread
                # unless the heartbeat is writing this attempt's metadata right now.
                text = end_text(prep.context, wait=False)
                if isinstance(text, Busy):
                    text = await in_pool_thread(prep.using, end_text, prep.context)
                finished.metadata_json = text if isinstance(text, str) else None
            else:
                await in_pool_thread(prep.using, at_end, prep.context)
        return finished

    async def _run(self, prep: Prepared, sender: type, options: OxOptions) -> Finished:
        key = prep.key
        begun = started(prep)
        try:
            try:
                # Creating the coroutine runs none of the body: a TypeError here means the
                # stored arguments no longer fit the function.
                coroutine = prep.task.func(*call_args(prep), **prep.kwargs)
            except BaseException as exc:  # noqa: BLE001
                return decide_retry(misfit(prep, exc) or finish_error(prep, begun, exc, Outcome.FAILED), options)
            # The task's own asyncio Task takes a copy of this context: its steps' attempt.
            scope = steps.enter(prep.claimed.id, prep.claimed.fence, prep.claimed.attempts, prep.using)
            start_span(prep)
            try:
                inner = asyncio.ensure_future(_guarded(coroutine, prep, sender))
            finally:
                steps.leave(scope)
                if prep.span is not None:
                    prep.span.detach()
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
                return decide_retry(finish_error(prep, begun, timeout, Outcome.TIMED_OUT), options)
            except asyncio.CancelledError:
                reason = self._reasons.get(key)
                if reason is None:
                    raise  # the loop itself is shutting down
                return decide_retry(finish_error(prep, begun, reason("interrupted"), kind_of(reason(""))), options)
            if isinstance(outcome, _Raised):
                reason = self._reasons.get(key)
                kind = kind_of(reason("")) if reason is not None else kind_of(outcome.exc)
                return decide_retry(finish_error(prep, begun, outcome.exc, kind), options)
            return decide_retry(finish_value(prep, begun, outcome), options)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            return finish_error(prep, begun, RuntimeError("the task was cancelled by its event loop"), Outcome.FAILED)
        except BaseException as exc:  # noqa: BLE001  (whatever happens, the task reports)
            return finish_error(prep, begun, exc, Outcome.FAILED)
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
