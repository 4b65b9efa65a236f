"""The named operations of enqueue and the worker loop, the same on every database: each is
one function here, its statements in the connection's driver (ox.db: one module per
database). docs/databases.md says what each costs per database, in statements and round
trips.

The worker runs these on its own long-lived connection (ox.connection). Timestamps come from
the worker's clock and are passed in, so every database compares like with like.
"""

import functools
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db import driver
from ox.db.base import HELD_FINISHED, LOCK_NAMESPACE, LOST_TRACEBACK, RESCUER_KEY, UNIQUE_HELD, Held
from ox.db.dialect import DEADLOCK_BUDGET, DEADLOCK_TRIES, after_deadlock, runs_again
from ox.db.rows import CLAIM_COLUMNS, Claimed, Completion, Failure, NewTask, WorkerRow
from ox.db.walks import Gate

__all__ = [
    "CLAIM_COLUMNS",
    "HELD_FINISHED",
    "LOCK_NAMESPACE",
    "LOST_TRACEBACK",
    "RESCUER_KEY",
    "UNIQUE_HELD",
    "Claimed",
    "Completion",
    "Failure",
    "Gate",
    "NewTask",
    "WorkerRow",
]


_RUNS_AGAIN = "_ox_runs_again"  # set on a connection while again_on_deadlock runs a write on it


def again_on_deadlock[**P, R](fn: Callable[P, R]) -> Callable[P, R]:
    """Run a write that locks rows again when the database picked its transaction as a
    deadlock victim (the database rolled all of it back, so nothing of it was written; InnoDB's
    locks on index records are the database's to order, not ox's, and on PostgreSQL another
    session may take ox's rows in another order). Only where ox's transaction is the outermost
    (runs_again): inside the caller's atomic() the error is the caller's, and raised. Not
    after the victim's connection was closed (its ROLLBACK failed: the session is gone): a run
    again would open a new session on the same wrapper, without what the worker holds on its
    session (the liveness lock), so the error goes to the worker's reconnect path, which takes
    that again. At most DEADLOCK_TRIES runs, none begun later than DEADLOCK_BUDGET seconds after
    the first deadlock. The first argument
    is the connection."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        conn: Any = args[0]
        if getattr(conn, _RUNS_AGAIN, False) or not runs_again(conn):
            return fn(*args, **kwargs)  # the outer call runs it again (or the caller's atomic())
        give_up_at: float | None = None  # counted from the first deadlock, not the first run's start
        try:
            setattr(conn, _RUNS_AGAIN, True)
            for attempt in range(DEADLOCK_TRIES - 1):
                try:
                    return fn(*args, **kwargs)
                except DatabaseError as exc:
                    if not driver(conn).deadlocked(exc) or conn.connection is None:
                        raise
                    give_up_at = give_up_at or time.monotonic() + DEADLOCK_BUDGET
                    if time.monotonic() >= give_up_at:
                        raise
                    after_deadlock(attempt)
            return fn(*args, **kwargs)
        finally:
            setattr(conn, _RUNS_AGAIN, False)

    return run


@contextmanager
def transaction(conn: BaseDatabaseWrapper) -> Iterator[Any]:
    """A transaction on a connection left in autocommit (IMMEDIATE on SQLite, so the write
    lock is taken up front); inside the caller's atomic(), a savepoint of it."""
    with driver(conn).transaction(conn) as cursor:
        yield cursor


def claim(
    conn: BaseDatabaseWrapper,
    worker_id: str,
    queues: Sequence[str],
    limits: int | tuple[int, int],
    now: datetime,
    lease_expires_at: datetime,
    gate: Gate = False,
) -> list[Claimed]:
    """Claim due READY tasks in priority order: `limits` sync and async tasks (an int: that
    many of each kind), in claim order (priority, then due time, then id). gate: queues
    limited at run time are claimed too (ox.flow.slots: the caller holds their slots);
    paused ones never are. What it costs does not grow with the backlog (ox.db.walks)."""
    limits = (limits, limits) if isinstance(limits, int) else limits
    if max(limits) <= 0 or not queues:
        return []
    return driver(conn).claim(conn, worker_id, queues, limits, now, lease_expires_at, gate)


@again_on_deadlock
def complete_and_claim(
    conn: BaseDatabaseWrapper,
    done: Sequence[Completion],
    worker_id: str,
    queues: Sequence[str],
    limits: tuple[int, int],
    now: datetime,
    lease_expires_at: datetime,
    gate: Gate = False,
) -> tuple[set[Held], list[Claimed]]:
    """Write finished tasks and claim the next ones in one round trip and one commit where
    the database allows. Returns the claims written (the rest were fenced out) and the
    claimed. gate: as for claim()."""
    if not done:
        return set(), claim(conn, worker_id, queues, limits, now, lease_expires_at, gate)
    if max(limits) <= 0 or not queues:
        return complete(conn, done), []
    if driver(conn).joins_in_claim or not any(c.workflow for c in done):
        return driver(conn).complete_and_claim(conn, done, worker_id, queues, limits, now, lease_expires_at, gate)
    with transaction(conn) as cursor:
        written, claimed = driver(conn).complete_and_claim(
            conn, done, worker_id, queues, limits, now, lease_expires_at, gate
        )
        _join(conn, cursor, done, written)
    return written, claimed


@again_on_deadlock
def complete(conn: BaseDatabaseWrapper, done: Sequence[Completion]) -> set[Held]:
    """Mark tasks SUCCESSFUL in one statement; returns the claims written (the rest were
    fenced out). A workflow's tasks among them count their followers down in the same
    transaction (ox.workflow.join)."""
    if not done:
        return set()
    if not any(c.workflow for c in done):
        return driver(conn).complete(conn, done)
    with transaction(conn) as cursor:
        written = driver(conn).complete(conn, done)
        _join(conn, cursor, done, written)
    return written


def _join(conn: BaseDatabaseWrapper, cursor: Any, done: Sequence[Completion], written: set[Held]) -> None:
    from ox.workflow import join

    ended = [(c.id, c.return_json) for c in done if c.workflow and (c.id, c.fence) in written]
    if ended:
        join.succeeded(conn, cursor, ended, max(c.finished_at for c in done))


@again_on_deadlock
def fail(conn: BaseDatabaseWrapper, failure: Failure) -> str | None:
    """Record a failed attempt and send the task back to READY (retry_at) or to its final
    status; a cancel requested while it ran ends it CANCELLED instead of a retry. Returns
    the status written, or None when fenced out (nothing is written)."""
    if failure.retry_at is not None:
        status = "READY"
    elif failure.outcome == "cancelled":
        status = "CANCELLED"
    else:
        status = "FAILED"
    if not failure.workflow:
        return driver(conn).fail(conn, failure, status)
    with transaction(conn) as cursor:
        written = driver(conn).fail(conn, failure, status)
        if written in ("FAILED", "CANCELLED"):
            from ox.workflow import join

            join.ended_badly(conn, cursor, failure.id, written, failure.finished_at)
    return written


def save_metadata(conn: BaseDatabaseWrapper, claimed: Claimed, text: str, started: datetime | None) -> bool:
    """A task's metadata (JSON text), while this attempt holds it; False: it no longer does."""
    return driver(conn).save_metadata(conn, claimed.id, claimed.fence, text, started)


def renew(
    conn: BaseDatabaseWrapper,
    held: Sequence[tuple[uuid.UUID, int, datetime | None]],
    lease_expires_at: datetime,
) -> dict[Held, bool]:
    """Extend the leases this worker still holds, in one statement, and record when bodies
    started since the last write (started_at None: not started, or already recorded).
    Returns {(id, fence): cancel_requested} for each lease kept; a claim missing from it
    was fenced out."""
    return driver(conn).renew(conn, held, lease_expires_at) if held else {}


def mark_started(conn: BaseDatabaseWrapper, claimed: Claimed, at: datetime) -> bool:
    """Record that this claim's body starts at `at`, before it does (ox.start_marks). False:
    the claim is no longer this worker's."""
    return driver(conn).mark_started(conn, claimed.id, claimed.fence, at)


def hand_back(conn: BaseDatabaseWrapper, held: Sequence[Held], now: datetime, flows: Sequence[uuid.UUID] = ()) -> int:
    """Return claimed-but-unstarted tasks to READY without spending an attempt (CANCELLED if
    a cancel was requested meanwhile). flows: those of them that are a workflow's tasks."""
    if not held:
        return 0
    count = _hand_back_rows(conn, held, now)
    if flows:
        # A cancel requested meanwhile ended it CANCELLED here, where no join saw it: its
        # followers (and its on-failure task) are joined now, not at the repair sweep. Only
        # when workflow tasks went back: a plain hand-back stays one statement.
        _workflow_join().ended_badly_where(conn, flows, now)
    return count


@again_on_deadlock
def _hand_back_rows(conn: BaseDatabaseWrapper, held: Sequence[Held], now: datetime) -> int:
    # Its own transaction, run again alone: the joins after it are each in one of their own.
    return driver(conn).hand_back(conn, held, now)


def attempt_history(conn: BaseDatabaseWrapper, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[tuple[str, str, str]]]:
    """Earlier attempts of claimed tasks: id -> [(exception class path, traceback, worker id)]."""
    return driver(conn).attempt_history(conn, ids) if ids else {}


def earliest_ready(
    conn: BaseDatabaseWrapper, queues: Sequence[str], kinds: tuple[bool, bool] = (True, True), gate: Gate = False
) -> datetime | None:
    """When the next READY task in these queues becomes due (None: none waiting); kinds:
    whether to look at (sync, async) tasks, the ones the worker has room to claim.

    The READY index is ordered by priority before run_after, so MIN(run_after) over it is a
    scan of the whole backlog. Instead the first run_after of each priority present is
    taken (ox.db.walks): the cost grows with the number of distinct priorities waiting (a
    handful; at most 201), never with the number of tasks."""
    return driver(conn).earliest_ready(conn, queues, kinds, gate)


def insert_tasks(conn: BaseDatabaseWrapper, rows: Sequence[NewTask], prepare: bool = False) -> None:
    """Insert READY tasks in one statement (written out: compiling the ORM's INSERT costs
    more than the round trip). Unique tasks go through insert_unique, one by one. `prepare`:
    no transaction pooler stands between this connection and the server (ox OPTIONS POOLER),
    so PostgreSQL may run a single row's INSERT prepared (ox.db.postgresql.prepared.write)."""
    if rows:
        driver(conn).insert_tasks(conn, rows, prepare)


def insert_unique(conn: BaseDatabaseWrapper, row: NewTask, prepare: bool = False) -> bool:
    """Insert a unique task unless its key is held (ox_task_unique): True if inserted. A
    duplicate neither raises nor aborts the caller's transaction; a concurrent insert of the
    same key waits for that one to commit or roll back, so exactly one of them inserts."""
    return driver(conn).insert_unique(conn, row, prepare)


def holder_of(conn: BaseDatabaseWrapper, key: str) -> uuid.UUID | None:
    """The task that holds a unique key now, if any."""
    return driver(conn).holder_of(conn, key)


def rescue(
    conn: BaseDatabaseWrapper, now: datetime, max_lost: int = 5, liveness_grace: float = 1.0
) -> list[tuple[uuid.UUID, str, str]]:
    return rescue_and_mark(conn, now, max_lost, liveness_grace)[0]


def rescue_and_mark(
    conn: BaseDatabaseWrapper, now: datetime, max_lost: int = 5, liveness_grace: float = 1.0
) -> tuple[list[tuple[uuid.UUID, str, str]], list[str]]:
    """Take back RUNNING tasks whose lease expired or whose worker died, recording a `lost`
    attempt. A lost attempt does not spend the task's budget (max_attempts grows with it):
    the worker may have died before the task even started (it may have been prefetched).
    Only a task lost `max_lost` times (it may be what kills its workers) becomes FAILED; one
    whose cancel was requested becomes CANCELLED. run_after is kept, so the task goes back
    to its place in the queue, not to the end. A dead worker's slots (ox.flow.slots) are
    freed with its tasks. One rescuer at a time. Returns (task id, worker id, new status)
    per rescued task, and the workers newly found without their lock (where the database
    has session locks: liveness_grace seconds after that, they are dead)."""
    rescued, marked = driver(conn).rescue_and_mark(conn, now, max_lost, liveness_grace)
    # A task given up on (FAILED) or cancelled here ended where no join saw it. The repair
    # sweep only walks PENDING followers: a workflow's last task never enqueued its
    # on-failure task. Joined now, in a transaction of its own (joining again is harmless).
    ended = [i for i, _w, status in rescued if status in ("FAILED", "CANCELLED")]
    if ended:
        _workflow_join().ended_badly_where(conn, ended, now)
    return rescued, marked


def hold_worker_lock(conn: BaseDatabaseWrapper, lock_key: int) -> None:
    """Hold the worker's liveness lock for the life of this session (where the database has
    session locks)."""
    driver(conn).hold_worker_lock(conn, lock_key)


def heartbeat(conn: BaseDatabaseWrapper, worker_id: str, now: datetime, clear_idle: bool = False) -> None:
    driver(conn).heartbeat(conn, worker_id, now, clear_idle)


def mark_idle(conn: BaseDatabaseWrapper, worker_id: str, now: datetime) -> None:
    """The worker waits with free slots: enqueues of its queues notify again (ox.idle)."""
    driver(conn).mark_idle(conn, worker_id, now)


def register_worker(conn: BaseDatabaseWrapper, row: WorkerRow) -> None:
    """The worker's ox_worker row, written on its own connection (so the main thread's
    Django connection need not stay open for the worker's life)."""
    driver(conn).register_worker(conn, row)


def worker_stopped(conn: BaseDatabaseWrapper, worker_id: str, now: datetime) -> None:
    driver(conn).worker_stopped(conn, worker_id, now)


def _workflow_join() -> Any:
    from ox.workflow import join  # workflows build on this module: imported when used

    return join
