"""The worker loop: claim, hand over, complete, renew leases, rescue.

All queue bookkeeping happens on this (main) thread over the worker's own connection. Task
bodies run in ox.executor and report back through one queue, which is also what the loop
sleeps on: a finished task wakes it at once, and so does a stop request.
"""

import logging
import os
import queue
import random
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.tasks.base import TaskError
from django.utils import timezone

from ox import sql
from ox.backend import OxBackend
from ox.completer import Completer
from ox.connection import open_worker_connection
from ox.duties import Duty, worker_duties
from ox.enqueue import database_for
from ox.exceptions import TaskCancelled, TaskTimeout
from ox.execution import Finished, Prepared, prepare
from ox.executor import SKIPPED, AsyncExecutor, SyncExecutor
from ox.listener import Listener
from ox.logs import event, task_fields
from ox.models import Attempt
from ox.models import Worker as WorkerRow
from ox.prefetch import Prefetch

logger = logging.getLogger("ox.worker")

EXIT_OK = 0
EXIT_LEFT_BEHIND = 1
EXIT_STUCK = 3
_WAKE = object()  # a stop request
_NOTIFIED = object()  # PostgreSQL says tasks were enqueued


@dataclass
class WorkerSettings:
    queues: list[str]
    concurrency: int = 1
    async_concurrency: int = 100
    batch: bool = False
    max_tasks: int | None = None
    poll_interval: float | None = None  # None: the backend's POLL_INTERVAL


@dataclass
class Held:
    """A task this worker holds a lease on: handed to an executor, started or not."""

    prep: Prepared
    interrupted_at: float | None = None  # monotonic
    lost: bool = False


class Worker:
    def __init__(self, backend: OxBackend, settings: WorkerSettings) -> None:
        self.backend = backend
        self.options = backend.config
        self.settings = settings
        unknown = sorted(set(settings.queues) - backend.queues) if backend.queues else []
        if unknown:
            raise ValueError(f"Queues not configured for backend {backend.alias!r}: {', '.join(unknown)}")
        self.alias = database_for(backend)
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lock_key = random.randint(1, 2**31 - 1)  # noqa: S311
        self.poll_interval = settings.poll_interval or self.options.poll_interval
        self.sender = type(backend)
        self.outcomes: queue.Queue[Any] = queue.Queue()
        self.completer = Completer(self.id, self.options, self.sender)
        self.prefetch = Prefetch(self.options.prefetch, self.options.prefetch_window)
        self.held: dict[uuid.UUID, Held] = {}
        self.claimed_total = 0
        self.stopping = False
        self.stop_deadline: float | None = None
        self.stuck = False
        self.async_seen = False
        self.more_waiting = True  # the last claim got all it asked for
        self.next_poll = 0.0
        self.next_heartbeat = 0.0
        self.next_rescue = 0.0
        self.last_claim_at = 0.0
        self.duties: list[tuple[Duty, list[float]]] = []  # (duty, [next run, monotonic])
        self.conn: Any = None
        self.sync: SyncExecutor | None = None
        self.aio: AsyncExecutor | None = None
        self.listener: Listener | None = None
        self.notified = threading.Event()  # a wake-up from the listener is already queued

    # ---------------------------------------------------------------- life cycle
    def request_stop(self) -> None:
        """First SIGTERM/SIGINT: stop claiming, let in-flight tasks finish within the grace."""
        if not self.stopping:
            self.stopping = True
            self.stop_deadline = time.monotonic() + self.options.shutdown_grace
            # Wake the loop from a fresh thread: a signal handler must not block on the
            # queue's lock, which the interrupted main thread may hold.
            threading.Thread(target=self.outcomes.put, args=(_WAKE,), daemon=True).start()

    def run(self) -> int:
        self._start()
        try:
            while not self._done():
                self._cycle()
        finally:
            code = self._finish()
        return code

    def _start(self) -> None:
        self._connect()
        now = timezone.now()
        WorkerRow.objects.using(self.alias).create(
            id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=self.settings.queues,
            concurrency=self.settings.concurrency,
            lock_key=self.lock_key if sql.is_postgres(self.conn) else 0,
            started_at=now,
            heartbeat_at=now,
        )
        self.duties = [(duty, [0.0]) for duty in worker_duties(self)]
        self.sync = SyncExecutor(self.settings.concurrency, self.sender, self.outcomes)
        self.aio = AsyncExecutor(self.settings.async_concurrency, self.sender, self.outcomes)
        if self.options.notify and Listener.available(self.alias):
            self.listener = Listener(self.alias, self._on_notify)
            self.listener.start()
        event(
            logger,
            logging.INFO,
            "worker started",
            queues=",".join(self.settings.queues),
            concurrency=self.settings.concurrency,
            worker=self.id,
        )

    def _on_notify(self) -> None:
        # Called from the listener thread; a burst of enqueues queues one wake-up, not many.
        if not self.notified.is_set():
            self.notified.set()
            self.outcomes.put(_NOTIFIED)

    def _connect(self) -> None:
        # The main thread's Django connection (used for rare ORM reads) may be broken too.
        connections[self.alias].close_if_unusable_or_obsolete()
        self.conn = open_worker_connection(self.alias)
        sql.hold_worker_lock(self.conn, self.lock_key)

    def _done(self) -> bool:
        busy = bool(self.held or self.completer)
        if self.stopping:
            return not busy or time.monotonic() >= (self.stop_deadline or 0)
        if self.stuck:
            return not self.completer and all(h.interrupted_at for h in self.held.values())
        if self.settings.max_tasks is not None and self.claimed_total >= self.settings.max_tasks and not busy:
            return True
        if self.settings.batch and not busy and not self.more_waiting:
            # ...and the last claim came after the retries this worker scheduled were due.
            return self.last_claim_at >= self.completer.retry_due
        return False

    def _finish(self) -> int:
        try:
            self._guard(self._hand_back)
            self._guard(lambda: self.completer.flush(self.conn))
            WorkerRow.objects.using(self.alias).filter(id=self.id).update(stopped_at=timezone.now())
        except DatabaseError as exc:
            event(logger, logging.ERROR, f"worker could not record its stop: {exc}", worker=self.id)
        left = [h.prep.claimed for h in self.held.values()]
        for part in (self.sync, self.aio, self.listener):
            if part is not None:
                part.stop()
        for claimed in left:
            message = "worker left a task running; the rescuer will take it back"
            event(logger, logging.WARNING, message, **task_fields(claimed), worker=self.id)
        if self.conn is not None:
            self.conn.close()
        code = EXIT_STUCK if self.stuck else EXIT_LEFT_BEHIND if left else EXIT_OK
        event(logger, logging.INFO, "worker stopped", claimed=self.claimed_total, exit_code=code, worker=self.id)
        return code

    # ---------------------------------------------------------------- the loop
    def _cycle(self) -> None:
        self._collect(self._wait_time())
        self._guard(self._maintain)
        if self.stopping or self.stuck:
            self._guard(self._hand_back)
        if self._may_claim():
            self._guard(self._claim)
        elif self.completer.due(idle=not self.held):
            self._guard(lambda: self.completer.flush(self.conn))

    def _guard(self, step: Any) -> None:
        """Database faults (a restart, a terminated backend, a locked SQLite file) never end
        the worker: reconnect with backoff and carry on; unwritten outcomes are kept."""
        try:
            step()
        except (OperationalError, InterfaceError) as exc:
            self._reconnect(exc)
        except DatabaseError:
            # Not a lost connection: a statement the database refused. Log it and pause
            # rather than spin; the outcome stays queued and is tried again.
            event(
                logger, logging.ERROR, "database refused a statement; retrying shortly", exc_info=True, worker=self.id
            )
            time.sleep(1.0)

    def _reconnect(self, exc: Exception) -> None:
        reason = str(exc).replace("\n", " ")
        event(logger, logging.WARNING, f"database error, reconnecting: {reason}", worker=self.id)
        delay = 0.2
        while True:
            try:
                if self.conn is not None:
                    self.conn.close()
            except DatabaseError:
                pass
            try:
                self._connect()
                event(logger, logging.INFO, "reconnected", worker=self.id)
                return
            except (OperationalError, InterfaceError):
                if self.stopping and time.monotonic() >= (self.stop_deadline or 0):
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _counts(self) -> tuple[int, int]:
        async_held = sum(1 for h in self.held.values() if h.prep.is_async)
        return len(self.held) - async_held, async_held

    def _claim_size(self) -> int:
        """How many tasks to ask for: free slots plus a prefetch sized to how short tasks
        are. Async slots count once this worker has seen async tasks (a task's kind is
        known only once claimed), so a sync worker never claims 100 tasks for 1 thread."""
        sync_held, async_held = self._counts()
        extra = self.prefetch.size()
        want = max(self.settings.concurrency + extra - sync_held, 0)
        if self.async_seen:
            want += max(self.settings.async_concurrency + extra - async_held, 0)
        if self.settings.max_tasks is not None:
            want = min(want, self.settings.max_tasks - self.claimed_total)
        # Refill early, before the prefetched tasks run out, but not one task at a time.
        idle_slot = sync_held < self.settings.concurrency or (self.async_seen and async_held == 0)
        return want if idle_slot or want >= max(extra // 2, 1) else 0

    def _may_claim(self) -> bool:
        if self.stopping or self.stuck or self._claim_size() <= 0:
            return False
        return self.more_waiting or time.monotonic() >= self.next_poll

    def _wait_time(self) -> float:
        if self._may_claim() or self.completer.failures:
            return 0.0
        deadlines = [self.next_heartbeat, self.next_rescue, *(nxt[0] for _duty, nxt in self.duties)]
        if not self.more_waiting:
            deadlines.append(self.next_poll)
        if self.completer.successes:
            deadlines.append(time.monotonic() if not self.held else (self.completer.flush_due or 0))
        deadlines.extend(self._deadlines())
        if self.stop_deadline is not None:
            deadlines.append(self.stop_deadline)
        return max(0.0, min(deadlines) - time.monotonic())

    def _collect(self, timeout: float) -> None:
        try:
            item = self.outcomes.get(timeout=timeout) if timeout > 0 else self.outcomes.get_nowait()
        except queue.Empty:
            return
        while True:
            if item is _NOTIFIED:
                self.notified.clear()
                self.more_waiting = True
            elif item is not _WAKE:
                self._record(item)
            try:
                item = self.outcomes.get_nowait()
            except queue.Empty:
                return

    def _claim(self) -> None:
        want = self._claim_size()
        now = timezone.now()
        lease = now + timedelta(seconds=self.options.lease)
        self.last_claim_at = time.monotonic()
        # Finished tasks ride on the claim: one round trip, one commit for both.
        self.completer.flush_failures(self.conn)
        done = self.completer.take_successes()
        written, claimed = sql.complete_and_claim(self.conn, done, self.id, self.settings.queues, want, now, lease)
        if done:
            self.completer.written(written)
        self.claimed_total += len(claimed)
        self.more_waiting = len(claimed) == want
        if not self.more_waiting:
            self._schedule_poll()
        for c in claimed:
            history = self._history(c) if c.attempts > 1 else ([], [])
            prep = prepare(c, self.backend.alias, self.id, history, self.options.timeout_for(c.queue, None))
            if isinstance(prep, Finished):
                self.completer.add(prep)
                continue
            self.async_seen = self.async_seen or prep.is_async
            self.held[c.id] = Held(prep)
        self._hand_over([self.held[c.id].prep for c in claimed if c.id in self.held])

    def _schedule_poll(self) -> None:
        """Sleep until the next poll, or until the earliest scheduled task is due."""
        wait = self.poll_interval
        earliest = sql.earliest_ready(self.conn, self.settings.queues)
        if earliest is not None:
            wait = min(wait, max((earliest - timezone.now()).total_seconds(), 0.001))
        retry_in = self.completer.retry_due - time.monotonic()
        if retry_in > 0:  # a retry this worker scheduled comes due sooner
            wait = min(wait, retry_in)
        self.next_poll = time.monotonic() + wait

    def _hand_over(self, preps: list[Prepared]) -> None:
        """Give claimed tasks to their executor, keeping no more of a kind than its slots plus
        the prefetch: the rest go straight back, so one worker never hoards what another
        could run now."""
        assert self.sync is not None and self.aio is not None
        extra = self.prefetch.size()
        sync_held, async_held = self._counts()
        room = {
            False: self.settings.concurrency + extra - (sync_held - sum(1 for p in preps if not p.is_async)),
            True: self.settings.async_concurrency + extra - (async_held - sum(1 for p in preps if p.is_async)),
        }
        excess = []
        for prep in preps:
            if room[prep.is_async] > 0:
                room[prep.is_async] -= 1
                (self.aio if prep.is_async else self.sync).submit(prep)
            else:
                excess.append(prep)
        if excess:
            for prep in excess:
                del self.held[prep.claimed.id]
            sql.hand_back(self.conn, [(p.claimed.id, p.claimed.fence) for p in excess])
            self.claimed_total -= len(excess)
            self.more_waiting = True

    def _history(self, claimed: Any) -> tuple[list[TaskError], list[str]]:
        """Earlier attempts of a retried task, so its context and signals see them."""
        attempts = list(Attempt.objects.using(self.alias).filter(task_id=claimed.id).order_by("number", "id"))
        return (
            [TaskError(exception_class_path=a.exception_class_path, traceback=a.traceback) for a in attempts],
            [a.worker_id for a in attempts],
        )

    def _record(self, finished: Finished) -> None:
        held = self.held.pop(finished.claimed.id, None)
        if finished.kind == SKIPPED or held is None:
            return
        self.prefetch.observe((finished.finished_at - finished.started_at).total_seconds())
        self.completer.add(finished)
        if len(self.completer.successes) >= self.options.completion_batch:
            self._guard(lambda: self.completer.flush(self.conn))

    # ---------------------------------------------------------------- leases, rescue, timeouts
    def _maintain(self) -> None:
        now = time.monotonic()
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.options.heartbeat
            self._heartbeat()
        if now >= self.next_rescue:
            self.next_rescue = now + self.options.rescue_interval
            rescued = sql.rescue(self.conn, timezone.now(), self.options.max_lost)
            if rescued:
                self.more_waiting = True  # claim them now rather than at the next poll
            for task_id, worker_id, status in rescued:
                event(
                    logger,
                    logging.WARNING,
                    "rescued a lost task",
                    task_id=task_id,
                    lost_worker=worker_id,
                    status=status,
                    worker=self.id,
                )
        self._enforce_timeouts(now)
        for duty, next_run in self.duties:
            if now >= next_run[0]:
                next_run[0] = now + duty.interval
                try:
                    duty.run(self.conn, timezone.now())
                except (OperationalError, InterfaceError):
                    raise
                except Exception as exc:  # noqa: BLE001  (a duty's bug must not stop the tasks)
                    event(logger, logging.ERROR, f"duty {duty.name} failed: {exc!r}", worker=self.id)

    def _heartbeat(self) -> None:
        now = timezone.now()
        sql.heartbeat(self.conn, self.id, now)
        held = [(task_id, h.prep.claimed.fence) for task_id, h in self.held.items() if not h.lost]
        kept = sql.renew(self.conn, held, now + timedelta(seconds=self.options.lease))
        for task_id, _fence in held:
            if task_id not in kept:
                self._lost(task_id)
            elif kept[task_id]:
                self._interrupt(task_id, TaskCancelled)

    def _executor(self, task_id: uuid.UUID) -> SyncExecutor | AsyncExecutor:
        assert self.sync is not None and self.aio is not None
        return self.aio if self.held[task_id].prep.is_async else self.sync

    def _lost(self, task_id: uuid.UUID) -> None:
        held = self.held[task_id]
        held.lost = True
        if not self._executor(task_id).forget(task_id):
            message = "lease lost while running; the outcome will be fenced out"
            event(logger, logging.WARNING, message, **task_fields(held.prep.claimed), worker=self.id)

    def _interrupt(self, task_id: uuid.UUID, exc_type: type[TaskCancelled] | type[TaskTimeout]) -> None:
        held = self.held.get(task_id)
        if held is None or held.interrupted_at is not None:
            return
        if self._executor(task_id).interrupt(task_id, exc_type):
            held.interrupted_at = time.monotonic()

    def _deadlines(self) -> list[float]:
        """When a running sync task times out, or outlives its interrupt (the event loop
        enforces async timeouts itself)."""
        assert self.sync is not None
        out = []
        for task_id, held in self.held.items():
            if held.interrupted_at is not None:
                out.append(held.interrupted_at + self.options.interrupt_grace)
            elif held.prep.timeout and not held.prep.is_async:
                started = self.sync.started_at(task_id)
                if started is not None:
                    out.append(started + held.prep.timeout)
        return out

    def _enforce_timeouts(self, now: float) -> None:
        assert self.sync is not None
        for task_id, held in list(self.held.items()):
            if held.interrupted_at is not None:
                started = self._executor(task_id).started_at(task_id)
                if started is not None and not self.stuck and now - held.interrupted_at > self.options.interrupt_grace:
                    self.stuck = True
                    message = "task ignored its interrupt; the worker stops claiming and will exit"
                    event(logger, logging.ERROR, message, **task_fields(held.prep.claimed), worker=self.id)
            elif held.prep.timeout and not held.prep.is_async:
                started = self.sync.started_at(task_id)
                if started is not None and now >= started + held.prep.timeout:
                    self._interrupt(task_id, TaskTimeout)

    def _hand_back(self) -> None:
        """Claimed tasks that have not started go back to READY without spending an attempt."""
        taken = [p for executor in (self.sync, self.aio) if executor is not None for p in executor.take_back()]
        for prep in taken:
            self.held.pop(prep.claimed.id, None)
        if taken:
            count = sql.hand_back(self.conn, [(p.claimed.id, p.claimed.fence) for p in taken])
            event(logger, logging.INFO, "handed back claimed tasks that had not started", count=count, worker=self.id)
