"""Retention: delete finished tasks (and their attempt rows) older than a per-status age, in
batches of one short transaction each, so pruning never holds many row locks for long. Both
tables are pruned: the archive (ox.archive), where old rows are, and ox_task, which holds
finished rows for ARCHIVE_AFTER (or for good, with archiving off).

One pruner at a time: each batch takes a PostgreSQL advisory transaction lock (workers try
it and skip the round if another pruner holds it; the command waits for it). On SQLite the
IMMEDIATE transaction is the lock: one writer at a time.
"""

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ox.archive import FINISHED_TERM, in_batches
from ox.db import driver
from ox.txn import atomic_on

logger = logging.getLogger("ox.prune")

PRUNER_KEY = -1  # second key of the pruner's advisory lock (workers' keys are positive)
DUTY_BUDGET = 1.0  # seconds a worker spends pruning per round: its loop waits meanwhile
TABLES = ("ox_task_archive", "ox_task")  # the archive first: that is where old rows are


@dataclass
class Pruned:
    deleted: dict[str, int] = field(default_factory=dict)  # status -> tasks deleted (or due, dry run)
    batches: int = 0  # batches that deleted rows
    done: bool = True  # False: stopped by the time budget or a busy lock, rows may remain
    busy: bool = False  # another pruner held the lock

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


def _finished(table: str) -> str:
    """ox_task's rows are found through its partial (status, finished_at) index, whose predicate
    a parameter for the status does not imply: spelled out (ox.archive.FINISHED_TERM)."""
    return f"{FINISHED_TERM} AND " if table == "ox_task" else ""


def count_due(conn: BaseDatabaseWrapper, status: str, cutoff: datetime) -> int:
    """Tasks of `status` finished before `cutoff`, in both tables."""
    total = 0
    with conn.cursor() as cursor:
        for table in TABLES:
            cursor.execute(
                f"SELECT COUNT(*) FROM {table} WHERE {_finished(table)}status = %s AND finished_at < %s",
                [status, conn.ops.adapt_datetimefield_value(cutoff)],
            )
            total += cursor.fetchone()[0]
    return total


def prune_batch(
    conn: BaseDatabaseWrapper, status: str, cutoff: datetime, limit: int, wait: bool, table: str = "ox_task"
) -> int | None:
    """Delete up to `limit` tasks of one status finished before `cutoff` from `table` (one of
    TABLES), oldest first, with their attempts. None: another pruner holds the lock (only when
    not waiting)."""
    assert table in TABLES, table  # a name put into the SQL: never from input
    d = driver(conn)
    with atomic_on(conn) as cursor:
        if not d.duty_lock(cursor, PRUNER_KEY, wait):
            return None
        cursor.execute(
            f"SELECT id, workflow_id FROM {table} WHERE {_finished(table)}status = %s AND finished_at < %s"
            f" ORDER BY finished_at LIMIT %s{d.skip_locked}",
            [status, conn.ops.adapt_datetimefield_value(cutoff), limit],
        )
        rows = cursor.fetchall()
        if not rows:
            return 0
        ids = [r[0] for r in rows]
        match, params = d.in_list(ids)
        # Explicitly: ox_attempt has no foreign key constraint (an archived task's attempts stay).
        cursor.execute(f"DELETE FROM ox_attempt WHERE task_id {match}", params)
        cursor.execute(f"DELETE FROM ox_step WHERE task_id {match}", params)  # ox.steps: likewise
        cursor.execute(f"DELETE FROM {table} WHERE id {match}", params)
        deleted = cursor.rowcount
        flows = sorted({r[1] for r in rows if r[1] is not None})
        if flows:
            _prune_workflows(cursor, d, ids, flows)
        return deleted


def _prune_workflows(cursor: Any, d: Any, ids: list[Any], flows: list[Any]) -> None:
    """A pruned task's edges in (its inputs: it has ended, it reads them no more), and a
    workflow's row once none of its tasks is left. Edges out of a pruned task stay until the
    task after it goes: they hold the result that task's inputs are read from."""
    match, params = d.in_list(ids)
    cursor.execute(f"DELETE FROM ox_workflow_edge WHERE child_id {match}", params)
    match, params = d.in_list(flows)
    cursor.execute(
        f"DELETE FROM ox_workflow WHERE id {match}"
        " AND NOT EXISTS (SELECT 1 FROM ox_task t WHERE t.workflow_id = ox_workflow.id)"
        " AND NOT EXISTS (SELECT 1 FROM ox_task_archive a WHERE a.workflow_id = ox_workflow.id)",
        params,
    )


def prune(
    conn: BaseDatabaseWrapper,
    rules: dict[str, timedelta],
    now: datetime,
    batch_size: int = 1000,
    dry_run: bool = False,
    wait: bool = True,
    budget: float | None = None,
) -> Pruned:
    """Apply retention `rules` (status -> age). `budget`: stop after this many seconds."""
    result = Pruned()
    started = time.monotonic()
    for status, age in rules.items():
        cutoff = now - age
        if dry_run:
            result.deleted[status] = count_due(conn, status, cutoff)
            continue
        result.deleted[status] = 0
        for table in TABLES:
            deleted, batches, stopped = in_batches(
                lambda: prune_batch(conn, status, cutoff, batch_size, wait, table),  # noqa: B023  (called at once)
                batch_size,
                lambda: budget is not None and time.monotonic() - started > budget,
            )
            result.deleted[status] += deleted
            result.batches += batches
            if stopped:
                result.done, result.busy = False, stopped == "busy"
                return result
    return result


def prune_workers(conn: BaseDatabaseWrapper, cutoff: datetime, limit: int = 1000, wait: bool = True) -> int | None:
    """Delete up to `limit` rows of ox_worker that stopped before `cutoff`, or that never
    stopped (a worker SIGKILLed, its host gone) and last beat before it; never one a RUNNING
    task or a slot still names (its rescue reads the row). None: another pruner holds the lock."""
    d = driver(conn)
    ts = conn.ops.adapt_datetimefield_value(cutoff)
    # Rows of workers whose session still holds its liveness lock are kept: such a worker is
    # alive however long it has been silent (paused, swapping), and its heartbeat, back, would
    # update no row.
    alive, alive_params = d.lock_not_held(conn, "w.lock_key")
    with atomic_on(conn) as cursor:
        if not d.duty_lock(cursor, PRUNER_KEY, wait):
            return None
        cursor.execute(
            "SELECT id FROM ox_worker w WHERE (w.stopped_at < %s OR (w.stopped_at IS NULL AND w.heartbeat_at < %s))"
            " AND NOT EXISTS (SELECT 1 FROM ox_task t WHERE t.status = 'RUNNING' AND t.worker_id = w.id)"
            " AND NOT EXISTS (SELECT 1 FROM ox_slot s WHERE s.worker_id = w.id)"
            f"{alive} LIMIT %s{d.skip_locked}",
            [ts, ts, *alive_params, limit],
        )
        ids = [r[0] for r in cursor.fetchall()]
        if not ids:
            return 0
        match, params = d.in_list(ids)
        cursor.execute(f"DELETE FROM ox_worker WHERE id {match}", params)
        return cursor.rowcount


class Pruner:
    """A worker's pruning duty. The worker calls it often; it prunes every `interval`
    seconds, or again at once when the last round ran out of its time budget."""

    def __init__(
        self, rules: dict[str, timedelta], interval: float, batch_size: int, workers: timedelta | None = None
    ) -> None:
        self.rules = rules
        self.interval = interval
        self.batch_size = batch_size
        self.workers = workers  # ox_worker rows' retention (None: kept)
        self.next_at = 0.0  # monotonic

    def run(self, conn: Any, now: datetime) -> None:
        if time.monotonic() < self.next_at:
            return
        result = prune(conn, self.rules, now, self.batch_size, wait=False, budget=DUTY_BUDGET)
        if self.workers is not None and result.done:
            gone = prune_workers(conn, now - self.workers, self.batch_size, wait=False)
            if gone:
                logger.info("pruned %s worker rows", gone)
                if gone >= self.batch_size:
                    result.done = False  # more to go: again at the next call
        # Out of budget: carry on at the next call. Busy: the other pruner has it in hand.
        if result.done or result.busy:
            self.next_at = time.monotonic() + self.interval
        if result.total:
            logger.info(
                "pruned %s finished tasks (%s)",
                result.total,
                ", ".join(f"{status}={n}" for status, n in result.deleted.items()),
            )
