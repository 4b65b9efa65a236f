"""The repair sweep (a worker duty): PENDING tasks whose predecessors ended in a way no join
saw. A worker's success or failure joins in its own transaction (ox.workflow.join), and so
does ox.cancel; what else ends a task does not: the rescuer giving up on a task whose workers
kept dying, a row changed by hand. The sweep walks the PENDING tasks in id order, a batch a
round (its cost does not grow with the number of workflows in flight), and joins what it
finds, each in a transaction of its own."""

import uuid
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db import driver
from ox.db.rows import read_id, read_json_text
from ox.workflow import join

REPAIR_INTERVAL = 5.0  # seconds between rounds
BATCH = 500  # PENDING tasks looked at per round


class Repairer:
    def __init__(self, batch: int = BATCH) -> None:
        self.batch = batch
        self.after: uuid.UUID | None = None  # where the next round starts (None: the first)

    def run(self, conn: BaseDatabaseWrapper, now: datetime) -> int:
        """One round; returns how many predecessors' ends it joined."""
        d = driver(conn)
        with conn.cursor() as cursor:
            if self.after is None:
                cursor.execute("SELECT id FROM ox_task WHERE status = 'PENDING' ORDER BY id LIMIT %s", [self.batch])
            else:
                cursor.execute(
                    "SELECT id FROM ox_task WHERE status = 'PENDING' AND id > %s ORDER BY id LIMIT %s",
                    [d.id(self.after), self.batch],
                )
            pending = [read_id(r[0]) for r in cursor.fetchall()]
        self.after = pending[-1] if len(pending) == self.batch else None
        if not pending:
            return 0
        ended, stalled = _ended_before(conn, pending)
        for parent, (status, result) in ended.items():
            with d.transaction(conn) as cursor:
                if status == "SUCCESSFUL":
                    join.succeeded(conn, cursor, [(parent, result or "null")], now)
                else:
                    join.ended_badly(conn, cursor, parent, status, now)
        if stalled:
            # Nothing left to wait for, yet PENDING (a count changed by hand): READY now.
            with d.transaction(conn) as cursor:
                join.count_down(conn, cursor, {child: 1 << 30 for child in stalled}, now)
        return len(ended)


def _ended_before(
    conn: BaseDatabaseWrapper, pending: list[uuid.UUID]
) -> tuple[dict[uuid.UUID, tuple[str, str | None]], list[uuid.UUID]]:
    """Of these PENDING tasks' open edges, the predecessors that have finished: id ->
    (status, return JSON); and the tasks with no open edge at all."""
    d = driver(conn)
    marks = ", ".join(["%s"] * len(pending))
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT parent_id, child_id FROM ox_workflow_edge WHERE child_id IN ({marks}) AND done = {d.false}",
            [d.id(i) for i in pending],
        )
        edges = [(read_id(p), read_id(c)) for p, c in cursor.fetchall()]
        waiting_on = {c for _p, c in edges}
        stalled = [i for i in pending if i not in waiting_on]
        parents = sorted({p for p, _c in edges})
        ended: dict[uuid.UUID, tuple[str, str | None]] = {}
        if parents:
            marks = ", ".join(["%s"] * len(parents))
            for table in ("ox_task", "ox_task_archive"):
                cursor.execute(
                    f"SELECT id, status, return_value FROM {table} WHERE id IN ({marks})"
                    " AND status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')",
                    [d.id(p) for p in parents],
                )
                for task_id, status, value in cursor.fetchall():
                    ended[read_id(task_id)] = (status, None if value is None else read_json_text(value))
    return ended, stalled


def repair_duty() -> Any:
    from ox.duties import Duty

    return Duty("workflow repair", REPAIR_INTERVAL, Repairer().run)
