"""Where claimed tasks run: a pool of threads for sync tasks, one event loop for async ones.

Both take every claimed task at once (the prefetched ones wait in their inbox) and report
each outcome to the worker's outcome queue. A task not yet started can be skipped (it was
cancelled, or its lease was lost) or taken back (shutdown) without ever running.
"""

import asyncio
import queue
import threading
import time
import uuid
from typing import Any

from django.utils import timezone

from ox.exceptions import TaskCancelled, TaskInterrupt
from ox.execution import AsyncRunner, Finished, Prepared, run_sync
from ox.interrupt import Interrupter
from ox.models import Outcome

SKIPPED = "skipped"  # an outcome kind with nothing to write: the lease is no longer ours


def skipped(prep: Prepared, kind: str) -> Finished:
    now = timezone.now()
    if kind == Outcome.CANCELLED:
        return Finished(
            claimed=prep.claimed,
            kind=Outcome.CANCELLED,
            started_at=now,
            finished_at=now,
            exception_class_path="ox.exceptions.TaskCancelled",
            traceback="ox.exceptions.TaskCancelled: cancelled before it started\n",
            task=prep.task,
            result=prep.result,
        )
    return Finished(claimed=prep.claimed, kind=SKIPPED, started_at=now, finished_at=now)


class _Tracker:
    """Which handed-over tasks have started; skip marks for those that have not."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: dict[uuid.UUID, float] = {}  # task id -> monotonic start
        self.skip: dict[uuid.UUID, str] = {}

    def begin(self, task_id: uuid.UUID) -> str | None:
        """Mark started, unless a skip was asked for first (returns its kind)."""
        with self.lock:
            kind = self.skip.pop(task_id, None)
            if kind is None:
                self.started[task_id] = time.monotonic()
            return kind

    def end(self, task_id: uuid.UUID) -> None:
        with self.lock:
            self.started.pop(task_id, None)

    def mark_skip(self, task_id: uuid.UUID, kind: str) -> bool:
        """Skip a task that has not started; False if it already runs."""
        with self.lock:
            if task_id in self.started:
                return False
            self.skip[task_id] = kind
            return True


class _Executor:
    """What both executors share: which tasks started, and stopping one by its id."""

    tracker: _Tracker

    def started_at(self, task_id: uuid.UUID) -> float | None:
        return self.tracker.started.get(task_id)

    def interrupt(self, task_id: uuid.UUID, exc_type: type[TaskInterrupt]) -> bool:
        """Interrupt a running task, or make an unstarted one skip (cancelled)."""
        if self.tracker.mark_skip(task_id, Outcome.CANCELLED if exc_type is TaskCancelled else SKIPPED):
            return True
        return self._interrupt_running(task_id, exc_type)

    def _interrupt_running(self, task_id: uuid.UUID, exc_type: type[TaskInterrupt]) -> bool:
        raise NotImplementedError

    def forget(self, task_id: uuid.UUID) -> bool:
        """The lease was lost: skip the task if it has not started."""
        return self.tracker.mark_skip(task_id, SKIPPED)


class SyncExecutor(_Executor):
    def __init__(self, threads: int, sender: type, outcomes: "queue.Queue[Any]") -> None:
        self.inbox: queue.Queue[Prepared | None] = queue.Queue()
        self.outcomes = outcomes
        self.sender = sender
        self.interrupter = Interrupter()
        self.tracker = _Tracker()
        self.threads = [threading.Thread(target=self._loop, name=f"ox-task-{i}", daemon=True) for i in range(threads)]
        for thread in self.threads:
            thread.start()

    def submit(self, prep: Prepared) -> None:
        self.inbox.put(prep)

    def _loop(self) -> None:
        while True:
            prep = self.inbox.get()
            if prep is None:
                return
            task_id = prep.claimed.id
            kind = self.tracker.begin(task_id)
            if kind is not None:
                self.outcomes.put(skipped(prep, kind))
                continue
            try:
                finished = run_sync(prep, self.interrupter, self.sender)
            finally:
                self.tracker.end(task_id)
            self.outcomes.put(finished)

    def _interrupt_running(self, task_id: uuid.UUID, exc_type: type[TaskInterrupt]) -> bool:
        return self.interrupter.interrupt(task_id, exc_type)

    def take_back(self) -> list[Prepared]:
        """Everything still waiting in the inbox (shutdown hands these back)."""
        taken: list[Prepared] = []
        while True:
            try:
                prep = self.inbox.get_nowait()
            except queue.Empty:
                return taken
            if prep is not None:
                taken.append(prep)

    def stop(self) -> None:
        for _ in self.threads:
            self.inbox.put(None)


class AsyncExecutor(_Executor):
    def __init__(self, concurrency: int, sender: type, outcomes: "queue.Queue[Any]") -> None:
        self.loop = asyncio.new_event_loop()
        self.runner = AsyncRunner(self.loop)
        self.sender = sender
        self.outcomes = outcomes
        self.tracker = _Tracker()
        self.waiting: dict[uuid.UUID, Prepared] = {}  # handed over, not started
        self.slots: asyncio.Semaphore | None = None
        self.concurrency = concurrency
        threading.Thread(target=self.loop.run_forever, name="ox-async", daemon=True).start()

    async def _run(self, prep: Prepared) -> None:
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.concurrency)
        task_id = prep.claimed.id
        async with self.slots:
            self.waiting.pop(task_id, None)
            kind = self.tracker.begin(task_id)
            if kind is not None:
                self.outcomes.put(skipped(prep, kind))
                return
            try:
                finished = await self.runner.run(prep, self.sender)
            finally:
                self.tracker.end(task_id)
            self.outcomes.put(finished)

    def submit(self, prep: Prepared) -> None:
        self.waiting[prep.claimed.id] = prep
        asyncio.run_coroutine_threadsafe(self._run(prep), self.loop)

    def _interrupt_running(self, task_id: uuid.UUID, exc_type: type[TaskInterrupt]) -> bool:
        return self.runner.interrupt(task_id, exc_type)

    def take_back(self) -> list[Prepared]:
        taken = []
        for task_id, prep in list(self.waiting.items()):
            if self.tracker.mark_skip(task_id, SKIPPED):
                taken.append(prep)
        return taken

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
