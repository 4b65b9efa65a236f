"""The worker loop: claim, dispatch, complete, renew leases, rescue. All queue bookkeeping
happens on this (main) thread over the worker's own connection; task bodies run in a thread
pool (sync) or on one event loop (async) and report back through a queue, which is also
what the loop sleeps on, so a freed slot wakes it at once."""

import asyncio
import json
import logging
import os
import queue
import random
import socket
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.tasks import TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished
from django.utils import timezone

from ox import sql
from ox.backend import OxBackend
from ox.backoff import retry_delay
from ox.connection import open_worker_connection
from ox.duties import Duty, worker_duties
from ox.enqueue import database_for
from ox.exceptions import TaskCancelled, TaskTimeout
from ox.execution import SUCCESSFUL, AsyncRunner, Finished, Prepared, prepare, run_sync
from ox.interrupt import Interrupter
from ox.models import Attempt, Outcome
from ox.models import Worker as WorkerRow

logger = logging.getLogger("ox.worker")

EXIT_OK = 0
EXIT_LEFT_BEHIND = 1
EXIT_STUCK = 3
_WAKE = object()


@dataclass
class WorkerSettings:
    queues: list[str]
    concurrency: int = 1
    async_concurrency: int = 100
    batch: bool = False
    max_tasks: int | None = None
    poll_interval: float | None = None  # None: the backend's POLL_INTERVAL


@dataclass
class Running:
    prep: Prepared
    deadline: float | None  # monotonic
    interrupted_at: float | None = None
    lost: bool = False


@dataclass
class Stats:
    claimed: int = 0
    finished: int = 0
    fenced_out: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


def _log(level: int, message: str, claimed: Any = None, worker: str = "", **fields: Any) -> None:
    if claimed is not None:
        fields = {
            "task_id": claimed.id,
            "task": claimed.task_path,
            "queue": claimed.queue,
            "attempt": claimed.attempts,
            **fields,
        }
    if worker:
        fields["worker"] = worker
    suffix = " ".join(f"{k}={v}" for k, v in fields.items())
    logger.log(level, f"{message} {suffix}".rstrip(), extra={f"ox_{k}": v for k, v in fields.items()})


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
        self.outcomes: queue.Queue[Any] = queue.Queue()
        self.interrupter = Interrupter()
        self.buffer: deque[Prepared] = deque()
        self.running: dict[uuid.UUID, Running] = {}
        self.to_complete: list[Finished] = []
        self.to_fail: list[Finished] = []  # kept until written, across database faults
        self.flush_due: float | None = None
        self.stats = Stats()
        self.stopping = False
        self.stop_deadline: float | None = None
        self.stuck = False
        self.more_waiting = True  # the last claim filled every slot asked for
        self.next_poll = 0.0
        self.next_heartbeat = 0.0
        self.next_rescue = 0.0
        self.batch_hold_until = 0.0  # batch mode waits for the retries it scheduled
        self.last_claim_at = 0.0
        self.async_seen = False
        self.conn: Any = None
        self.pool: ThreadPoolExecutor | None = None
        self.async_loop: asyncio.AbstractEventLoop | None = None
        self.async_runner: AsyncRunner | None = None
        self.sender = type(backend)
        self.duties: list[tuple[Duty, list[float]]] = []  # (duty, [next run, monotonic])

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
        self.pool = ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="ox-task")
        self.async_loop = asyncio.new_event_loop()
        self.async_runner = AsyncRunner(self.async_loop)
        threading.Thread(target=self.async_loop.run_forever, name="ox-async", daemon=True).start()
        _log(
            logging.INFO,
            "worker started",
            worker=self.id,
            queues=",".join(self.settings.queues),
            concurrency=self.settings.concurrency,
        )

    def _connect(self) -> None:
        # The main thread's Django connection (used for rare ORM reads) may be broken too.
        connections[self.alias].close_if_unusable_or_obsolete()
        self.conn = open_worker_connection(self.alias)
        sql.hold_worker_lock(self.conn, self.lock_key)

    def _done(self) -> bool:
        busy = bool(self.running or self.buffer or self.to_complete or self.to_fail)
        if self.stopping:
            if not busy:
                return True
            return time.monotonic() >= (self.stop_deadline or 0)
        if self.stuck:
            unwritten = self.to_complete or self.to_fail
            return not any(not r.interrupted_at for r in self.running.values()) and not unwritten
        if self.settings.max_tasks is not None and self.stats.claimed >= self.settings.max_tasks and not busy:
            return True
        if self.settings.batch and not busy and not self.more_waiting:
            # ...and the last claim came after the retries this worker scheduled were due.
            return self.last_claim_at >= self.batch_hold_until
        return False

    def _finish(self) -> int:
        left = [r.prep.claimed for r in self.running.values()]
        try:
            self._guard(self._flush)
            self._hand_back()
            WorkerRow.objects.using(self.alias).filter(id=self.id).update(stopped_at=timezone.now())
        except DatabaseError as exc:
            _log(logging.ERROR, f"worker could not record its stop: {exc}", worker=self.id)
        if self.pool:
            self.pool.shutdown(wait=False, cancel_futures=True)
        if self.async_loop:
            self.async_loop.call_soon_threadsafe(self.async_loop.stop)
        for claimed in left:
            _log(logging.WARNING, "worker left a task running; the rescuer will take it back", claimed, self.id)
        if self.conn is not None:
            self.conn.close()
        code = EXIT_STUCK if self.stuck else EXIT_LEFT_BEHIND if left else EXIT_OK
        _log(logging.INFO, "worker stopped", worker=self.id, finished=self.stats.finished, exit_code=code)
        return code

    # ---------------------------------------------------------------- the loop
    def _cycle(self) -> None:
        self._collect(self._wait_time())
        if (self.stopping or self.stuck) and self.buffer:
            self._guard(self._hand_back)
        self._guard(self._maintain)
        if self.to_complete and (self.flush_due is None or time.monotonic() >= self.flush_due or not self.running):
            self._guard(self._flush)
        self._dispatch()
        if self._may_claim():
            self._guard(self._claim)
            self._dispatch()

    def _guard(self, step: Any) -> None:
        """Database faults (a restart, a terminated backend, a locked SQLite file) never end
        the worker: reconnect with backoff and carry on; unwritten outcomes are kept."""
        try:
            step()
        except (OperationalError, InterfaceError) as exc:
            self._reconnect(exc)
        except DatabaseError as exc:
            # Not a lost connection: a statement the database refused. Log it and pause
            # rather than spin; the outcome stays queued and is tried again.
            logger.exception("database refused a statement; retrying shortly worker=%s", self.id)
            time.sleep(1.0)
            del exc

    def _reconnect(self, exc: Exception) -> None:
        _log(logging.WARNING, f"database error, reconnecting: {exc}".replace("\n", " "), worker=self.id)
        delay = 0.2
        while True:
            try:
                if self.conn is not None:
                    self.conn.close()
            except DatabaseError:
                pass
            try:
                self._connect()
                _log(logging.INFO, "reconnected", worker=self.id)
                return
            except (OperationalError, InterfaceError) as again:
                if self.stopping and time.monotonic() >= (self.stop_deadline or 0):
                    raise again
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _free_slots(self) -> tuple[int, int]:
        sync_busy = sum(1 for r in self.running.values() if not r.prep.is_async)
        async_busy = len(self.running) - sync_busy
        return self.settings.concurrency - sync_busy, self.settings.async_concurrency - async_busy

    def _may_claim(self) -> bool:
        if self.stopping or self.stuck:
            return False
        if self.settings.max_tasks is not None and self.stats.claimed >= self.settings.max_tasks:
            return False
        return not self.buffer and (self.more_waiting or time.monotonic() >= self.next_poll)

    def _wait_time(self) -> float:
        now = time.monotonic()
        sync_free, async_free = self._free_slots()
        if self.buffer and (sync_free > 0 or async_free > 0):
            return 0.0
        if self._may_claim() and (sync_free > 0 or async_free > 0):
            return 0.0
        deadlines = [self.next_heartbeat, self.next_rescue, *(next_run[0] for _duty, next_run in self.duties)]
        if not self.more_waiting:
            deadlines.append(self.next_poll)
        if self.to_complete and self.flush_due is not None:
            deadlines.append(self.flush_due)
        for r in self.running.values():
            if r.deadline is not None:
                deadlines.append(r.interrupted_at + self.options.interrupt_grace if r.interrupted_at else r.deadline)
        if self.stop_deadline is not None:
            deadlines.append(self.stop_deadline)
        return max(0.0, min(deadlines) - now)

    def _collect(self, timeout: float) -> None:
        try:
            item = self.outcomes.get(timeout=timeout) if timeout > 0 else self.outcomes.get_nowait()
        except queue.Empty:
            return
        while True:
            if item is not _WAKE:
                self._record(item)
            try:
                item = self.outcomes.get_nowait()
            except queue.Empty:
                return

    def _claim(self) -> None:
        sync_free, async_free = self._free_slots()
        # The kind of a task is known only once claimed: async slots count once this worker
        # has seen async tasks, so a sync-only worker never claims 100 tasks for 1 thread.
        want = max(sync_free, 0) + self.options.prefetch + (max(async_free, 0) if self.async_seen else 0)
        if self.settings.max_tasks is not None:
            want = min(want, self.settings.max_tasks - self.stats.claimed)
        if want <= 0:
            return
        self._flush()  # completions first: a claim never outruns the outcomes it owes
        now = timezone.now()
        self.last_claim_at = time.monotonic()
        claimed = sql.claim(
            self.conn, self.id, self.settings.queues, want, now, now + timedelta(seconds=self.options.lease)
        )
        self.stats.claimed += len(claimed)
        self.more_waiting = len(claimed) == want
        if not self.more_waiting:
            earliest = sql.earliest_ready(self.conn, self.settings.queues)
            wait = self.poll_interval
            if earliest is not None:
                wait = min(wait, max((earliest - timezone.now()).total_seconds(), 0.001))
            self.next_poll = time.monotonic() + wait
        for c in claimed:
            history = self._history(c) if c.attempts > 1 else ([], [])
            prep = prepare(c, self.backend.alias, self.id, history, self.options.timeout_for(c.queue, None))
            if isinstance(prep, Finished):
                self._record(prep)
            else:
                self.async_seen = self.async_seen or prep.is_async
                self.buffer.append(prep)
        self._hand_back_excess(sync_free, async_free)

    def _hand_back_excess(self, sync_free: int, async_free: int) -> None:
        """Keep no more claimed tasks of a kind than its free slots plus the prefetch: the
        rest go straight back, so one worker never hoards what another could run now."""
        room = {False: max(sync_free, 0) + self.options.prefetch, True: max(async_free, 0) + self.options.prefetch}
        kept: deque[Prepared] = deque()
        excess: list[Prepared] = []
        for prep in self.buffer:
            if room[prep.is_async] > 0:
                room[prep.is_async] -= 1
                kept.append(prep)
            else:
                excess.append(prep)
        if excess:
            sql.hand_back(self.conn, [(p.claimed.id, p.claimed.fence) for p in excess])
            self.stats.claimed -= len(excess)
            self.more_waiting = True
        self.buffer = kept

    def _history(self, claimed: Any) -> tuple[list[TaskError], list[str]]:
        """Earlier attempts of a retried task, so its context and signals see them."""
        attempts = list(Attempt.objects.using(self.alias).filter(task_id=claimed.id).order_by("number", "id"))
        return (
            [TaskError(exception_class_path=a.exception_class_path, traceback=a.traceback) for a in attempts],
            [a.worker_id for a in attempts],
        )

    def _dispatch(self) -> None:
        if self.stopping or self.stuck:
            return
        sync_free, async_free = self._free_slots()
        kept: deque[Prepared] = deque()
        while self.buffer:
            prep = self.buffer.popleft()
            if prep.is_async and async_free > 0:
                async_free -= 1
                self._start_async(prep)
            elif not prep.is_async and sync_free > 0:
                sync_free -= 1
                self._start_sync(prep)
            else:
                kept.append(prep)
        self.buffer = kept

    def _start_sync(self, prep: Prepared) -> None:
        assert self.pool is not None
        self.running[prep.claimed.id] = Running(prep, self._deadline(prep))
        future = self.pool.submit(run_sync, prep, self.interrupter, self.sender)
        future.add_done_callback(self._report)

    def _start_async(self, prep: Prepared) -> None:
        assert self.async_loop is not None and self.async_runner is not None
        self.running[prep.claimed.id] = Running(prep, None)  # the event loop enforces the timeout
        future = asyncio.run_coroutine_threadsafe(self.async_runner.run(prep, self.sender), self.async_loop)
        future.add_done_callback(self._report)

    def _report(self, future: Future[Finished]) -> None:
        if not future.cancelled() and future.exception() is None:
            self.outcomes.put(future.result())

    def _deadline(self, prep: Prepared) -> float | None:
        return time.monotonic() + prep.timeout if prep.timeout else None

    # ---------------------------------------------------------------- outcomes
    def _record(self, finished: Finished) -> None:
        self.running.pop(finished.claimed.id, None)
        self.stats.finished += 1
        self.stats.by_kind[finished.kind] = self.stats.by_kind.get(finished.kind, 0) + 1
        if finished.kind == SUCCESSFUL:
            self.to_complete.append(finished)
            if self.flush_due is None:
                self.flush_due = time.monotonic() + self.options.completion_flush_ms / 1000
            if len(self.to_complete) >= self.options.completion_batch:
                self._guard(self._flush)
            return
        self.to_fail.append(finished)
        self._guard(self._flush)

    def _flush(self) -> None:
        while self.to_fail:
            self._write_failure(self.to_fail[0])
            self.to_fail.pop(0)
        if not self.to_complete:
            return
        batch = self.to_complete
        written = sql.complete(
            self.conn,
            [sql.Completion(f.claimed.id, f.claimed.fence, f.return_json, f.finished_at) for f in batch],
        )
        self.to_complete = []
        self.flush_due = None
        for f in batch:
            if f.claimed.id in written:
                self._finished_signal(f, TaskResultStatus.SUCCESSFUL)
            else:
                self._fenced_out(f)

    def _write_failure(self, finished: Finished) -> None:
        claimed = finished.claimed
        retry_at: datetime | None = None
        note = ""
        if finished.kind != Outcome.CANCELLED and finished.retryable and claimed.attempts < claimed.max_attempts:
            delay, note = retry_delay(
                finished.task, finished.exception or Exception(), finished.result, claimed.attempts, self.options
            )
            if delay is not None:
                retry_at = finished.finished_at + timedelta(seconds=delay)
                self.batch_hold_until = max(self.batch_hold_until, time.monotonic() + delay)
                self.next_poll = min(self.next_poll, time.monotonic() + delay)
        written = sql.fail(
            self.conn,
            sql.Failure(
                id=claimed.id,
                fence=claimed.fence,
                attempt=claimed.attempts,
                worker_id=self.id,
                started_at=finished.started_at,
                finished_at=finished.finished_at,
                outcome=finished.kind,
                exception_class_path=finished.exception_class_path,
                traceback=finished.traceback + (f"\n[ox] {note}\n" if note else ""),
                retry_at=retry_at,
            ),
        )
        if not written:
            self._fenced_out(finished)
            return
        first_line = finished.traceback.strip().splitlines()[-1] if finished.traceback.strip() else finished.kind
        _log(
            logging.WARNING if retry_at else logging.ERROR,
            f"attempt {finished.kind}, {'retry at ' + retry_at.isoformat() if retry_at else 'no retry'}: {first_line}",
            claimed,
            self.id,
        )
        if retry_at is None:
            self._finished_signal(finished, TaskResultStatus.FAILED)

    def _fenced_out(self, finished: Finished) -> None:
        self.stats.fenced_out += 1
        _log(
            logging.WARNING,
            "fenced out: the lease was taken back, this outcome is not written",
            finished.claimed,
            self.id,
            outcome=finished.kind,
        )

    def _finished_signal(self, finished: Finished, status: TaskResultStatus) -> None:
        result = finished.result
        if result is None:
            return
        object.__setattr__(result, "status", status)
        object.__setattr__(result, "finished_at", finished.finished_at)
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", json.loads(finished.return_json))
        else:
            result.errors.append(
                TaskError(exception_class_path=finished.exception_class_path, traceback=finished.traceback)
            )
        try:
            task_finished.send(self.sender, task_result=result)
        except Exception as exc:  # noqa: BLE001
            _log(logging.ERROR, f"a task_finished receiver raised {exc!r}", finished.claimed, self.id)

    # ---------------------------------------------------------------- leases, rescue, timeouts
    def _maintain(self) -> None:
        now = time.monotonic()
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.options.heartbeat
            self._heartbeat()
        if now >= self.next_rescue:
            self.next_rescue = now + self.options.rescue_interval
            for task_id, worker_id, status in sql.rescue(self.conn, timezone.now()):
                _log(
                    logging.WARNING,
                    "rescued a lost task",
                    worker=self.id,
                    task_id=task_id,
                    lost_worker=worker_id,
                    status=status,
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
                    _log(logging.ERROR, f"duty {duty.name} failed: {exc!r}", worker=self.id)

    def _held(self) -> list[tuple[uuid.UUID, int]]:
        held = [(r.prep.claimed.id, r.prep.claimed.fence) for r in self.running.values() if not r.lost]
        return held + [(p.claimed.id, p.claimed.fence) for p in self.buffer]

    def _heartbeat(self) -> None:
        now = timezone.now()
        sql.heartbeat(self.conn, self.id, now)
        held = self._held()
        kept = sql.renew(self.conn, held, now + timedelta(seconds=self.options.lease))
        for task_id, _fence in held:
            if task_id not in kept:
                self._lost(task_id)
            elif kept[task_id]:
                self._cancel(task_id)

    def _lost(self, task_id: uuid.UUID) -> None:
        running = self.running.get(task_id)
        if running is not None:
            running.lost = True
            _log(
                logging.WARNING,
                "lease lost while running; the outcome will be fenced out",
                running.prep.claimed,
                self.id,
            )
            return
        self.buffer = deque(p for p in self.buffer if p.claimed.id != task_id)

    def _cancel(self, task_id: uuid.UUID) -> None:
        running = self.running.get(task_id)
        if running is not None:
            if not running.interrupted_at:
                running.interrupted_at = time.monotonic()
                self._interrupt(running, TaskCancelled)
            return
        for prep in list(self.buffer):
            if prep.claimed.id == task_id:
                self.buffer.remove(prep)
                now = timezone.now()
                self._record(
                    Finished(
                        claimed=prep.claimed,
                        kind=Outcome.CANCELLED,
                        started_at=now,
                        finished_at=now,
                        exception_class_path="ox.exceptions.TaskCancelled",
                        traceback="ox.exceptions.TaskCancelled: cancelled before it started\n",
                        task=prep.task,
                        result=prep.result,
                    )
                )

    def _interrupt(self, running: Running, exc_type: type[TaskCancelled] | type[TaskTimeout]) -> None:
        task_id = running.prep.claimed.id
        if running.prep.is_async:
            assert self.async_runner is not None
            self.async_runner.interrupt(task_id, exc_type)
        else:
            self.interrupter.interrupt(task_id, exc_type)

    def _enforce_timeouts(self, now: float) -> None:
        for running in self.running.values():
            if running.interrupted_at is not None:
                if not self.stuck and now - running.interrupted_at > self.options.interrupt_grace:
                    self.stuck = True
                    _log(
                        logging.ERROR,
                        "task ignored its interrupt; the worker stops claiming and will exit",
                        running.prep.claimed,
                        self.id,
                    )
                continue
            if running.deadline is not None and now >= running.deadline:
                running.interrupted_at = now
                self._interrupt(running, TaskTimeout)

    def _hand_back(self) -> None:
        held = [(p.claimed.id, p.claimed.fence) for p in self.buffer]
        if held:
            count = sql.hand_back(self.conn, held)
            _log(logging.INFO, "handed back claimed tasks that had not started", worker=self.id, count=count)
        self.buffer.clear()
