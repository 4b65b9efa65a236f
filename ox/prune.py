"""Retention: delete finished tasks (and their attempt rows) older than a per-status age, in
batches of one short transaction each, so pruning never holds many row locks for long.

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

from ox import sql
from ox.txn import atomic_on

logger = logging.getLogger("ox.prune")

PRUNER_KEY = -1  # second key of the pruner's advisory lock (workers' keys are positive)
DUTY_BUDGET = 1.0  # seconds a worker spends pruning per round: its loop waits meanwhile


@dataclass
class Pruned:
    deleted: dict[str, int] = field(default_factory=dict)  # status -> tasks deleted (or due, dry run)
    batches: int = 0
    done: bool = True  # False: stopped by the time budget or a busy lock, rows may remain
    busy: bool = False  # another pruner held the lock

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


def count_due(conn: BaseDatabaseWrapper, status: str, cutoff: datetime) -> int:
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM ox_task WHERE status = %s AND finished_at < %s",
            [status, conn.ops.adapt_datetimefield_value(cutoff)],
        )
        return cursor.fetchone()[0]


def prune_batch(conn: BaseDatabaseWrapper, status: str, cutoff: datetime, limit: int, wait: bool) -> int | None:
    """Delete up to `limit` tasks of one status finished before `cutoff`, oldest first, with
    their attempts. None: another pruner holds the lock (only when not waiting)."""
    postgres = sql.is_postgres(conn)
    with atomic_on(conn) as cursor:
        if postgres:
            if wait:
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [sql.LOCK_NAMESPACE, PRUNER_KEY])
            else:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [sql.LOCK_NAMESPACE, PRUNER_KEY])
                if not cursor.fetchone()[0]:
                    return None
        cursor.execute(
            "SELECT id FROM ox_task WHERE status = %s AND finished_at < %s ORDER BY finished_at LIMIT %s"
            + (" FOR UPDATE SKIP LOCKED" if postgres else ""),
            [status, conn.ops.adapt_datetimefield_value(cutoff), limit],
        )
        ids = [r[0] for r in cursor.fetchall()]
        if not ids:
            return 0
        if postgres:
            match, params = "= ANY(%s)", [ids]
        else:
            match, params = f"IN ({', '.join(['%s'] * len(ids))})", ids
        cursor.execute(f"DELETE FROM ox_attempt WHERE task_id {match}", params)
        cursor.execute(f"DELETE FROM ox_task WHERE id {match}", params)
        return cursor.rowcount


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
        while True:
            if budget is not None and time.monotonic() - started > budget:
                result.done = False
                return result
            deleted = prune_batch(conn, status, cutoff, batch_size, wait)
            if deleted is None:
                result.done, result.busy = False, True
                return result
            result.batches += 1
            result.deleted[status] += deleted
            if deleted < batch_size:
                break
    return result


class Pruner:
    """A worker's pruning duty. The worker calls it often; it prunes every `interval`
    seconds, or again at once when the last round ran out of its time budget."""

    def __init__(self, rules: dict[str, timedelta], interval: float, batch_size: int) -> None:
        self.rules = rules
        self.interval = interval
        self.batch_size = batch_size
        self.next_at = 0.0  # monotonic

    def run(self, conn: Any, now: datetime) -> None:
        if time.monotonic() < self.next_at:
            return
        result = prune(conn, self.rules, now, self.batch_size, wait=False, budget=DUTY_BUDGET)
        # Out of budget: carry on at the next call. Busy: the other pruner has it in hand.
        if result.done or result.busy:
            self.next_at = time.monotonic() + self.interval
        if result.total:
            logger.info(
                "pruned %s finished tasks (%s)",
                result.total,
                ", ".join(f"{status}={n}" for status, n in result.deleted.items()),
            )
