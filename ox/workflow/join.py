"""The join: what a workflow task's end does to the tasks after it, in the transaction that
records that end (ox.sql.complete and ox.sql.fail call these inside it). So a worker that dies
between a task's success and its followers' bookkeeping cannot exist: both commit or neither
does (then the task is rescued and run again, and its success counts then).

A follower's `waiting` counts the tasks it still waits for. Each end marks its edges done
(copying its result onto them) and counts its followers down, their rows locked in id order
(two workers ending members of the same groups take the locks in one order, so one waits for
the other; a deadlock InnoDB still finds on index records is run again:
ox.sql.again_on_deadlock). The one transaction that counts a follower to 0 makes it READY; a follower's lock makes every
other wait for it and then see the lower count, so a group's callback is made READY once,
however many workers end its members at the same moment."""

import json
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db import driver
from ox.db.dialect import CHANNEL
from ox.db.rows import read_id
from ox.ids import uuid7
from ox.sql import again_on_deadlock

FINISHED = ("SUCCESSFUL", "FAILED", "CANCELLED")


def succeeded(conn: BaseDatabaseWrapper, cursor: Any, done: Sequence[tuple[uuid.UUID, str]], now: datetime) -> int:
    """Tasks that just succeeded ((id, return JSON)): count their followers down. Returns how
    many followers became READY."""
    d = driver(conn)
    join_in_one = getattr(d, "join_succeeded", None)
    if join_in_one is not None:  # PostgreSQL: one statement (ox.db.postgresql.join)
        return join_in_one(cursor, dict(done), now, CHANNEL)
    children = _take_edges(conn, cursor, dict(done))
    if not children:
        return 0
    return count_down(conn, cursor, Counter(children), now)


def _take_edges(conn: BaseDatabaseWrapper, cursor: Any, results: dict[uuid.UUID, str]) -> list[uuid.UUID]:
    """Close the open edges out of these tasks, each with its task's result: one statement
    where the database has UPDATE ... RETURNING. Returns the child of each edge closed."""
    d = driver(conn)
    parents = list(results)
    cases = " ".join("WHEN %s THEN %s" for _ in parents)
    marks = ", ".join(["%s"] * len(parents))
    rows = d.update_returning(
        conn,
        "ox_workflow_edge",
        f"result = CASE parent_id {cases} END, done = {d.true}",
        [v for p in parents for v in (d.id(p), results[p])],
        f"parent_id IN ({marks}) AND done = {d.false}",
        [d.id(p) for p in parents],
        "child_id",
        cursor=cursor,
    )
    return [read_id(r[-1]) for r in rows]


def ended_badly(conn: BaseDatabaseWrapper, cursor: Any, task_id: uuid.UUID, status: str, now: datetime) -> None:
    """A task failed for good or was cancelled: its workflow's policy decides what follows.
    "continue": its followers count it as done, its result None; "stop": they are cancelled,
    and theirs after them. The first such end enqueues the on-failure task, if any."""
    d = driver(conn)
    cursor.execute(
        "SELECT w.id, w.policy, w.on_failure, w.failed_at FROM ox_workflow w JOIN ox_task t ON t.workflow_id = w.id"
        " WHERE t.id = %s",
        [d.id(task_id)],
    )
    row = cursor.fetchone()
    if row is None:
        return
    flow_id, policy, on_failure, failed_at = read_id(row[0]), row[1], row[2], row[3]
    if on_failure is not None and failed_at is None:
        _on_failure(conn, cursor, flow_id, on_failure, task_id, status, now)
    edges = _open_edges(conn, cursor, [task_id])
    if not edges:
        return
    _close_edges(conn, cursor, [(e, None) for e, _p, _c in edges])
    children = Counter(c for _e, _p, c in edges)
    if policy == "continue":
        count_down(conn, cursor, children, now)
        return
    _cancel_after(conn, cursor, list(children), now)


def _open_edges(
    conn: BaseDatabaseWrapper, cursor: Any, parents: list[uuid.UUID]
) -> list[tuple[int, uuid.UUID, uuid.UUID]]:
    """The edges out of these tasks not yet done, locked: (edge id, parent, child)."""
    d = driver(conn)
    marks = ", ".join(["%s"] * len(parents))
    cursor.execute(
        f"SELECT id, parent_id, child_id FROM ox_workflow_edge WHERE parent_id IN ({marks})"
        f" AND done = {d.false} ORDER BY id{d.for_update}",
        [d.id(p) for p in parents],
    )
    return [(r[0], read_id(r[1]), read_id(r[2])) for r in cursor.fetchall()]


def _close_edges(conn: BaseDatabaseWrapper, cursor: Any, edges: list[tuple[int, str | None]]) -> None:
    d = driver(conn)
    with_result = [(e, r) for e, r in edges if r is not None]
    if with_result:
        cases = " ".join("WHEN %s THEN %s" for _ in with_result)
        params: list[Any] = [v for pair in with_result for v in pair]
        marks = ", ".join(["%s"] * len(with_result))
        cursor.execute(
            f"UPDATE ox_workflow_edge SET result = CASE id {cases} END, done = {d.true} WHERE id IN ({marks})",
            params + [e for e, _r in with_result],
        )
    without = [e for e, r in edges if r is None]
    if without:
        marks = ", ".join(["%s"] * len(without))
        cursor.execute(
            f"UPDATE ox_workflow_edge SET result = NULL, done = {d.true} WHERE id IN ({marks})",
            without,
        )


def _lock(conn: BaseDatabaseWrapper, cursor: Any, ids: list[uuid.UUID]) -> list[tuple[uuid.UUID, str, int, str]]:
    """Lock these tasks in id order: (id, status, waiting, queue)."""
    d = driver(conn)
    marks = ", ".join(["%s"] * len(ids))
    cursor.execute(
        f"SELECT id, status, waiting, queue FROM ox_task WHERE id IN ({marks}) ORDER BY id{d.for_update}",
        [d.id(i) for i in sorted(ids)],
    )
    return [(read_id(r[0]), r[1], int(r[2]), r[3]) for r in cursor.fetchall()]


def count_down(conn: BaseDatabaseWrapper, cursor: Any, children: Mapping[uuid.UUID, int], now: datetime) -> int:
    """Count these followers down (by how many of their predecessors ended, each); the ones
    counted to 0 that still wait become READY. Returns how many did."""
    d = driver(conn)
    ready: list[uuid.UUID] = []
    queues: set[str] = set()
    lower: dict[int, list[uuid.UUID]] = {}
    for child, status, waiting, queue in _lock(conn, cursor, list(children)):
        k = min(children[child], waiting)
        if status == "PENDING" and waiting - k <= 0:
            ready.append(child)
            queues.add(queue)
        elif k:
            lower.setdefault(k, []).append(child)
    if ready:
        marks = ", ".join(["%s"] * len(ready))
        cursor.execute(
            f"UPDATE ox_task SET run_after = %s, status = 'READY', waiting = 0 WHERE id IN ({marks})",
            [d.ts(conn, now), *(d.id(i) for i in ready)],
        )
    for k, ids in lower.items():
        marks = ", ".join(["%s"] * len(ids))
        cursor.execute(f"UPDATE ox_task SET waiting = waiting - %s WHERE id IN ({marks})", [k, *(d.id(i) for i in ids)])
    if queues and d.notifies:
        # As an enqueue would: idle workers of those queues claim them now, not at their poll
        # (and only if a worker is idle: a NOTIFY costs the commit a cluster-wide lock).
        for queue in sorted(queues):
            d.notify_idle(cursor, CHANNEL, queue)
    return len(ready)


def _cancel_after(conn: BaseDatabaseWrapper, cursor: Any, children: list[uuid.UUID], now: datetime) -> None:
    """Cancel these followers if they wait, and everything after them, level by level."""
    d = driver(conn)
    level = children
    while level:
        waiting = [i for i, status, _w, _q in _lock(conn, cursor, level) if status == "PENDING"]
        if not waiting:
            return
        marks = ", ".join(["%s"] * len(waiting))
        cursor.execute(
            f"UPDATE ox_task SET status = 'CANCELLED', finished_at = %s, waiting = 0 WHERE id IN ({marks})",
            [d.ts(conn, now), *(d.id(i) for i in waiting)],
        )
        edges = _open_edges(conn, cursor, waiting)
        _close_edges(conn, cursor, [(e, None) for e, _p, _c in edges])
        level = sorted({c for _e, _p, c in edges})


def _on_failure(
    conn: BaseDatabaseWrapper,
    cursor: Any,
    flow_id: uuid.UUID,
    spec: Any,
    task_id: uuid.UUID,
    status: str,
    now: datetime,
) -> None:
    d = driver(conn)
    cursor.execute(
        "UPDATE ox_workflow SET failed_at = %s WHERE id = %s AND failed_at IS NULL",
        [d.ts(conn, now), d.id(flow_id)],
    )
    if cursor.rowcount != 1:
        return  # another transaction's failure came first and enqueued it
    from ox.db.rows import NewTask

    spec = json.loads(spec) if isinstance(spec, str) else spec
    first = {"workflow": str(flow_id), "task": str(task_id), "status": status}
    row = NewTask(
        id=uuid7(),
        task_path=spec["task_path"],
        queue=spec["queue"],
        priority=spec["priority"],
        args=[first, *spec["args"]],
        kwargs=spec["kwargs"],
        run_after=now,
        enqueued_at=now,
        max_attempts=spec["max_attempts"],
        is_async=spec["is_async"],
    )
    d.insert_tasks(conn, [row])
    cursor.execute("UPDATE ox_task SET workflow_id = %s WHERE id = %s", [d.id(flow_id), d.id(row.id)])
    cursor.execute("UPDATE ox_workflow SET handler_id = %s WHERE id = %s", [d.id(row.id), d.id(flow_id)])


def inputs(conn: BaseDatabaseWrapper, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[tuple[bool, str | None]]]:
    """The inputs of claimed workflow tasks: id -> [(gather, result JSON)] in position order
    (no entry: a task with nothing before it)."""
    d = driver(conn)
    marks = ", ".join(["%s"] * len(ids))
    out: dict[uuid.UUID, list[tuple[bool, str | None]]] = {}
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT child_id, gather, result FROM ox_workflow_edge WHERE child_id IN ({marks})"
            " ORDER BY child_id, position",
            [d.id(i) for i in ids],
        )
        for child, gather, result in cursor.fetchall():
            out.setdefault(read_id(child), []).append((bool(gather), result))
    return out


def ended_badly_where(conn: BaseDatabaseWrapper, ids: Sequence[uuid.UUID], now: datetime) -> None:
    """ended_badly() for those of these tasks that are a workflow's and FAILED or CANCELLED
    (the rescuer's give-ups, a hand-back that found a cancel), each in a transaction of its
    own. ended_badly is idempotent (edges are closed once, the on-failure task enqueued
    once): a task joined before is left as it is."""
    d = driver(conn)
    marks = ", ".join(["%s"] * len(ids))
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT id, status FROM ox_task WHERE id IN ({marks}) AND workflow_id IS NOT NULL"
            " AND status IN ('FAILED', 'CANCELLED') ORDER BY id",
            [d.id(i) for i in ids],
        )
        found = [(read_id(r[0]), r[1]) for r in cursor.fetchall()]
    for task_id, status in found:
        _end_badly_alone(conn, task_id, status, now)


@again_on_deadlock
def _end_badly_alone(conn: BaseDatabaseWrapper, task_id: uuid.UUID, status: str, now: datetime) -> None:
    with driver(conn).transaction(conn) as cursor:
        ended_badly(conn, cursor, task_id, status, now)
