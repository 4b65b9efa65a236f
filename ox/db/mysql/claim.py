"""MariaDB's claim: the candidates read without locks (one range scan of the READY index per
queue and priority), then locked in claim order with SKIP LOCKED a slice at a time, then
updated by id, all in one transaction: there is no UPDATE ... RETURNING to do it in one."""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db.base import Driver
from ox.db.rows import CLAIM_COLUMNS, Claimed, read_claimed, read_ts
from ox.db.walks import LEVEL_READY, Gate, candidates_per_level, distinct, levels_cte

Levels = dict[tuple[str, int], list[int]]


class MysqlClaims(Driver):
    def candidates(
        self, conn: BaseDatabaseWrapper, flag: int, levels: Levels, now: datetime, k: int, columns: str = "id"
    ) -> list[tuple[Any, ...]]:
        """Unlocked, in claim order: per queue and priority waiting, up to k due tasks, one
        range scan of the READY index each, all in one statement."""
        parts, params = [], []
        ts = self.ts(conn, now)
        for (queue, kind), priorities in sorted(levels.items()):
            if kind != flag:
                continue
            for priority in priorities:
                parts.append(
                    f"(SELECT {columns} FROM ox_task WHERE status = 'READY' AND queue = %s AND is_async = {kind}"
                    " AND priority = %s AND run_after <= %s ORDER BY run_after, id LIMIT %s)"
                )
                params += [queue, priority, ts, k]
        if not parts:
            return []
        with conn.cursor() as cursor:
            cursor.execute(" UNION ALL ".join(parts), params)
            return cursor.fetchall()

    def _pick_and_lock(
        self, conn: BaseDatabaseWrapper, cursor: Any, flag: int, levels: Levels, now: datetime, limit: int
    ) -> list[tuple[Any, ...]]:
        """Inside the claim's transaction: the best `limit` candidates nobody holds, locked
        (SKIP LOCKED: a row another claim holds is passed over, never waited for), as
        CLAIM_COLUMNS rows. Only what is taken is locked: the candidates in claim order, a
        slice of them at a time."""
        rows = self.candidates(conn, flag, levels, now, candidates_per_level(limit), "id, priority, run_after")
        order = sorted(rows, key=lambda r: (-int(r[1]), read_ts(r[2]), str(r[0])))
        ids = [r[0] for r in order]
        taken: list[tuple[Any, ...]] = []
        while ids and len(taken) < limit:
            want = limit - len(taken)
            batch, ids = ids[:want], ids[want:]
            match, params = self.in_list(batch)
            cursor.execute(
                f"SELECT {CLAIM_COLUMNS} FROM ox_task WHERE id {match} AND status = 'READY' FOR UPDATE SKIP LOCKED",
                params,
            )
            taken += cursor.fetchall()
        return taken

    def _set_running_rows(
        self, conn: BaseDatabaseWrapper, cursor: Any, rows: list[tuple[Any, ...]], worker_id: str, lease: datetime
    ) -> list[Claimed]:
        """The locked READY rows claimed: the UPDATE by id, and the rows as it left them."""
        if not rows:
            return []
        match, params = self.in_list([r[0] for r in rows])
        cursor.execute(
            "UPDATE ox_task SET status = 'RUNNING', attempts = attempts + 1, worker_id = %s,"
            f" lease_expires_at = %s, fence = fence + 1, last_attempted_at = NULL WHERE id {match}",
            [worker_id, self.ts(conn, lease), *params],
        )
        # CLAIM_COLUMNS: attempts at 9, fence at 11 (the UPDATE added one to each).
        return read_claimed((*r[:9], r[9] + 1, r[10], r[11] + 1, *r[12:]) for r in rows)

    def _claim_in_transaction(
        self,
        conn: BaseDatabaseWrapper,
        cursor: Any,
        worker_id: str,
        queues: Sequence[str],
        limits: tuple[int, int],
        now: datetime,
        lease: datetime,
        gate: Gate,
    ) -> list[Claimed]:
        levels = self.levels(conn, distinct(queues), gate)
        rows = [
            r for flag, n in enumerate(limits) if n > 0 for r in self._pick_and_lock(conn, cursor, flag, levels, now, n)
        ]
        return self._set_running_rows(conn, cursor, rows, worker_id, lease)

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
        with self.transaction(conn) as cursor:
            return self._claim_in_transaction(conn, cursor, worker_id, queues, limits, now, lease_expires_at, gate)

    def set_running(
        self, conn: BaseDatabaseWrapper, worker_id: str, ids: Sequence[object], lease: datetime
    ) -> list[Claimed]:
        match, params = self.in_list(list(ids))
        with conn.cursor() as cursor:
            cursor.execute(
                f"SELECT {CLAIM_COLUMNS} FROM ox_task WHERE id {match} AND status = 'READY' FOR UPDATE", params
            )
            return self._set_running_rows(conn, cursor, cursor.fetchall(), worker_id, lease)

    def ready_rows(
        self, conn: BaseDatabaseWrapper, queues: Sequence[str], flag: int, now: datetime, limit: int, columns: str
    ) -> list[tuple[Any, ...]]:
        return self.candidates(conn, flag, self.levels(conn, queues, True), now, limit, columns)

    def earliest_ready(
        self, conn: BaseDatabaseWrapper, queues: Sequence[str], kinds: tuple[bool, bool], gate: Gate
    ) -> datetime | None:
        flags = [self.flag(kind) for kind, wanted in enumerate(kinds) if wanted]
        queues = distinct(queues)
        if not flags or not queues:
            return None
        levels, params = levels_cte(queues, flags, gate, self.text_type)
        with conn.cursor() as cursor:
            # The first due time per level, then their least (MariaDB will not put a
            # correlated subquery inside an aggregate of a recursive CTE's rows).
            cursor.execute(
                f"WITH RECURSIVE {levels} SELECT min(f.first) FROM (SELECT (SELECT min(t.run_after) {LEVEL_READY}"
                " AND t.priority = l.priority) AS first FROM levels l WHERE l.priority IS NOT NULL) AS f",
                params,
            )
            row = cursor.fetchone()
        return read_ts(row[0]) if row and row[0] is not None else None

    # ------------------------------------------------------------------ completion and leases
