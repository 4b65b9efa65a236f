"""Where claimed tasks run: a pool of threads for sync tasks, one event loop for async ones.

Both take every claimed task at once (the prefetched ones wait in their inbox) and report
each outcome to the worker's outcome queue. A task not yet started can be skipped (it was
cancelled, or its lease was lost) or taken back (shutdown, or it was prefetched behind a
long task) without ever running. Everything is keyed by the claim (task id, fence).
"""

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ox import clock, start_marks
from ox.conf import OxOptions
from ox.exceptions import TaskCancelled, TaskInterrupt
from ox.execution import Finished, Prepared, decide_retry, run_sync, unrunnable
from ox.execution_async import AsyncRunner
from ox.flow.local import LocalLimits
from ox.interrupt import Interrupter
from ox.models import Outcome

logger = logging.getLogger("ox.worker")

SKIPPED = "skipped"  # an outcome kind with nothing to write: the lease is no longer ours
REPORTED = "reported"  # a skip mark: its outcome (cancelled before it started) was sent already
Key = tuple[Any, int]


def skipped(prep: Prepared, kind: str) -> Finished:
    now = clock.estimated_now()
    if kind == Outcome.CANCELLED:
        return Finished(
            claimed=prep.claimed,
            kind=Outcome.CANCELLED,
            started_at=None,  # its body never ran
            finished_at=now,
            exception_class_path="ox.exceptions.TaskCancelled",
            traceback="ox.exceptions.TaskCancelled: cancelled before it started\n",
            task=prep.task,
            result=prep.result,
        )
    return Finished(claimed=prep.claimed, kind=SKIPPED, started_at=now, finished_at=now)


class _Tracker:
    """Which handed-over claims have started (and when); skip marks for those that have not."""

    def __init__(self, on_start: Callable[[], None]) -> None:
        self.lock = threading.Lock()
        self.started: dict[Key, tuple[float, datetime]] = {}  # monotonic and wall-clock start
        self.skip: dict[Key, str] = {}
        self.on_start = on_start

    def begin(self, key: Key) -> str | None:
        """Mark started, unless a skip was asked for first (returns its kind)."""
        with self.lock:
            kind = self.skip.pop(key, None)
            if kind is None:
                self.started[key] = (time.monotonic(), clock.estimated_now())
        if kind is None:
            self.on_start()
        return kind

    def end(self, key: Key) -> None:
        with self.lock:
            self.started.pop(key, None)

    def mark_skip(self, key: Key, kind: str) -> bool:
        """Skip a claim that has not started; False if it already runs."""
        with self.lock:
            if key in self.started:
                return False
            self.skip[key] = kind
            return True


class _Executor:
    """What both executors share: which claims started, and stopping one by its key."""

    tracker: _Tracker
    local: LocalLimits
    is_async: bool = False
    outcomes: "queue.Queue[Any]"

    def started_at(self, key: Key) -> float | None:
        entry = self.tracker.started.get(key)
        return entry[0] if entry else None

    def started_wall(self, key: Key) -> datetime | None:
        entry = self.tracker.started.get(key)
        return entry[1] if entry else None

    def interrupt(self, key: Key, exc_type: type[TaskInterrupt], prep: Prepared | None = None) -> bool:
        """Interrupt a running task, or make an unstarted one skip. An unstarted one
        cancelled (prep given) ends now, not when a thread or an async slot would have
        reached it: a task claimed ahead behind a long one would hold its key until then."""
        kind = Outcome.CANCELLED if exc_type is TaskCancelled else SKIPPED
        if self._drop_parked(key, kind):
            return True
        if kind == Outcome.CANCELLED and prep is not None:
            if self.tracker.mark_skip(key, REPORTED):
                self._dropped(prep)
                self.outcomes.put(skipped(prep, kind))
                return True
        elif self.tracker.mark_skip(key, kind):
            return True
        return self._interrupt_running(key, exc_type)

    def _drop_parked(self, key: Key, kind: str) -> bool:
        """A task parked for a slot (ox.flow.local) ends now, not when a slot frees here."""
        prep = self.local.drop(key, self.is_async)
        if prep is None:
            return False
        self._dropped(prep)
        self.outcomes.put(skipped(prep, kind))
        return True

    def _dropped(self, prep: Prepared) -> None:
        pass

    def _interrupt_running(self, key: Key, exc_type: type[TaskInterrupt]) -> bool:
        raise NotImplementedError

    def forget(self, key: Key) -> bool:
        """The lease was lost: skip the task if it has not started."""
        return self._drop_parked(key, SKIPPED) or self.tracker.mark_skip(key, SKIPPED)


def _crashed(prep: Prepared, exc: BaseException, options: OxOptions) -> Finished:
    # ox's own code failed around the task (not the task): report it, never go silent.
    finished = unrunnable(prep.claimed, f"the worker failed while running the task: {exc!r}", retryable=True, cause=exc)
    finished.task, finished.result = prep.task, prep.result
    return decide_retry(finished, options)


class SyncExecutor(_Executor):
    def __init__(
        self,
        threads: int,
        sender: type,
        outcomes: "queue.Queue[Any]",
        options: OxOptions,
        on_start: Callable[[], None],
        local: LocalLimits | None = None,
    ) -> None:
        self.local = local or LocalLimits()
        # Where parked tasks a finished one lets start go: the slots are shared by both
        # kinds, so the worker routes each to its own executor (self.resume alone here).
        self.route: Callable[[list[Prepared]], None] = self.resume
        self.inbox: queue.Queue[Prepared | None] = queue.Queue()
        self.outcomes = outcomes
        self.sender = sender
        self.options = options
        self.interrupter = Interrupter()
        self.tracker = _Tracker(on_start)
        self.threads = [threading.Thread(target=self._loop, name=f"ox-task-{i}", daemon=True) for i in range(threads)]
        for thread in self.threads:
            thread.start()

    def submit(self, prep: Prepared) -> None:
        self.inbox.put(prep)

    def waiting(self) -> int:
        """Tasks waiting for a thread (the parked ones wait for a slot: they are no reason
        to give anything back, nor to wake at the prefetch window)."""
        return self.inbox.qsize()

    def resume(self, preps: list[Prepared]) -> None:
        """Parked tasks a slot now lets start (ox.flow.local admitted them)."""
        for prep in preps:
            self.inbox.put(prep)

    def _loop(self) -> None:
        while True:
            prep = self.inbox.get()
            if prep is None:
                return
            # A task of a slotted queue beyond the slots held here waits, parked.
            if not self.local.admit(prep):
                continue
            try:
                self._run_one(prep)
            except BaseException as exc:  # noqa: BLE001  (an interrupt that landed late: the thread lives on)
                logger.error("task thread caught %r outside a task", exc)
            finally:
                self.route(self.local.finished(prep))

    def _run_one(self, prep: Prepared) -> None:
        key = prep.key
        kind = self.tracker.begin(key)
        if kind is not None:
            if kind != REPORTED:
                self.outcomes.put(skipped(prep, kind))
            return
        finished: Finished | None = None
        try:
            if start_marks.needed(prep) and not start_marks.write(prep):
                finished = skipped(prep, SKIPPED)
                return
            finished = run_sync(prep, self.interrupter, self.sender, self.options)
        except BaseException as exc:  # noqa: BLE001
            finished = _crashed(prep, exc, self.options)
        finally:
            self.tracker.end(key)
            self.outcomes.put(finished or _crashed(prep, RuntimeError("no outcome"), self.options))

    def _interrupt_running(self, key: Key, exc_type: type[TaskInterrupt]) -> bool:
        return self.interrupter.interrupt(key, exc_type)

    def take_back(self) -> list[Prepared]:
        """Everything still waiting in the inbox or parked (shutdown, or prefetched behind
        long tasks)."""
        taken: list[Prepared] = self.local.take_parked(is_async=False)
        while True:
            try:
                prep = self.inbox.get_nowait()
            except queue.Empty:
                break
            if prep is not None:
                taken.append(prep)
        return self._taken(taken)

    def _taken(self, taken: list[Prepared]) -> list[Prepared]:
        out = []
        for prep in taken:
            self.route(self.local.finished(prep))  # an admitted one frees its place here
            with self.tracker.lock:
                if self.tracker.skip.pop(prep.key, None) != REPORTED:  # not ended already
                    out.append(prep)
        return out

    def take_waiting(self, queues: set[str]) -> list[Prepared]:
        """The tasks of these queues waiting in the inbox for a thread (not the parked)."""
        kept, taken = [], []
        while True:
            try:
                prep = self.inbox.get_nowait()
            except queue.Empty:
                break
            if prep is None:  # a stop: the threads still get it
                kept.append(prep)
            else:
                (taken if prep.claimed.queue in queues else kept).append(prep)
        # Back in their order. (A parked task a finishing thread resumes meanwhile may go
        # before them: no task is lost or doubled, only cross-queue order moves.)
        for prep in kept:
            self.inbox.put(prep)
        return self._taken(taken)

    def stop(self) -> None:
        for _ in self.threads:
            self.inbox.put(None)


class AsyncExecutor(_Executor):
    is_async = True

    def __init__(
        self,
        concurrency: int,
        sender: type,
        outcomes: "queue.Queue[Any]",
        options: OxOptions,
        on_start: Callable[[], None],
        local: LocalLimits | None = None,
    ) -> None:
        self.local = local or LocalLimits()
        self.route: Callable[[list[Prepared]], None] = self.resume  # as for SyncExecutor
        self.loop = asyncio.new_event_loop()
        self.runner = AsyncRunner(self.loop)
        self.sender = sender
        self.outcomes = outcomes
        self.options = options
        self.tracker = _Tracker(on_start)
        self.waiting_preps: dict[Key, Prepared] = {}  # handed over, not started
        self.slots: asyncio.Semaphore | None = None
        self.concurrency = concurrency
        self.stopped = False
        threading.Thread(target=self._run_loop, name="ox-async", daemon=True).start()

    def _run_loop(self) -> None:
        # A SystemExit or KeyboardInterrupt raised inside a task's own sub-task escapes
        # asyncio's Task machinery into run_forever; the loop is started again, so later
        # async tasks still run (the task that raised it has already seen its exception).
        while not self.stopped:
            try:
                self.loop.run_forever()
            except BaseException as exc:  # noqa: BLE001
                logger.error("the event loop stopped on %r; restarting it", exc)

    async def _run(self, prep: Prepared) -> None:
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.concurrency)
        # A task of a slotted queue beyond the slots held here waits, parked.
        if not self.local.admit(prep):
            return
        try:
            await self._run_admitted(prep)
        finally:
            self.route(self.local.finished(prep))

    def resume(self, preps: list[Prepared]) -> None:
        """Parked tasks a slot now lets start (from any thread)."""
        for prep in preps:
            asyncio.run_coroutine_threadsafe(self._run(prep), self.loop)

    async def _run_admitted(self, prep: Prepared) -> None:
        assert self.slots is not None
        key = prep.key
        async with self.slots:
            self.waiting_preps.pop(key, None)
            kind = self.tracker.begin(key)
            if kind is not None:
                if kind != REPORTED:
                    self.outcomes.put(skipped(prep, kind))
                return
            finished: Finished | None = None
            try:
                if start_marks.needed(prep) and not await start_marks.awrite(prep):
                    finished = skipped(prep, SKIPPED)
                    return
                finished = await self.runner.run(prep, self.sender, self.options)
            except BaseException as exc:  # noqa: BLE001
                finished = _crashed(prep, exc, self.options)
                if isinstance(exc, asyncio.CancelledError):
                    raise
            finally:
                self.tracker.end(key)
                self.outcomes.put(finished or _crashed(prep, RuntimeError("no outcome"), self.options))

    def submit(self, prep: Prepared) -> None:
        self.waiting_preps[prep.key] = prep
        asyncio.run_coroutine_threadsafe(self._run(prep), self.loop)

    def waiting(self) -> int:
        return max(len(self.waiting_preps) - self.local.parked_count(is_async=True), 0)

    def _dropped(self, prep: Prepared) -> None:
        self.waiting_preps.pop(prep.key, None)

    def _interrupt_running(self, key: Key, exc_type: type[TaskInterrupt]) -> bool:
        return self.runner.interrupt(key, exc_type)

    def take_back(self) -> list[Prepared]:
        parked = {p.key for p in self.local.take_parked(is_async=True)}
        # The parked are never scheduled again: nothing to skip.
        taken = [self.waiting_preps.pop(key) for key in list(self.waiting_preps) if key in parked]
        return taken + self._skip_waiting(lambda prep: True)

    def take_waiting(self, queues: set[str]) -> list[Prepared]:
        """The tasks of these queues waiting for an async slot (not the parked)."""
        parked = self.local.parked_keys(is_async=True)
        return self._skip_waiting(lambda prep: prep.key not in parked and prep.claimed.queue in queues)

    def _skip_waiting(self, chosen: Callable[[Prepared], bool]) -> list[Prepared]:
        """Waiting tasks `chosen` picks, not started: marked to skip when their turn comes."""
        taken = []
        for key, prep in list(self.waiting_preps.items()):
            if chosen(prep) and self.tracker.mark_skip(key, SKIPPED):
                self.waiting_preps.pop(key, None)
                taken.append(prep)
        return taken

    def stop(self) -> None:
        self.stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
