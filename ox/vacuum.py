"""The vacuum duty (PostgreSQL): VACUUM ox's tables when their dead row versions pile up, from a
thread on its own session, so the worker loop never waits for it.

Why a worker does this at all: every claim, completion and prune leaves a dead row version in
ox_task and a dead entry in each index that held the row, and only VACUUM reclaims them.
Autovacuum does it where it runs, but it looks at a database once per `autovacuum_naptime`
(60 s by default) and may be off altogether (this project's CI server runs without it): a worker
draining thousands of tasks a second leaves hundreds of thousands of dead versions per minute,
and scans that meet them (the rescuer's lease scan, the pruner's oldest-first walk) slow down
with each one. Measured in the soak (tests/test_soak.py): with nothing vacuuming, 7.4 million
dead tuples and a heap 14x its size after 30 minutes at 1,500 tasks/s.

How: every VACUUM_INTERVAL seconds the worker loop reads the tables' dead and live tuple counts
(pg_stat_user_tables); a table with at least VACUUM_MIN_DEAD dead tuples and at least
DEAD_FRACTION of its live ones gets `VACUUM (SKIP_LOCKED, TRUNCATE false)`:
- SKIP_LOCKED: if autovacuum or another worker's duty is vacuuming the table, this one skips it
  (no election needed: several workers on one database take turns by the table's own lock);
- TRUNCATE false: giving the file's empty tail back to the filesystem takes an ACCESS EXCLUSIVE
  lock that would stall claims; a queue table refills that space within seconds anyway.
VACUUM holds SHARE UPDATE EXCLUSIVE while it runs: claims, enqueues and completions go on, but
DDL on the table (a migration's ALTER TABLE) waits for it, as it would for autovacuum.

A VACUUM that cannot remove what it found dead (an old snapshot holds it back: see
ox.tablehealth) would run again at every look and find the same rows; after one such round the
duty waits twice as long before the next (up to BACKOFF_MAX) and logs a warning once.
"""

import logging
import threading
import time
from dataclasses import dataclass

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

from ox.connection import open_worker_connection
from ox.logs import event

logger = logging.getLogger("ox.vacuum")

TABLES = ("ox_task", "ox_attempt", "ox_worker", "ox_task_archive")
DEAD_FRACTION = 0.05  # of the table's live tuples, and at least VACUUM_MIN_DEAD
BACKOFF_MAX = 600.0  # seconds between rounds while VACUUM cannot keep up (an old snapshot)

STATS_SQL = """
    SELECT c.relname, s.n_live_tup, s.n_dead_tup, s.vacuum_count + s.autovacuum_count
    FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
    WHERE s.relid = ANY(ARRAY[{tables}])
"""


@dataclass(frozen=True)
class TableCounts:
    table: str
    live: int
    dead: int
    vacuums: int  # VACUUMs of the table so far, manual and auto

    def due(self, min_dead: int) -> bool:
        return self.dead > 0 and self.dead >= max(min_dead, DEAD_FRACTION * self.live)


@dataclass(frozen=True)
class Vacuumed:
    table: str
    dead_before: int
    dead_after: int
    seconds: float

    @property
    def kept_up(self) -> bool:
        """VACUUM removed at least half of what was dead (else something holds it back)."""
        return self.dead_after * 2 <= self.dead_before


def table_counts(conn: BaseDatabaseWrapper, tables: tuple[str, ...] = TABLES) -> list[TableCounts]:
    """Dead and live tuple counts of `tables` (those that exist), on a PostgreSQL connection."""
    names = ", ".join("to_regclass(%s)" for _ in tables)
    with conn.cursor() as cursor:
        cursor.execute(STATS_SQL.format(tables=names), list(tables))
        return [TableCounts(*row) for row in cursor.fetchall()]


def may_vacuum(conn: BaseDatabaseWrapper, tables: list[str]) -> set[str]:
    """Those of `tables` this session's role may VACUUM: their owner's role is its own (or one
    it is a member of), or it is a superuser. (PostgreSQL answers another role's VACUUM with a
    warning only, which would look like a skipped table.)"""
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_class c WHERE c.oid = ANY(ARRAY[{}])"
            " AND (pg_has_role(c.relowner, 'USAGE')"
            " OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user))".format(
                ", ".join("to_regclass(%s)" for _ in tables)
            ),
            tables,
        )
        return {row[0] for row in cursor.fetchall()}


def vacuum_table(conn: BaseDatabaseWrapper, table: str) -> None:
    """One VACUUM of `table`, in autocommit (VACUUM cannot run inside a transaction block).
    `table` comes from TABLES, never from input; quoted all the same."""
    with conn.cursor() as cursor:
        cursor.execute(f"VACUUM (SKIP_LOCKED, TRUNCATE false) {conn.ops.quote_name(table)}")


class Vacuumer:
    """The vacuum duty of one worker. `run` is called from the worker loop on its connection
    (one statistics query per look); a due VACUUM runs in a thread on a session of its own,
    opened for it and closed after, so an idle worker holds no extra session and the loop
    never waits. `alias`: the worker's database; `pooled`: behind a transaction pooler
    (VACUUM is one autocommit statement, so it works there too)."""

    def __init__(self, alias: str, interval: float, min_dead: int, pooled: bool = False) -> None:
        self.alias = alias
        self.interval = interval
        self.min_dead = min_dead
        self.pooled = pooled
        self.stopped = threading.Event()
        self.next_at = 0.0  # monotonic: the next look
        self.wait = interval  # seconds between looks (longer while VACUUM cannot keep up)
        self.warned = False
        self.looks = 0  # statistics queries so far (tests read it)
        self.vacuums: list[Vacuumed] = []  # the most recent ones, newest last (tests read it)
        self.thread: threading.Thread | None = None
        self.conn: BaseDatabaseWrapper | None = None  # the VACUUM session while one runs
        self.pid: int | None = None
        self.refused = False
        self.refused_warned = False

    @property
    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def run(self, conn: BaseDatabaseWrapper, now: object = None) -> None:
        """The duty: look at the statistics when a look is due; hand due tables to a thread."""
        if self.busy and self.pid is not None:
            # As autovacuum does: a VACUUM that blocks another session's lock request (a
            # migration's ALTER TABLE, with every claim queued behind it) gives way.
            with conn.cursor() as cursor:
                cursor.execute(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid)))",
                    [self.pid],
                )
                if cursor.fetchone()[0]:
                    self._cancel()
            return
        if self.stopped.is_set() or self.busy or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.wait
        self.looks += 1
        due = [c for c in table_counts(conn) if c.due(self.min_dead)]
        if due:
            self.thread = threading.Thread(target=self._vacuum, args=(due,), name="ox-vacuum", daemon=True)
            self.thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop; a VACUUM in progress is cancelled (it loses nothing: the next VACUUM starts
        over), so shutting down never waits for a long one."""
        self.stopped.set()
        deadline = time.monotonic() + timeout
        while True:
            self._cancel()
            if self.thread is None:
                return
            self.thread.join(0.1)
            if not self.thread.is_alive() or time.monotonic() >= deadline:
                return

    def _cancel(self) -> None:
        conn = self.conn
        raw = conn.connection if conn is not None else None
        if raw is not None:
            try:
                raw.cancel()
            except Exception:  # noqa: BLE001, S110  (closed meanwhile: nothing left to cancel)
                pass

    def _vacuum(self, due: list[TableCounts]) -> None:
        done: list[Vacuumed] = []
        try:
            self.conn = open_worker_connection(self.alias, pooled=self.pooled)
            with self.conn.cursor() as cursor:
                if not self.pooled:  # a VACUUM whose worker died ends within a second
                    cursor.execute("SET client_connection_check_interval = '1s'")
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
            allowed = may_vacuum(self.conn, [c.table for c in due])
            refused = [c.table for c in due if c.table not in allowed]
            if refused:
                self.refused = True
                if not self.refused_warned:
                    self.refused_warned = True
                    tables = ", ".join(refused)
                    message = f"the worker's role may not VACUUM {tables} (not their owner): left to autovacuum"
                    event(logger, logging.WARNING, message)
            due = [c for c in due if c.table in allowed]
            for counts in due:
                if self.stopped.is_set():
                    break
                started = time.monotonic()
                vacuum_table(self.conn, counts.table)
                after = next((c for c in table_counts(self.conn, (counts.table,))), None)
                if after is None or after.vacuums == counts.vacuums:
                    continue  # skipped: autovacuum or another worker holds the table
                done.append(Vacuumed(counts.table, counts.dead, after.dead, time.monotonic() - started))
        except Exception as exc:  # noqa: BLE001  (the duty must never end the worker: look again later)
            if not self.stopped.is_set():
                event(logger, logging.WARNING, f"vacuum duty failed, looking again later: {exc}")
        finally:
            conn, self.conn, self.pid = self.conn, None, None
            if conn is not None:
                try:
                    conn.close()
                except DatabaseError:
                    pass
        self.vacuums = (self.vacuums + done)[-20:]
        for v in done:
            event(
                logger,
                logging.INFO,
                "vacuumed",
                table=v.table,
                dead_before=v.dead_before,
                dead_after=v.dead_after,
                seconds=round(v.seconds, 3),
            )
        self._pace(done)

    def _pace(self, done: list[Vacuumed]) -> None:
        if self.refused:
            self.refused = False
            self.wait = BACKOFF_MAX
            self.next_at = time.monotonic() + self.wait
            return
        if not done:
            return  # skipped (another VACUUM held the table) or failed: the pace stays
        if all(v.kept_up for v in done):
            self.wait, self.warned = self.interval, False
            return
        self.wait = min(self.wait * 2, BACKOFF_MAX)
        self.next_at = time.monotonic() + self.wait
        if not self.warned:
            self.warned = True
            stuck = ", ".join(f"{v.table} ({v.dead_after} of {v.dead_before} still dead)" for v in done)
            event(
                logger,
                logging.WARNING,
                f"VACUUM could not remove the dead rows of {stuck}: an open transaction or a replication"
                " slot holds an old snapshot (the dashboard's Health page names the oldest transaction);"
                " looking less often until it ends",
                next_look_s=self.wait,
            )
