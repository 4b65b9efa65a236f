"""The worker loop: claim, hand over, complete, renew leases, rescue.

All queue bookkeeping happens on this (main) thread over the worker's own connection. Task
bodies run in ox.executor and report back through one queue, which is also what the loop
sleeps on: a finished task wakes it at once, and so does a stop request. Everything in
flight is keyed by the claim (task id, fence): after a rescue a worker may hold an old and
a new run of the same task.
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
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from ox import clock, ending, sql, upkeep
from ox.backend import OxBackend
from ox.claims import Claims, Held
from ox.completer import Completer
from ox.connection import IDLE_LIMIT, open_worker_connection
from ox.db import driver
from ox.duties import Duty, worker_duties
from ox.enqueue import database_for
from ox.exceptions import TaskCancelled, TaskTimeout
from ox.execution import Finished
from ox.executor import SKIPPED, AsyncExecutor, Key, SyncExecutor
from ox.flow.keeper import SlotKeeper
from ox.flow.local import LocalLimits
from ox.flow.watch import FlowWatch
from ox.idle import IdleMark
from ox.leases import Leases
from ox.listener import Listener
from ox.logs import event
from ox.prefetch import Prefetch

logger = logging.getLogger("ox.worker")

_WAKE = object()  # a stop request
_NOTIFIED = object()  # the listener says tasks were enqueued
_STARTED = object()  # a task body started: its start is written with the next heartbeat
START_MARK_DELAY = 0.5  # seconds: the heartbeat comes at most this long after a body starts


@dataclass
class WorkerSettings:
    queues: list[str]
    concurrency: int = 1
    async_concurrency: int = 100
    batch: bool = False
    max_tasks: int | None = None
    poll_interval: float | None = None  # None: the backend's POLL_INTERVAL


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
        # 0: no liveness lock. Behind a transaction pooler a session lock would stay with the
        # pooler's server connection, not this worker's life; rescue waits for the lease.
        self.lock_key = 0 if self.options.pooled else random.randint(1, 2**31 - 1)  # noqa: S311
        self.poll_interval = settings.poll_interval or self.options.poll_interval
        self.sender = type(backend)
        self.outcomes: queue.Queue[Any] = queue.Queue()
        self.completer = Completer(self.id, self.options, self.sender)
        self.prefetch = Prefetch(self.options.prefetch, self.options.prefetch_window)
        self.held: dict[Key, Held] = {}
        self.to_hand_back: list[Key] = []  # claims that could not be handed to an executor
        self.prefetch_hold = False  # prefetched tasks were given back: claim for free slots only
        self.gave_back = False  # a claim had to give tasks back: claim again once a slot frees
        self.claimed_total = 0
        self.claim_rounds = 0  # claims made (the stop event reports it: waiting must not poll)
        self.stopping = False
        self.stop_deadline: float | None = None
        self.stuck = False
        self.async_seen = False
        self.next_async_probe = 0.0  # monotonic: when to look for async tasks again
        self.more_waiting = True  # the last claim got all it asked for
        self.next_poll = 0.0
        self.next_heartbeat = 0.0
        self.next_rescue = 0.0
        self.reconnected_at = -1e9  # monotonic: the rescuer waits LIVENESS_GRACE after a reconnect
        self.reconnected = False  # outcomes held in memory are written before anything else
        self.last_claim_at = 0.0
        self.duties: list[tuple[Duty, list[float]]] = []  # (duty, [next run, monotonic])
        self.conn: Any = None
        self.sync: SyncExecutor | None = None
        self.aio: AsyncExecutor | None = None
        self.listener: Listener | None = None
        self.leases = Leases(self)
        self.claims = Claims(self)
        self.flow = FlowWatch(self.options.queue_limits(), list(settings.queues))
        self.local = LocalLimits()  # slotted queues: how many of each may run here at once
        self.slots = SlotKeeper(self.id, self.local, self._resume, self._give_back_parked)
        self.idle = IdleMark(self)
        self.notified = threading.Event()  # a wake-up from the listener is already queued
        self.state_notified = threading.Event()  # one may say a queue's state changed
        self.start_seen = threading.Event()  # a _STARTED is already queued

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
            while not ending.done(self):
                self._cycle()
        finally:
            code = ending.finish(self)
        return code

    def _start(self) -> None:
        # A database that drops the connection while the worker boots (a restart, a
        # terminated backend) delays the start; it does not end the worker.
        delay = 0.2
        for _try in range(1_000_000):
            try:
                if self.conn is not None:
                    self._close_quietly()
                self._connect()
                self._register()
                break
            except (OperationalError, InterfaceError) as exc:
                if self.stopping:
                    raise
                event(logger, logging.WARNING, f"database error while starting, retrying: {exc}", worker=self.id)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        # The main thread's own Django connection is not needed again: do not hold it open.
        connections[self.alias].close()
        self.duties = [(duty, [0.0]) for duty in worker_duties(self)]
        self.sync = SyncExecutor(
            self.settings.concurrency, self.sender, self.outcomes, self.options, self._on_start, self.local
        )
        self.aio = AsyncExecutor(
            self.settings.async_concurrency, self.sender, self.outcomes, self.options, self._on_start, self.local
        )
        self.sync.route = self.aio.route = self._resume
        listen_alias = self.options.listen_alias(self.alias)
        if listen_alias is not None and Listener.available(listen_alias):
            self.listener = Listener(
                listen_alias, self._on_notify, self.settings.queues, self.lock_key, on_enqueue=self._on_enqueue
            )
            self.listener.start()
        event(
            logger,
            logging.INFO,
            "worker started",
            queues=",".join(self.settings.queues),
            concurrency=self.settings.concurrency,
            worker=self.id,
        )

    def _close_quietly(self) -> None:
        try:
            self.conn.close()
        except DatabaseError:
            pass

    def _register(self) -> None:
        sql.register_worker(
            self.conn,
            sql.WorkerRow(
                id=self.id,
                host=socket.gethostname(),
                pid=os.getpid(),
                queues=self.settings.queues,
                concurrency=self.settings.concurrency,
                lock_key=self.lock_key if driver(self.conn).session_locks else 0,
                now=clock.db_now(self.conn),
            ),
        )

    def _on_enqueue(self) -> None:
        self._on_notify(enqueued=True)

    def _on_notify(self, enqueued: bool = False) -> None:
        # Called from the listener thread; a burst of enqueues queues one wake-up, not many.
        if not enqueued:
            self.state_notified.set()  # before the wake-up: the loop reads it after its clear
        if not self.notified.is_set():
            self.notified.set()
            self.outcomes.put(_NOTIFIED)

    def _resume(self, preps: list) -> None:
        """Parked tasks of slotted queues that may start now: to their executors."""
        for executor, is_async in ((self.sync, False), (self.aio, True)):
            mine = [p for p in preps if p.is_async == is_async]
            if mine and executor is not None:
                executor.resume(mine)

    def _give_back_parked(self, preps: list) -> None:
        """Parked tasks that must not start here after all: back to READY, unstarted."""
        self.to_hand_back.extend(p.key for p in preps if p.key not in self.to_hand_back)

    def _on_start(self) -> None:
        # Called from a task thread or the event loop as a body starts.
        if not self.start_seen.is_set():
            self.start_seen.set()
            self.outcomes.put(_STARTED)

    def _connect(self) -> None:
        # The session is never silent for longer than a heartbeat: a server-side idle limit
        # well above that ends it only when the worker is gone or cut off (ox.connection).
        idle = max(IDLE_LIMIT, 10 * self.options.heartbeat)
        self.conn = open_worker_connection(self.alias, pooled=self.options.pooled, idle_limit=idle)
        if self.lock_key:
            sql.hold_worker_lock(self.conn, self.lock_key)

    # ---------------------------------------------------------------- the loop
    def _cycle(self) -> None:
        self._collect(self._wait_time())
        self._guard(self._maintain)
        if self.stopping or self.stuck or self.to_hand_back:
            self._guard(self._hand_back)
        if self._may_claim():
            self._guard(self.claims.claim)
        elif self.completer.due(idle=not self.held):
            self._guard(lambda: self.completer.flush(self.conn))
            # A workflow task's end may have made its followers READY: claim them now.
            self.more_waiting = self.completer.take_followed() or self.more_waiting

    def _guard(self, step: Any) -> None:
        """Nothing a step meets ends the worker: a lost connection (a restart, a terminated
        backend, a locked SQLite file) means reconnect with backoff and carry on, keeping
        unwritten outcomes; anything else is logged and the step tried again shortly."""
        try:
            step()
        except (OperationalError, InterfaceError) as exc:
            self._reconnect(exc)
        except Exception:  # noqa: BLE001
            message = "a worker step failed; retrying shortly"
            event(logger, logging.ERROR, message, exc_info=True, worker=self.id)
            time.sleep(0.5)

    def _reconnect(self, exc: Exception) -> None:
        reason = str(exc).replace("\n", " ")
        event(logger, logging.WARNING, f"database error, reconnecting: {reason}", worker=self.id)
        delay = 0.2
        while True:
            if self.conn is not None:
                self._close_quietly()
            try:
                self._connect()
                clock.forget(self.conn)  # the server may be another one now (a failover)
                self.reconnected, self.reconnected_at = True, time.monotonic()
                event(logger, logging.INFO, "reconnected", worker=self.id)
                return
            except (OperationalError, InterfaceError):
                if self.stopping and time.monotonic() >= (self.stop_deadline or 0):
                    raise
                time.sleep(delay)
                # At most a second apart: after a server restart every worker should be back
                # within the liveness grace of the first, or its tasks are taken for lost.
                delay = min(delay * 2, 1.0)

    def _may_claim(self) -> bool:
        if self.stopping or self.stuck or max(self.claims.limits()) <= 0:
            return False
        return self.more_waiting or time.monotonic() >= self.next_poll

    def _wait_time(self) -> float:
        if self._may_claim() or self.completer.failures or self.to_hand_back:
            return 0.0
        deadlines = [self.next_heartbeat, self.next_rescue, *(nxt[0] for _duty, nxt in self.duties)]
        if not self.more_waiting:
            deadlines.append(self.next_poll)
        if self.completer.successes:
            deadlines.append(time.monotonic() if not self.held else (self.completer.flush_due or 0))
        deadlines.extend(self.leases.deadlines())
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
                self.idle.woken = True
                self.more_waiting = True
                self.next_async_probe = 0.0  # what was enqueued may be async
                state = self.state_notified.is_set()
                if state:  # one set after this look queues a wake-up of its own
                    self.state_notified.clear()
                self.flow.woken(state)
                if min(self.claims.limits(probe=False)) == 0:
                    self.idle.notified_while_full = True  # claim again as soon as a slot frees
            elif item is _STARTED:
                self.start_seen.clear()
                self.next_heartbeat = min(self.next_heartbeat, time.monotonic() + START_MARK_DELAY)
            elif item is not _WAKE:
                self._record(item)
            try:
                item = self.outcomes.get_nowait()
            except queue.Empty:
                return

    def _record(self, finished: Finished) -> None:
        held = self.held.pop(finished.key, None)
        if finished.kind == SKIPPED or held is None:
            return
        if finished.started_at is not None:
            seconds = (finished.finished_at - finished.started_at).total_seconds()
            self.prefetch.observe(finished.claimed.task_path, seconds)
        if held.prep is None or not held.prep.is_async:
            self.prefetch_hold = False  # a slot is free: claim for it (and prefetch) again
        if self.gave_back:
            self.gave_back, self.more_waiting = False, True
        if self.flow.freed(finished.claimed.queue):
            self.more_waiting = True  # the limit that held its queue back has room now
        if not self.flow.rate_held(time.time()):
            self.idle.slot_freed()
            is_async = held.prep.is_async if held.prep is not None else held.claimed.is_async
            if self.claims.full[is_async]:
                self.more_waiting = True  # its kind's last claim got all it asked for
        self.completer.add(finished)
        if len(self.completer.successes) >= self.options.completion_batch:
            self._guard(lambda: self.completer.flush(self.conn))

    # ---------------------------------------------------------------- leases, rescue, duties
    def _maintain(self) -> None:
        upkeep.maintain(self)

    def _hand_back(self) -> None:
        upkeep.hand_back(self)

    def interrupt(self, key: Key, exc_type: type[TaskCancelled] | type[TaskTimeout]) -> None:
        held = self.held.get(key)
        if held is None or held.interrupted_at is not None or held.prep is None:
            return
        executor = self.aio if held.prep.is_async else self.sync
        assert executor is not None
        if executor.interrupt(key, exc_type, held.prep):
            held.interrupted_at = time.monotonic()
