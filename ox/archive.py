"""The archive: finished tasks move out of ox_task into ox_task_archive some minutes after they
finished (OPTIONS ARCHIVE_AFTER), so the hot table, whose partial indexes every claim,
enqueue and completion maintains, stays at the size of the live backlog plus that window of
history, and VACUUM of it stays cheap however long the history is kept.

Rows move oldest first, per finished status, in batches of one short transaction each: on
PostgreSQL one statement per batch (a DELETE ... RETURNING feeding an INSERT), the rows picked
with FOR UPDATE SKIP LOCKED so a row a retry or a concurrent archiver holds is left for later;
on SQLite an INSERT ... SELECT then a DELETE of the same rows inside one IMMEDIATE transaction
(one writer at a time). One archiver at a time on PostgreSQL: each batch takes an advisory
transaction lock (workers try it and skip the round when another archiver holds it). Attempt
rows stay in ox_attempt, keyed by task id, whichever table holds their task.

Readers look in both tables: find_row (get_result, the dashboard's task page), the dashboard's
task list, stats and metrics; retry moves a row back (move_back); pruning deletes from both.
"""

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ox import sql
from ox.db import driver
from ox.models import FINISHED, ArchivedTask, Attempt, Status, Task, TaskBase
from ox.txn import atomic_on

logger = logging.getLogger("ox.archive")

ARCHIVER_KEY = -2  # second key of the archiver's advisory lock (the pruner's is -1, workers' positive)
DUTY_BUDGET = 1.0  # seconds a worker spends archiving per round: its loop waits meanwhile
ARCHIVE_POLL = 5.0  # seconds between the duty's calls: a round out of budget carries on then
# Seconds between rounds once caught up: a tenth of ARCHIVE_AFTER, within these bounds. A row
# is archived at most about that long after it became due; none of that is urgent.
INTERVAL_MIN, INTERVAL_MAX = 1.0, 30.0
RETRYABLE = (Status.FAILED, Status.CANCELLED)
ID_CHUNK = 500  # ids per statement where a list of them is bound (SQLite's variable limit)


def columns(conn: BaseDatabaseWrapper) -> str:
    """Both tables' columns, in the models' (shared) order, quoted for `conn`."""
    return ", ".join(conn.ops.quote_name(f.column) for f in Task._meta.concrete_fields)


@dataclass
class Archived:
    moved: dict[str, int] = field(default_factory=dict)  # status -> tasks moved to the archive
    batches: int = 0  # batches that moved rows
    done: bool = True  # False: stopped by the time budget or a busy lock, due rows may remain
    busy: bool = False  # another archiver held the lock

    @property
    def total(self) -> int:
        return sum(self.moved.values())


# ox_task_status_finished's predicate, spelled out: with the status a parameter, neither SQLite
# nor a generic PostgreSQL plan can tell that `status = %s` implies it, and then the partial
# index is not used (SQLite scans the table).
FINISHED_TERM = "status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')"


# A finished row that holds its unique key: its status is one its unique_states keep, and
# its period's window (if any) has not ended by the cutoff. ox.models.UNIQUE_HELD, finished part.
HOLDS_KEY = f"unique_key IS NOT NULL AND (unique_until IS NULL OR unique_until >= %s) AND ({sql.HELD_FINISHED})"


def archive_batch(conn: BaseDatabaseWrapper, status: str, cutoff: datetime, limit: int, wait: bool) -> int | None:
    """Move up to `limit` tasks of one finished status that finished before `cutoff` to the
    archive, oldest first, in one transaction. None: another archiver holds the lock (only
    when not waiting). A row that still holds its unique key (ox.flow.unique: a finished
    status its unique_states keep, in a window not yet over) stays: the archive has no
    unique index, so moving it would free the key."""
    at = conn.ops.adapt_datetimefield_value(cutoff)
    d = driver(conn)
    with atomic_on(conn) as cursor:
        if not d.duty_lock(cursor, ARCHIVER_KEY, wait):
            return None
        return d.move_rows(cursor, "ox_task", "ox_task_archive", columns(conn), _pick(conn), [status, at, at, limit])


def _pick(conn: BaseDatabaseWrapper) -> str:
    """A batch's rows; parameters: status, cutoff, cutoff, limit. Where the pick runs twice
    (driver.repeats_pick), the id breaks ties in finished_at, so the order (and the LIMIT)
    is total; elsewhere the (status, finished_at) index gives the order alone."""
    order = "finished_at, id" if driver(conn).repeats_pick else "finished_at"
    return (
        f"SELECT id FROM ox_task WHERE {FINISHED_TERM} AND status = %s AND finished_at < %s AND NOT ({HOLDS_KEY})"
        f" ORDER BY {order} LIMIT %s"
    )


def batch_sql(conn: BaseDatabaseWrapper) -> list[str]:
    """The statements of one batch where the database moves rows by statement (PostgreSQL
    one, SQLite two); parameters: status, cutoff, cutoff, limit (each statement)."""
    return driver(conn).move_sql("ox_task", "ox_task_archive", columns(conn), _pick(conn))


def archive(
    conn: BaseDatabaseWrapper,
    age: timedelta,
    now: datetime,
    batch_size: int = 5000,
    wait: bool = True,
    budget: float | None = None,
) -> Archived:
    """Move every finished task that finished more than `age` before `now` (the database's
    time) to the archive. `budget`: stop after this many seconds (the rest waits for the next
    round)."""
    result = Archived()
    started = time.monotonic()
    cutoff = now - age
    for status in FINISHED:
        moved, batches, stopped = in_batches(
            lambda: archive_batch(conn, status, cutoff, batch_size, wait),  # noqa: B023  (called at once)
            batch_size,
            lambda: budget is not None and time.monotonic() - started > budget,
        )
        result.moved[status], result.batches = moved, result.batches + batches
        if stopped:
            result.done, result.busy = False, stopped == "busy"
            return result
    return result


def in_batches(
    batch: Callable[[], int | None], batch_size: int, out_of_time: Callable[[], bool]
) -> tuple[int, int, str | None]:
    """Run `batch` (one short transaction; None: another holder of the lock) until it returns
    fewer than `batch_size` rows or time runs out: (rows, batches that had rows, why it stopped
    early: "budget", "busy" or None). The archiver's and the pruner's rounds both."""
    rows = batches = 0
    while True:
        if out_of_time():
            return rows, batches, "budget"
        done = batch()
        if done is None:
            return rows, batches, "busy"
        if done:
            rows, batches = rows + done, batches + 1
        if done < batch_size:
            return rows, batches, None


class Archiver:
    """A worker's archiving duty. Called every ARCHIVE_POLL seconds; it archives every
    `interval` seconds, or again at the next call when the last round ran out of its budget."""

    def __init__(self, age: timedelta, batch_size: int) -> None:
        self.age = age
        self.batch_size = batch_size
        self.interval = min(INTERVAL_MAX, max(INTERVAL_MIN, age.total_seconds() / 10))
        self.next_at = 0.0  # monotonic
        self.rounds = 0  # rounds run so far (tests read it)

    @property
    def poll(self) -> float:
        return min(ARCHIVE_POLL, self.interval)

    def run(self, conn: Any, now: datetime) -> None:
        if time.monotonic() < self.next_at:
            return
        self.rounds += 1
        result = archive(conn, self.age, now, self.batch_size, wait=False, budget=DUTY_BUDGET)
        # Out of budget: carry on at the next call. Busy: the other archiver has it in hand.
        if result.done or result.busy:
            self.next_at = time.monotonic() + self.interval
        if result.total:
            logger.info(
                "archived %s finished tasks (%s)",
                result.total,
                ", ".join(f"{status}={n}" for status, n in result.moved.items() if n),
            )


def move_back(conn: BaseDatabaseWrapper, ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """Move the FAILED or CANCELLED tasks among `ids` from the archive back into ox_task, as
    they are (ox.operations.retry then makes them READY). Runs in the caller's transaction.
    The ids moved: a task another retry moved back first (or that is gone) is not among them,
    so each archived task is moved, and retried, once."""
    cols = columns(conn)
    pk = Task._meta.pk
    moved: list[uuid.UUID] = []
    statuses = ", ".join(f"'{s}'" for s in RETRYABLE)
    d = driver(conn)
    with conn.cursor() as cursor:
        for start in range(0, len(ids), ID_CHUNK):
            chunk = [pk.get_db_prep_value(i, conn) for i in ids[start : start + ID_CHUNK]]
            found = d.move_back(cursor, cols, chunk, statuses)
            moved += [pk.to_python(value) for value in found]
    return moved


def find_row(pk: uuid.UUID, using: str | None = None) -> TaskBase | None:
    """A task's row from ox_task, else from the archive. When neither has it, ox_task is read
    once more: a retry may have moved the row back from the archive between the two reads
    (moving to the archive is one commit, so a row leaving ox_task is in the archive by then)."""
    for model in (Task, ArchivedTask, Task):
        try:
            return model.objects.using(using).get(pk=pk)
        except model.DoesNotExist:
            continue
    return None


def attempts_of(row: TaskBase) -> list[Attempt]:
    """A task's Attempt rows in order, by task id (no join: an archived task has no ox_task row)."""
    return list(Attempt.objects.using(row._state.db).filter(task_id=row.pk).order_by("number", "id"))
