"""MariaDB (10.6+): no UPDATE ... RETURNING, so an operation that must know which rows it
wrote locks them first (SELECT ... FOR UPDATE, SKIP LOCKED where workers compete) and updates
them by id in one transaction; lists travel as one JSON document read with JSON_TABLE (the
read driving the join, STRAIGHT_JOIN, so each row is one primary-key probe). A worker's
liveness is a named lock its session holds (GET_LOCK), free the moment the session dies
(IS_USED_LOCK). No LISTEN/NOTIFY: an idle worker's listener waits in GET_LOCK() and producers
cut it short with KILL QUERY after commit (ox.db.mysql.wake). The partial indexes are full ones
led by status there (ox.db.indexes), the unique index a generated column (migration 0016)."""

import json
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.db import IntegrityError, OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db.base import LOST_COUNTED, LOST_TRACEBACK, Held
from ox.db.dialect import DEADLOCK_TRIES, after_deadlock
from ox.db.mysql import charset, health, session, wake
from ox.db.mysql.claim import MysqlClaims
from ox.db.mysql.locks import listen_lock_name, lock_name, lock_prefix, take_lock
from ox.db.rows import Claimed, Completion, Failure, NewTask, read_id, read_ts
from ox.db.walks import Gate
from ox.exceptions import WorkerLost, class_path

_DONE = (
    "JSON_TABLE(%s, '$[*]' COLUMNS (id CHAR(36) PATH '$[0]', fence BIGINT PATH '$[1]', rv LONGTEXT PATH '$[2]',"
    " st DATETIME(6) PATH '$[3]', at DATETIME(6) PATH '$[4]',"
    # The collation of MariaDB's JSON columns (the database's own, utf8mb4_nopad_bin, would
    # not mix with the metadata column's in COALESCE).
    " md LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[5]')) AS v"
)
_HELD = (
    "JSON_TABLE(%s, '$[*]' COLUMNS (id CHAR(36) PATH '$[0]', fence BIGINT PATH '$[1]',"
    " st DATETIME(6) PATH '$[2]')) AS v"
)


class MysqlDriver(MysqlClaims):
    vendor: ClassVar[str] = "mysql"
    true: ClassVar[str] = "1"
    false: ClassVar[str] = "0"
    begin: ClassVar[str] = "START TRANSACTION"
    text_type: ClassVar[str] = "CHAR"
    session_locks: ClassVar[bool] = True
    notifies: ClassVar[bool] = True  # by KILL QUERY (ox.db.mysql.wake)
    lossy_wakeups: ClassVar[bool] = True  # a KILL between two waits ends nothing
    clock_sql: ClassVar[str] = "SELECT UTC_TIMESTAMP(6)"  # naive, in UTC
    repeats_pick: ClassVar[bool] = False
    correlates_into_cte: ClassVar[bool] = False

    def id(self, value: uuid.UUID) -> object:
        return value.hex

    def notify(self, cursor: Any, channel: str, payload: str) -> None:
        wake.wake_later(cursor.db, lock_prefix(cursor.db), [payload])

    def listen(
        self,
        conn: BaseDatabaseWrapper,
        lock_key: int,
        queues: frozenset[str],
        wake_worker: Callable[[], None],
        stopped: threading.Event,
        ready: Callable[[], None],
    ) -> None:
        wake.listen(conn, listen_lock_name(conn, lock_key), wake_worker, stopped, ready)

    def in_list(self, values: Sequence[object]) -> tuple[str, list[object]]:
        if not values:
            return "IN (SELECT 1 FROM DUAL WHERE FALSE)", []
        return f"IN ({', '.join(['%s'] * len(values))})", list(values)

    def skip_duplicate(self, key: str) -> str:
        return f" ON DUPLICATE KEY UPDATE {key} = {key}"

    def upsert(self, conflict: Sequence[str], update: Sequence[str]) -> str:
        return " ON DUPLICATE KEY UPDATE " + ", ".join(f"{c} = VALUES({c})" for c in update)

    def deadlocked(self, exc: BaseException) -> bool:
        return bool(getattr(exc, "args", None)) and exc.args[0] == 1213  # ER_LOCK_DEADLOCK

    def update_returning(
        self,
        conn: BaseDatabaseWrapper,
        table: str,
        sets: str,
        set_params: Sequence[object],
        where: str,
        where_params: Sequence[object],
        columns: str,
        order: str = "",
        limit: int | None = None,
        cursor: Any = None,
    ) -> list[tuple[Any, ...]]:
        # The rows locked first, then written by id, in one transaction: there is no
        # RETURNING, and no LIMIT in an IN subquery either.
        if cursor is None:
            with self.transaction(conn) as own:
                return self.update_returning(
                    conn, table, sets, set_params, where, where_params, columns, order, limit, own
                )
        pick = f"SELECT id, {columns} FROM {table} WHERE {where}"
        if limit is None:
            cursor.execute(f"{pick} FOR UPDATE", list(where_params))
        else:
            cursor.execute(f"{pick} ORDER BY {order} LIMIT %s FOR UPDATE SKIP LOCKED", [*where_params, limit])
        rows = cursor.fetchall()
        if rows:
            match, ids = self.in_list([r[0] for r in rows])
            cursor.execute(f"UPDATE {table} SET {sets} WHERE id {match}", [*set_params, *ids])
        return [tuple(r[1:]) for r in rows]

    def insert_new(self, conn: BaseDatabaseWrapper, cursor: Any, insert: str, params: Sequence[object]) -> bool:
        # A duplicate key fails the statement only (InnoDB rolls back that statement, not
        # the transaction); no other error is taken for a duplicate.
        try:
            cursor.execute(insert, list(params))
        except IntegrityError as error:
            if error.args and error.args[0] == 1062:  # ER_DUP_ENTRY
                return False
            raise
        return True

    def begin_read_committed(self) -> list[str]:
        # SET TRANSACTION applies to the next transaction only, and must come before it.
        return ["SET TRANSACTION ISOLATION LEVEL READ COMMITTED", self.begin]

    # ------------------------------------------------------------------ completion
    def _complete(self, conn: BaseDatabaseWrapper, cursor: Any, done: Sequence[Completion]) -> set[Held]:
        """Inside a transaction: lock the claims still held, then write them."""
        if not done:
            return set()
        payload = json.dumps(
            [
                [
                    d.id.hex,
                    d.fence,
                    d.return_json,
                    self.ts(conn, d.started_at),
                    self.ts(conn, d.finished_at),
                    d.metadata_json,  # its text as a JSON string; null for none
                ]
                for d in done
            ]
        )
        join = f"FROM {_DONE} STRAIGHT_JOIN ox_task t ON t.id = v.id AND t.fence = v.fence WHERE t.status = 'RUNNING'"
        cursor.execute(f"SELECT t.id, t.fence {join} FOR UPDATE", [payload])
        written = {(read_id(r[0]), int(r[1])) for r in cursor.fetchall()}
        if written:
            cursor.execute(
                f"UPDATE {_DONE} STRAIGHT_JOIN ox_task t ON t.id = v.id AND t.fence = v.fence"
                " SET t.status = 'SUCCESSFUL', t.return_value = v.rv, t.finished_at = v.at, t.lease_expires_at = NULL,"
                " t.started_at = COALESCE(t.started_at, v.st), t.last_attempted_at = v.st,"
                " t.metadata = COALESCE(v.md, t.metadata) WHERE t.status = 'RUNNING'",
                [payload],
            )
        return written

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
        with self.transaction(conn) as cursor:
            written = self._complete(conn, cursor, done)
            claimed = self._claim_in_transaction(conn, cursor, worker_id, queues, limits, now, lease_expires_at, gate)
            return written, claimed

    def complete(self, conn: BaseDatabaseWrapper, done: Sequence[Completion]) -> set[Held]:
        with self.transaction(conn) as cursor:
            return self._complete(conn, cursor, done)

    def _held(self, conn: BaseDatabaseWrapper, held: Sequence[tuple[uuid.UUID, int, datetime | None]]) -> str:
        return json.dumps([[i.hex, f, self.ts(conn, st) if st else None] for i, f, st in held])

    def renew(
        self, conn: BaseDatabaseWrapper, held: Sequence[tuple[uuid.UUID, int, datetime | None]], lease: datetime
    ) -> dict[Held, bool]:
        payload = self._held(conn, held)
        join = f"{_HELD} STRAIGHT_JOIN ox_task t ON t.id = v.id AND t.fence = v.fence"
        with self.transaction(conn) as cursor:
            cursor.execute(
                f"SELECT t.id, t.fence, t.cancel_requested FROM {join} WHERE t.status = 'RUNNING' FOR UPDATE", [payload]
            )
            kept = {(read_id(r[0]), int(r[1])): bool(r[2]) for r in cursor.fetchall()}
            if kept:
                cursor.execute(
                    f"UPDATE {join} SET t.lease_expires_at = %s, t.started_at = COALESCE(t.started_at, v.st),"
                    " t.last_attempted_at = COALESCE(v.st, t.last_attempted_at) WHERE t.status = 'RUNNING'",
                    [payload, self.ts(conn, lease)],
                )
        return kept

    def hand_back(self, conn: BaseDatabaseWrapper, held: Sequence[Held], now: datetime) -> int:
        payload = self._held(conn, [(i, f, None) for i, f in held])
        with conn.cursor() as cursor:
            # One statement: SET runs left to right, so finished_at reads cancel_requested
            # before status changes (it does not read status).
            cursor.execute(
                f"UPDATE {_HELD} STRAIGHT_JOIN ox_task t ON t.id = v.id AND t.fence = v.fence"
                " SET t.finished_at = CASE WHEN t.cancel_requested THEN %s END,"
                " t.status = CASE WHEN t.cancel_requested THEN 'CANCELLED' ELSE 'READY' END,"
                " t.attempts = t.attempts - 1, t.fence = t.fence + 1, t.lease_expires_at = NULL, t.worker_id = ''"
                " WHERE t.status = 'RUNNING'",
                [payload, self.ts(conn, now)],
            )
            return cursor.rowcount

    def fail(self, conn: BaseDatabaseWrapper, failure: Failure, status: str) -> str | None:
        with self.transaction(conn) as cursor:
            cursor.execute(
                "SELECT cancel_requested FROM ox_task WHERE id = %s AND fence = %s AND status = 'RUNNING' FOR UPDATE",
                [self.id(failure.id), failure.fence],
            )
            row = cursor.fetchone()
            if row is None:
                return None
            if row[0]:
                status = "CANCELLED"
            finished_at = None if status == "READY" else failure.finished_at
            cursor.execute(
                "UPDATE ox_task SET status = %s, run_after = %s, finished_at = %s, lease_expires_at = NULL,"
                " started_at = COALESCE(started_at, %s), last_attempted_at = %s WHERE id = %s",
                [
                    status,
                    self.ts(conn, failure.retry_at or failure.finished_at),
                    self.ts(conn, finished_at),
                    self.ts(conn, failure.started_at),
                    self.ts(conn, failure.started_at),
                    self.id(failure.id),
                ],
            )
            self.record_attempt(conn, cursor, failure)
        return status

    # ------------------------------------------------------------------ enqueue
    def insert_tasks(self, conn: BaseDatabaseWrapper, rows: Sequence[NewTask], prepare: bool = False) -> None:
        sql, params = self.one_row(conn, rows[0])
        with conn.cursor() as cursor:
            if len(rows) == 1:
                cursor.execute(sql, params)
            else:
                # mysqlclient sends an INSERT's rows as one multi-row statement.
                cursor.executemany(sql, [self.one_row(conn, r)[1] for r in rows])
        wake.wake_later(conn, lock_prefix(conn), {r.queue for r in rows})

    def insert_unique(self, conn: BaseDatabaseWrapper, row: NewTask, prepare: bool = False) -> bool:
        """A duplicate key is refused by ox_task_unique (its error is a statement's only: the
        caller's transaction goes on, and nothing of this row was written)."""
        sql, params = self.one_row(conn, row)
        for attempt in range(DEADLOCK_TRIES):
            try:
                with conn.cursor() as cursor:
                    cursor.execute(sql, params)
            except IntegrityError as error:
                if "ox_task_unique" in str(error):
                    return False
                raise
            except OperationalError as error:
                # Inserts waiting on a key its holder lets go of deadlock with each other
                # (each took a shared lock on the key, each wants it exclusively); the victim,
                # in autocommit, lost only this statement: again. Inside a transaction the
                # victim's whole transaction is gone (also one the caller opened by turning
                # autocommit off): the caller's to retry (ox.enqueue).
                if (
                    conn.in_atomic_block
                    or not conn.get_autocommit()
                    or attempt == DEADLOCK_TRIES - 1
                    or not self.deadlocked(error)
                ):
                    raise
                after_deadlock(attempt)
                continue
            wake.wake_later(conn, lock_prefix(conn), [row.queue])
            return True
        raise AssertionError("unreachable")

    def holder_of(self, conn: BaseDatabaseWrapper, key: str) -> uuid.UUID | None:
        with conn.cursor() as cursor:
            cursor.execute("SELECT id FROM ox_task WHERE unique_held = %s", [key])
            row = cursor.fetchone()
        return None if row is None else read_id(row[0])

    # ------------------------------------------------------------------ the duties
    def move_sql(self, src: str, dst: str, cols: str, pick: str) -> list[str]:
        raise NotImplementedError("MariaDB moves rows by id (move_rows)")

    def move_rows(self, cursor: Any, src: str, dst: str, cols: str, pick: str, params: list[object]) -> int:
        """The picked rows locked first (SKIP LOCKED: what a retry or another archiver holds
        waits for a later batch), then copied and deleted by id: MariaDB takes no LIMIT in an
        IN (subquery)."""
        cursor.execute(f"{pick}{self.skip_locked}", params)
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return 0
        match, id_params = self.in_list(ids)
        cursor.execute(f"INSERT INTO {dst} ({cols}) SELECT {cols} FROM {src} WHERE id {match}", id_params)
        cursor.execute(f"DELETE FROM {src} WHERE id {match}", id_params)
        return cursor.rowcount

    # ------------------------------------------------------------------ session, health, checks
    def worker_options(self, options: dict[str, Any], pooled: bool, idle_limit: float) -> dict[str, str] | None:
        return session.worker_options(options, idle_limit)

    def start_worker_session(self, conn: BaseDatabaseWrapper, server: dict[str, str]) -> None:
        session.start_session(conn, server)

    def table_health(self, conn: BaseDatabaseWrapper, max_xact_age: float, table: str) -> Any:
        return health.innodb_table_health(conn, max_xact_age, table)

    def collation_problems(self, conn: BaseDatabaseWrapper) -> list[str]:
        return charset.collation_problems(conn)

    # ------------------------------------------------------------------ liveness and rescue
    def lock_not_held(self, conn: BaseDatabaseWrapper, key: str) -> tuple[str, list[Any]]:
        return f" AND NOT ({key} > 0 AND IS_USED_LOCK(CONCAT(%s, {key})) IS NOT NULL)", [lock_prefix(conn)]

    def hold_worker_lock(self, conn: BaseDatabaseWrapper, lock_key: int) -> None:
        take_lock(conn, lock_name(conn, lock_key))

    def rescue_and_mark(
        self, conn: BaseDatabaseWrapper, now: datetime, max_lost: int, liveness_grace: float
    ) -> tuple[list[tuple[uuid.UUID, str, str]], list[str]]:
        """A live worker's session holds its named lock. A worker whose lock is free is marked;
        still free `liveness_grace` seconds later, the worker is dead, whatever its leases
        say. Rescuers need no lock of their own: each takes the lost tasks it can lock
        (SKIP LOCKED), so two never rescue one task."""
        ts = self.ts(conn, now)
        prefix = lock_prefix(conn)
        with self.transaction(conn) as cursor:
            cursor.execute(
                "SELECT w.id, w.lock_lost_at FROM ox_worker w WHERE w.lock_key > 0"
                " AND w.id IN (SELECT worker_id FROM ox_task WHERE status = 'RUNNING'"
                " UNION SELECT worker_id FROM ox_slot WHERE worker_id <> '')"
                " AND IS_USED_LOCK(CONCAT(%s, w.lock_key)) IS NULL",
                [prefix],
            )
            lockless = cursor.fetchall()
            marked = [w for w, lost_at in lockless if lost_at is None]
            if marked:
                match, params = self.in_list(marked)
                cursor.execute(
                    f"UPDATE ox_worker SET lock_lost_at = %s WHERE id {match} AND lock_lost_at IS NULL", [ts, *params]
                )
            cutoff = now - timedelta(seconds=liveness_grace)
            dead = [w for w, lost_at in lockless if lost_at is not None and read_ts(lost_at) <= cutoff]
            dead_match, dead_params = self.in_list(dead)
            if dead:
                cursor.execute(
                    f"UPDATE ox_slot SET worker_id = '', expires_at = NULL WHERE worker_id {dead_match}", dead_params
                )
            cursor.execute(
                "SELECT t.id, t.attempts, t.worker_id, t.last_attempted_at, t.cancel_requested,"
                f" (SELECT count(*) FROM ox_attempt a WHERE a.task_id = t.id AND a.outcome = 'lost' AND {LOST_COUNTED})"
                f" FROM ox_task t WHERE t.status = 'RUNNING' AND (t.lease_expires_at < %s OR t.worker_id {dead_match})"
                " FOR UPDATE SKIP LOCKED",
                [ts, *dead_params],
            )
            lost = cursor.fetchall()
            out: list[tuple[uuid.UUID, str, str]] = []
            by_status: dict[str, list[object]] = {}
            for task_id, attempts, worker, at, cancel, lost_before in lost:
                counts = at is not None or attempts <= 1  # LOSS_COUNTS
                status = "CANCELLED" if cancel else "FAILED" if counts and lost_before + 1 >= max_lost else "READY"
                by_status.setdefault(status, []).append(task_id)
                out.append((read_id(task_id), worker, status))
            for status, ids in by_status.items():
                match, params = self.in_list(ids)
                cursor.execute(
                    "UPDATE ox_task SET status = %s, finished_at = %s, max_attempts = max_attempts + 1,"
                    f" lease_expires_at = NULL, fence = fence + 1 WHERE id {match}",
                    [status, None if status == "READY" else ts, *params],
                )
            if lost:
                path = class_path(WorkerLost)
                cursor.executemany(
                    "INSERT INTO ox_attempt (task_id, number, worker_id, started_at, finished_at, outcome,"
                    " exception_class_path, traceback) VALUES (%s, %s, %s, %s, %s, 'lost', %s, %s)",
                    [
                        [task_id, attempts, worker, at, ts, path, LOST_TRACEBACK.replace("{worker}", worker)]
                        for task_id, attempts, worker, at, _c, _n in lost
                    ],
                )
        return out, marked
