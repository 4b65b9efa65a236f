"""What every driver shares: the operations whose SQL is the same on every database ox runs
on (written with the dialect's facts, ox.db.dialect). A driver (ox.db.postgresql,
ox.db.sqlite, ox.db.mysql) overrides the facts that differ and implements the rest of the
operations named in ox.sql."""

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db.dialect import Dialect
from ox.db.notes import TaskNotes
from ox.db.rows import Claimed, Completion, Failure, NewTask, WorkerRow, read_id, read_ts
from ox.db.walks import LEVEL_READY, Gate, distinct, levels_cte

# Namespace (first key) of ox's advisory locks where a database has them; the second key is
# a worker's lock_key, or one of the duties' keys (0: the rescuer).
LOCK_NAMESPACE = 0x6F78  # "ox"
RESCUER_KEY = 0
# Where ox.connection records, on a worker connection's wrapper, the settings its server
# session gets at every connect (None or absent: not a worker connection, or a pooled one).
SESSION_ATTR = "ox_server_keepalives"

# Constants stay in the text; the READY row's other columns take their model defaults.
INSERT_COLUMNS = (
    "id, task_path, queue, priority, status, args, kwargs, run_after, enqueued_at,"
    " attempts, max_attempts, worker_id, fence, cancel_requested, is_async, scheduled_for,"
    " unique_key, unique_states, unique_until, limit_key, metadata"
)

# ox.models.UNIQUE_HELD as SQL: the rows that hold their unique key.
# The finished rows whose unique_states keep the key (bits 1 SUCCESSFUL, 2 FAILED, 4 CANCELLED).
HELD_FINISHED = (
    "(status = 'SUCCESSFUL' AND unique_states IN (1, 3, 5, 7))"
    " OR (status = 'FAILED' AND unique_states IN (2, 3, 6, 7))"
    " OR (status = 'CANCELLED' AND unique_states IN (4, 5, 6, 7))"
)
UNIQUE_HELD = f"unique_key IS NOT NULL AND (status IN ('READY', 'RUNNING') OR {HELD_FINISHED})"

SET_RUNNING = (
    "UPDATE ox_task SET status = 'RUNNING', attempts = attempts + 1, worker_id = %s,"
    " lease_expires_at = %s, fence = fence + 1, last_attempted_at = NULL"
)

# The lost attempts (ox_attempt rows, alias a) that count toward MAX_LOST: those whose body had
# started (a start mark), and any first attempt, of which an unmarked one may have started and
# killed its worker before the heartbeat wrote the mark. Later attempts write theirs before the
# body (ox.start_marks), so one without a mark never started.
LOST_COUNTED = "(a.started_at IS NOT NULL OR a.number <= 1)"
# The same for the loss being rescued now, on the task's row (alias t).
LOSS_COUNTS = "(t.last_attempted_at IS NOT NULL OR t.attempts <= 1)"

LOST_TRACEBACK = (
    "The lease of worker {worker} on this attempt expired or its process died; the rescuer took the task back."
)

_INSERT_ATTEMPT = (
    "INSERT INTO ox_attempt (task_id, number, worker_id, started_at, finished_at, outcome,"
    " exception_class_path, traceback) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)

Held = tuple[uuid.UUID, int]  # a claim: (task id, fence)


class Driver(TaskNotes, Dialect):
    """One database's statements. Stateless: one instance per vendor serves every connection."""

    # ------------------------------------------------------------------ claim (per driver)
    def claim(
        self,
        conn: BaseDatabaseWrapper,
        worker_id: str,
        queues: Sequence[str],
        limits: tuple[int, int],
        now: datetime,
        lease_expires_at: datetime,
        gate: Gate = False,
    ) -> list[Claimed]:
        raise NotImplementedError

    def complete_and_claim(
        self,
        conn: BaseDatabaseWrapper,
        done: Sequence[Completion],
        worker_id: str,
        queues: Sequence[str],
        limits: tuple[int, int],
        now: datetime,
        lease_expires_at: datetime,
        gate: Gate = False,
    ) -> tuple[set[Held], list[Claimed]]:
        raise NotImplementedError

    def complete(self, conn: BaseDatabaseWrapper, done: Sequence[Completion]) -> set[Held]:
        raise NotImplementedError

    def renew(
        self, conn: BaseDatabaseWrapper, held: Sequence[tuple[uuid.UUID, int, datetime | None]], lease: datetime
    ) -> dict[Held, bool]:
        raise NotImplementedError

    def hand_back(self, conn: BaseDatabaseWrapper, held: Sequence[Held], now: datetime) -> int:
        raise NotImplementedError

    def mark_started(self, conn: BaseDatabaseWrapper, task_id: uuid.UUID, fence: int, at: datetime) -> bool:
        """The start mark the heartbeat writes (ox.start_marks), for one claim, now: False if
        the claim is no longer this one's (fenced out)."""
        ts = self.ts(conn, at)
        with conn.cursor() as cursor:
            cursor.execute(
                "UPDATE ox_task SET started_at = COALESCE(started_at, %s), last_attempted_at = %s"
                " WHERE id = %s AND fence = %s AND status = 'RUNNING'",
                [ts, ts, self.id(task_id), fence],
            )
            return cursor.rowcount == 1

    def set_running(
        self, conn: BaseDatabaseWrapper, worker_id: str, ids: Sequence[object], lease: datetime
    ) -> list[Claimed]:
        """Claim these READY tasks by id (ids as the database returned them); the rest were
        taken meanwhile."""
        raise NotImplementedError

    def insert_tasks(self, conn: BaseDatabaseWrapper, rows: Sequence[NewTask], prepare: bool = False) -> None:
        """`prepare`: a producer's INSERT on a connection with no transaction pooler between it
        and the server, which the driver may run as a prepared statement."""
        raise NotImplementedError

    def ready_rows(
        self, conn: BaseDatabaseWrapper, queues: Sequence[str], flag: int, now: datetime, limit: int, columns: str
    ) -> list[tuple[Any, ...]]:
        """The gate's candidates: up to `limit` due READY tasks of one kind in these queues
        (limited at run time or not; paused ones left out), in claim order, unlocked, as
        rows of `columns`."""
        raise NotImplementedError

    def gate_in_round_trips(self, conn: BaseDatabaseWrapper) -> Any:
        """Where the database can carry the gate's steps in two round trips, the module that
        does (lock_and_read, finish, rollback), if this connection can; else None: the gate
        runs a statement per step in one transaction."""
        return None

    def rescue_and_mark(
        self, conn: BaseDatabaseWrapper, now: datetime, max_lost: int, liveness_grace: float
    ) -> tuple[list[tuple[uuid.UUID, str, str]], list[str]]:
        raise NotImplementedError

    # ------------------------------------------------------------------ shared operations
    def levels(
        self, conn: BaseDatabaseWrapper, queues: Sequence[str], gate: Gate = False
    ) -> dict[tuple[str, int], list[int]]:
        """(queue, is_async) -> the priorities of its READY tasks, highest first."""
        levels, params = levels_cte(queues, ("0", "1"), gate, self.text_type)
        out: dict[tuple[str, int], list[int]] = {}
        with conn.cursor() as cursor:
            cursor.execute(
                f"WITH RECURSIVE {levels} SELECT queue, is_async, priority FROM levels WHERE priority IS NOT NULL",
                params,
            )
            for queue, flag, priority in cursor.fetchall():
                out.setdefault((queue, int(flag)), []).append(int(priority))
        for found in out.values():
            found.sort(reverse=True)
        return out

    def earliest_ready(
        self, conn: BaseDatabaseWrapper, queues: Sequence[str], kinds: tuple[bool, bool], gate: Gate
    ) -> datetime | None:
        flags = [self.flag(kind) for kind, wanted in enumerate(kinds) if wanted]
        queues = distinct(queues)
        if not flags or not queues:
            return None
        levels, params = levels_cte(queues, flags, gate, self.text_type)
        sql = (
            f"WITH RECURSIVE {levels} SELECT min((SELECT min(t.run_after) {LEVEL_READY} AND t.priority = l.priority))"
            " FROM levels l WHERE l.priority IS NOT NULL"
        )
        with conn.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        return read_ts(row[0]) if row and row[0] is not None else None

    def one_row(self, conn: BaseDatabaseWrapper, r: NewTask) -> tuple[str, list[object]]:
        sql = (
            f"INSERT INTO ox_task ({INSERT_COLUMNS}) VALUES (%s, %s, %s, %s, 'READY', %s, %s, %s, %s, 0, %s, '', 0,"
            f" {self.false}, %s, %s, %s, %s, %s, %s, %s)"
        )
        params = [
            self.id(r.id),
            r.task_path,
            r.queue,
            r.priority,
            json.dumps(r.args) if r.args else "[]",  # most calls pass none: skip the encoder
            json.dumps(r.kwargs) if r.kwargs else "{}",
            self.ts(conn, r.run_after),
            self.ts(conn, r.enqueued_at),
            r.max_attempts,
            r.is_async,
            self.ts(conn, r.scheduled_for),
            r.unique_key,
            r.unique_states,
            self.ts(conn, r.unique_until),
            r.limit_key,
            None if r.metadata is None else json.dumps(r.metadata),
        ]
        return sql, params

    def insert_unique(self, conn: BaseDatabaseWrapper, row: NewTask, prepare: bool = False) -> bool:
        sql, params = self.one_row(conn, row)
        with conn.cursor() as cursor:
            # The row count says whether it went in (no RETURNING to fetch: cheaper).
            cursor.execute(f"{sql} ON CONFLICT DO NOTHING", params)
            return cursor.rowcount == 1

    def holder_of(self, conn: BaseDatabaseWrapper, key: str) -> uuid.UUID | None:
        with conn.cursor() as cursor:
            cursor.execute(f"SELECT id FROM ox_task WHERE unique_key = %s AND {UNIQUE_HELD}", [key])
            row = cursor.fetchone()
        return None if row is None else read_id(row[0])

    def fail(self, conn: BaseDatabaseWrapper, failure: Failure, status: str) -> str | None:
        finished_at = None if status == "READY" else failure.finished_at
        run_after = failure.retry_at or failure.finished_at
        ts_done = self.ts(conn, failure.finished_at)
        with self.transaction(conn) as cursor:
            cursor.execute(
                "UPDATE ox_task SET status = CASE WHEN cancel_requested THEN 'CANCELLED' ELSE %s END,"
                " run_after = %s, finished_at = CASE WHEN cancel_requested THEN %s ELSE %s END,"
                " lease_expires_at = NULL, started_at = COALESCE(started_at, %s), last_attempted_at = %s"
                " WHERE id = %s AND fence = %s AND status = 'RUNNING' RETURNING status",
                [
                    status,
                    self.ts(conn, run_after),
                    ts_done,
                    self.ts(conn, finished_at),
                    self.ts(conn, failure.started_at),
                    self.ts(conn, failure.started_at),
                    self.id(failure.id),
                    failure.fence,
                ],
            )
            row = cursor.fetchone()
            if row is None:
                return None
            self.record_attempt(conn, cursor, failure)
        return str(row[0])

    def record_attempt(self, conn: BaseDatabaseWrapper, cursor: Any, failure: Failure) -> None:
        cursor.execute(
            _INSERT_ATTEMPT,
            [
                self.id(failure.id),
                failure.attempt,
                failure.worker_id,
                self.ts(conn, failure.started_at),
                self.ts(conn, failure.finished_at),
                failure.outcome,
                failure.exception_class_path,
                failure.traceback,
            ],
        )

    def attempt_history(
        self, conn: BaseDatabaseWrapper, ids: Sequence[uuid.UUID]
    ) -> dict[uuid.UUID, list[tuple[str, str, str]]]:
        marks = ", ".join(["%s"] * len(ids))
        out: dict[uuid.UUID, list[tuple[str, str, str]]] = {}
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT task_id, exception_class_path, traceback, worker_id FROM ox_attempt"
                f" WHERE task_id IN ({marks}) ORDER BY task_id, number, id",
                [self.id(i) for i in ids],
            )
            for task_id, path, text, worker in cursor.fetchall():
                out.setdefault(read_id(task_id), []).append((path, text, worker))
        return out

    # ------------------------------------------------------------------ the duties
    def duty_lock(self, cursor: Any, key: int, wait: bool) -> bool:
        """One pruner, one archiver at a time, for the rest of the transaction: False when
        another holds it (not waiting). Here the transaction's write lock is that lock."""
        return True

    def move_sql(self, src: str, dst: str, cols: str, pick: str) -> list[str]:
        """Statements moving the rows `pick` selects from `src` to `dst`, each taking the
        pick's parameters. One writer at a time (the IMMEDIATE transaction): the same pick
        selects the same rows twice."""
        return [
            f"INSERT INTO {dst} ({cols}) SELECT {cols} FROM {src} WHERE id IN ({pick})",
            f"DELETE FROM {src} WHERE id IN ({pick})",
        ]

    def move_rows(self, cursor: Any, src: str, dst: str, cols: str, pick: str, params: list[object]) -> int:
        """Inside a transaction: move the rows `pick` selects; how many moved."""
        counts = []
        for statement in self.move_sql(src, dst, cols, pick):
            cursor.execute(statement, params)
            counts.append(cursor.rowcount)
        if len(set(counts)) != 1:  # what was copied is what was deleted, or nothing
            raise RuntimeError(f"a move copied {counts[0]} rows but deleted {counts[-1]}")
        return counts[0]

    def move_back(self, cursor: Any, cols: str, ids: list[object], statuses: str) -> list[object]:
        """Inside the caller's transaction: the archived tasks among `ids` whose status is
        one of `statuses` (SQL literals) moved back to ox_task; their ids."""
        match, params = self.in_list(ids)
        where = f"WHERE id {match} AND status IN ({statuses})"
        cursor.execute(f"SELECT id FROM ox_task_archive {where}{self.for_update}", params)
        found = [row[0] for row in cursor.fetchall()]
        if found:
            cursor.execute(f"INSERT INTO ox_task ({cols}) SELECT {cols} FROM ox_task_archive {where}", params)
            cursor.execute(f"DELETE FROM ox_task_archive {where}", params)
        return found

    # ------------------------------------------------------------------ the worker's row
    def hold_worker_lock(self, conn: BaseDatabaseWrapper, lock_key: int) -> None:
        """Where the database has session locks: hold the worker's liveness lock for the life
        of this session (a rescuer finding it free knows the worker is gone)."""

    def heartbeat(self, conn: BaseDatabaseWrapper, worker_id: str, now: datetime, clear_idle: bool) -> None:
        with conn.cursor() as cursor:
            # stopped_at and lock_lost_at cleared: a rescuer may have seen this worker's lock
            # free while its connection was down; it is back. idle_since: see ox.idle.
            cursor.execute(
                "UPDATE ox_worker SET heartbeat_at = %s, stopped_at = NULL, lock_lost_at = NULL"
                + (", idle_since = NULL" if clear_idle else "")
                + " WHERE id = %s",
                [self.ts(conn, now), worker_id],
            )

    def mark_idle(self, conn: BaseDatabaseWrapper, worker_id: str, now: datetime) -> None:
        with conn.cursor() as cursor:
            cursor.execute("UPDATE ox_worker SET idle_since = %s WHERE id = %s", [self.ts(conn, now), worker_id])

    def register_worker(self, conn: BaseDatabaseWrapper, row: WorkerRow) -> None:
        ts = self.ts(conn, row.now)
        with conn.cursor() as cursor:
            cursor.execute(
                "INSERT INTO ox_worker (id, host, pid, queues, concurrency, lock_key, started_at, heartbeat_at)"
                f" VALUES (%s, %s, %s, %s, %s, %s, %s, %s){self.skip_duplicate('id')}",  # a retried start
                [row.id, row.host, row.pid, json.dumps(row.queues), row.concurrency, row.lock_key, ts, ts],
            )

    def worker_stopped(self, conn: BaseDatabaseWrapper, worker_id: str, now: datetime) -> None:
        with conn.cursor() as cursor:
            cursor.execute("UPDATE ox_worker SET stopped_at = %s WHERE id = %s", [self.ts(conn, now), worker_id])

    # ------------------------------------------------------------------ around the operations
    # What a database needs or can tell beyond ox's statements, each a no-op or None here so a
    # new database's driver overrides only what it has.
    def worker_options(self, options: dict[str, Any], pooled: bool, idle_limit: float) -> dict[str, str] | None:
        """Tune a worker connection's OPTIONS (a copy of the database's, in place); the
        settings start_worker_session gives its server session at every connect, or None.
        `pooled`: behind a transaction pooler; `idle_limit`: the longest the worker leaves
        the session silent (ox.connection)."""
        return None

    def start_worker_session(self, conn: BaseDatabaseWrapper, server: dict[str, str]) -> None:
        """Apply what worker_options returned to a worker connection that just connected."""

    def table_health(self, conn: BaseDatabaseWrapper, max_xact_age: float, table: str) -> Any:
        """What the database says of `table`'s health (ox.tablehealth): its own dataclass, or
        None where it says nothing, or the table does not exist yet."""
        return None

    def backlog_rows(self, conn: BaseDatabaseWrapper, now: datetime, limit: int) -> list[tuple[Any, ...]] | None:
        """(queue, due, scheduled, oldest due run_after) per queue with READY tasks, each
        count stopping at `limit`, in queue order, where the database has a bounded statement
        for it; None: ox.health counts with the ORM."""
        return None

    def lock_not_held(self, conn: BaseDatabaseWrapper, key: str) -> tuple[str, list[Any]]:
        """A condition on the worker lock key `key` (a column): true unless a live session
        holds that worker's liveness lock. Where there are no session locks, always true."""
        return "", []

    def collation_problems(self, conn: BaseDatabaseWrapper) -> list[str]:
        """What is wrong with how ox's tables compare text (the check ox.W007); nothing
        where the database's defaults compare as ox needs."""
        return []
