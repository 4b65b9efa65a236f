"""SQLite: one writer at a time, so a claim, a rescue or a batch of the duties is one
IMMEDIATE transaction (the write lock taken up front is the lock every other database takes
on rows), and statements cost no round trip, so an operation may be several of them. Lists
of values travel as one JSON parameter read with json_each()."""

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, ClassVar

from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db.base import INSERT_COLUMNS, LOSS_COUNTS, LOST_COUNTED, LOST_TRACEBACK, SET_RUNNING, Driver, Held
from ox.db.rows import CLAIM_COLUMNS, Claimed, Completion, NewTask, read_claimed, read_id, read_ts
from ox.db.walks import Gate, distinct
from ox.exceptions import WorkerLost, class_path

Levels = dict[tuple[str, int], list[int]]  # (queue, is_async) -> priorities waiting, highest first

_COMPLETE = (
    "UPDATE ox_task SET status = 'SUCCESSFUL', return_value = json_extract(v.value, '$[2]'),"
    " finished_at = json_extract(v.value, '$[4]'), lease_expires_at = NULL,"
    " started_at = COALESCE(ox_task.started_at, json_extract(v.value, '$[3]')),"
    " last_attempted_at = json_extract(v.value, '$[3]'),"
    " metadata = COALESCE(json_extract(v.value, '$[5]'), ox_task.metadata)"
    " FROM json_each(%s) AS v"
    " WHERE ox_task.id = json_extract(v.value, '$[0]') AND ox_task.fence = json_extract(v.value, '$[1]')"
    " AND ox_task.status = 'RUNNING' RETURNING ox_task.id, ox_task.fence"
)

# (id, fence, started_at) rows of one JSON parameter, as a table.
_HELD = (
    "(SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS fence,"
    " json_extract(value, '$[2]') AS st FROM json_each(%s)) AS v"
)


class SqliteDriver(Driver):
    vendor: ClassVar[str] = "sqlite"
    true: ClassVar[str] = "1"
    false: ClassVar[str] = "0"
    begin: ClassVar[str] = "BEGIN IMMEDIATE"
    for_update: ClassVar[str] = ""
    skip_locked: ClassVar[str] = ""

    # ------------------------------------------------------------------ claim
    def pick(
        self, conn: BaseDatabaseWrapper, flag: int, queues: Sequence[str], levels: Levels, now: object, limit: int
    ) -> list[object]:
        """Inside the claim's IMMEDIATE transaction (nothing to lock, one writer): the ids of
        up to `limit` due READY tasks of one kind, in claim order. Priorities from the
        highest down; per priority one range scan of the READY index per queue that has it,
        merged here; it stops as soon as `limit` are found."""
        chosen: list[object] = []
        priorities = sorted({p for q in queues for p in levels.get((q, flag), [])}, reverse=True)
        with conn.cursor() as cursor:
            for priority in priorities:
                need = limit - len(chosen)
                found: list[tuple[datetime, str, object]] = []
                for queue in queues:
                    if priority not in levels.get((queue, flag), []):
                        continue
                    cursor.execute(
                        "SELECT run_after, id FROM ox_task WHERE status = 'READY' AND queue = %s AND is_async = %s"
                        " AND priority = %s AND run_after <= %s ORDER BY run_after, id LIMIT %s",
                        [queue, flag, priority, now, need],
                    )
                    found += [(read_ts(r[0]), str(r[1]), r[1]) for r in cursor.fetchall()]
                found.sort()  # run_after, then id
                chosen += [raw for _at, _id, raw in found[:need]]
                if len(chosen) >= limit:
                    break
        return chosen

    def _claim_in_transaction(
        self,
        conn: BaseDatabaseWrapper,
        worker_id: str,
        queues: Sequence[str],
        limits: tuple[int, int],
        now: datetime,
        lease_expires_at: datetime,
        gate: Gate,
    ) -> list[Claimed]:
        """The priorities waiting, the picks, then one UPDATE of the ids picked."""
        queues = distinct(queues)
        if not queues:
            return []
        levels = self.levels(conn, queues, gate)
        ts = self.ts(conn, now)
        ids = [
            i
            for flag, limit in enumerate(limits)
            if limit > 0
            for i in self.pick(conn, flag, queues, levels, ts, limit)
        ]
        return self.set_running(conn, worker_id, ids, lease_expires_at) if ids else []

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
        with self.transaction(conn):
            return self._claim_in_transaction(conn, worker_id, queues, limits, now, lease_expires_at, gate)

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
        with self.transaction(conn):
            written = self.complete(conn, done)
            return written, self._claim_in_transaction(conn, worker_id, queues, limits, now, lease_expires_at, gate)

    def ready_rows(
        self, conn: BaseDatabaseWrapper, queues: Sequence[str], flag: int, now: datetime, limit: int, columns: str
    ) -> list[tuple[Any, ...]]:
        ids = self.pick(conn, flag, queues, self.levels(conn, queues, gate=True), self.ts(conn, now), limit)
        if not ids:
            return []
        with conn.cursor() as cursor:
            cursor.execute(
                f"SELECT {columns} FROM ox_task WHERE id IN (SELECT value FROM json_each(%s))", [json.dumps(ids)]
            )
            return cursor.fetchall()

    def set_running(
        self, conn: BaseDatabaseWrapper, worker_id: str, ids: Sequence[object], lease: datetime
    ) -> list[Claimed]:
        with conn.cursor() as cursor:
            cursor.execute(
                f"{SET_RUNNING} WHERE id IN (SELECT value FROM json_each(%s)) AND status = 'READY'"
                f" RETURNING {CLAIM_COLUMNS}",
                [worker_id, self.ts(conn, lease), json.dumps(list(ids))],
            )
            return read_claimed(cursor.fetchall())

    # ------------------------------------------------------------------ completion and leases
    def complete(self, conn: BaseDatabaseWrapper, done: Sequence[Completion]) -> set[Held]:
        # The metadata as a JSON string (its text), null for none: json_extract gives the text back.
        payload = [
            [d.id.hex, d.fence, d.return_json, self.ts(conn, d.started_at), self.ts(conn, d.finished_at)]
            + [d.metadata_json]
            for d in done
        ]
        with conn.cursor() as cursor:
            cursor.execute(_COMPLETE, [json.dumps(payload)])
            return {(read_id(r[0]), int(r[1])) for r in cursor.fetchall()}

    def _held(self, conn: BaseDatabaseWrapper, held: Sequence[tuple[uuid.UUID, int, datetime | None]]) -> str:
        return json.dumps([[i.hex, f, self.ts(conn, st) if st else None] for i, f, st in held])

    def renew(
        self, conn: BaseDatabaseWrapper, held: Sequence[tuple[uuid.UUID, int, datetime | None]], lease: datetime
    ) -> dict[Held, bool]:
        sql = (
            "UPDATE ox_task SET lease_expires_at = %s, started_at = COALESCE(ox_task.started_at, v.st),"
            " last_attempted_at = COALESCE(v.st, ox_task.last_attempted_at)"
            f" FROM {_HELD} WHERE ox_task.id = v.id AND ox_task.fence = v.fence AND ox_task.status = 'RUNNING'"
            " RETURNING ox_task.id, ox_task.fence, ox_task.cancel_requested"
        )
        with conn.cursor() as cursor:
            cursor.execute(sql, [self.ts(conn, lease), self._held(conn, held)])
            return {(read_id(r[0]), int(r[1])): bool(r[2]) for r in cursor.fetchall()}

    def hand_back(self, conn: BaseDatabaseWrapper, held: Sequence[Held], now: datetime) -> int:
        sql = (
            "UPDATE ox_task SET status = CASE WHEN ox_task.cancel_requested THEN 'CANCELLED' ELSE 'READY' END,"
            " finished_at = CASE WHEN ox_task.cancel_requested THEN %s END,"
            " attempts = ox_task.attempts - 1, fence = ox_task.fence + 1, lease_expires_at = NULL, worker_id = ''"
            f" FROM {_HELD} WHERE ox_task.id = v.id AND ox_task.fence = v.fence AND ox_task.status = 'RUNNING'"
        )
        with conn.cursor() as cursor:
            cursor.execute(sql, [self.ts(conn, now), self._held(conn, [(i, f, None) for i, f in held])])
            return cursor.rowcount

    # ------------------------------------------------------------------ enqueue
    def insert_tasks(self, conn: BaseDatabaseWrapper, rows: Sequence[NewTask], prepare: bool = False) -> None:
        """Many rows as one JSON document, read with json_each()."""
        if len(rows) == 1:
            sql, params = self.one_row(conn, rows[0])
        else:
            x = [f"json_extract(value, '$[{i}]')" for i in range(16)]
            sql = (
                f"INSERT INTO ox_task ({INSERT_COLUMNS})"
                f" SELECT {x[0]}, {x[1]}, {x[2]}, {x[3]}, 'READY', {x[4]}, {x[5]}, {x[6]}, {x[7]}, 0, {x[8]}, '', 0, 0,"
                f" {x[9]}, {x[10]}, {x[11]}, {x[12]}, {x[13]}, {x[14]},"
                # json_extract gives a JSON object back as its text: stored as given.
                f" json(json_extract(value, '$[15]')) FROM json_each(%s)"
            )
            ts = self.ts
            payload = [
                [r.id.hex, r.task_path, r.queue, r.priority, r.args, r.kwargs]
                + [ts(conn, r.run_after), ts(conn, r.enqueued_at), r.max_attempts, int(r.is_async)]
                + [ts(conn, r.scheduled_for), r.unique_key, r.unique_states, ts(conn, r.unique_until), r.limit_key]
                + [r.metadata]
                for r in rows
            ]
            params = [json.dumps(payload)]
        with conn.cursor() as cursor:
            cursor.execute(sql, params)

    # ------------------------------------------------------------------ rescue
    def rescue_and_mark(
        self, conn: BaseDatabaseWrapper, now: datetime, max_lost: int, liveness_grace: float
    ) -> tuple[list[tuple[uuid.UUID, str, str]], list[str]]:
        """No session locks: a task is lost when its lease ran out. The IMMEDIATE transaction
        is the rescuer's lock, and both statements see the same expired set."""
        ts = self.ts(conn, now)
        with self.transaction(conn) as cursor:
            cursor.execute(
                "INSERT INTO ox_attempt (task_id, number, worker_id, started_at, finished_at, outcome,"
                " exception_class_path, traceback)"
                " SELECT id, attempts, worker_id, last_attempted_at, %s, 'lost', %s, replace(%s, '{worker}', worker_id)"
                " FROM ox_task WHERE status = 'RUNNING' AND lease_expires_at < %s",
                [ts, class_path(WorkerLost), LOST_TRACEBACK, ts],
            )
            # The loss just recorded is among those counted when it counts (LOSS_COUNTS).
            give_up = (
                f"({LOSS_COUNTS} AND (SELECT count(*) FROM ox_attempt a"
                f" WHERE a.task_id = t.id AND a.outcome = 'lost' AND {LOST_COUNTED}) >= %s)"
            )
            cursor.execute(
                "UPDATE ox_task AS t SET"
                f" status = CASE WHEN cancel_requested THEN 'CANCELLED' WHEN {give_up} THEN 'FAILED'"
                " ELSE 'READY' END,"
                f" finished_at = CASE WHEN cancel_requested OR {give_up} THEN %s END,"
                " max_attempts = max_attempts + 1, lease_expires_at = NULL, fence = fence + 1"
                " WHERE status = 'RUNNING' AND lease_expires_at < %s RETURNING id, worker_id, status",
                [max_lost, max_lost, ts, ts],
            )
            return [(read_id(r[0]), r[1], r[2]) for r in cursor.fetchall()], []
