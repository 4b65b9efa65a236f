"""The gate's way past full keys: when a queue's window of due tasks (up to WINDOW_MAX) is
all tasks of keys a limit holds, the next candidates are the first due task of each other
key, found by walking the queue's keys in key order through ox_task_ready_key (an index probe
per key and kind) instead of reading the backlog, and the queue's first due tasks without a
key. They are offered in claim order, like any candidates.

Keys with nothing due are walked past too: WALK_MAX keys per queue and claim at most, so what
a claim reads stays bounded (a free key behind more than WALK_MAX keys with nothing due, or
full, waits for the walk to reach it as those keys drain). Tasks without a key are read from
the READY index past the keyed ones (a queue with key limits usually keys all its tasks).
"""

from collections.abc import Collection
from datetime import datetime

from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db import Driver, driver
from ox.flow.decide import Candidate

WALK_MAX = 5000  # keys looked at per queue and claim, at most

_COLUMNS = "id, queue, is_async, limit_key, priority, run_after"


def _fetch(conn: BaseDatabaseWrapper, ids: list[object]) -> list[Candidate]:
    if not ids:
        return []
    match, params = driver(conn).in_list(ids)
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT {_COLUMNS} FROM ox_task WHERE id {match}", params)
        rows = cursor.fetchall()
    return [Candidate.of(r) for r in rows]


def _head_sql(driver_facts: Driver, ready: str, kind: str, at: object, queue: str) -> tuple[str, list[object]]:
    """A key's (kw.k) first due task of one kind, in claim order: its priorities from the
    highest down, one index probe each, stopping at the first with a due task; within a
    priority the due ones are a range of ox_task_ready_key (run_after <= now). Probing by
    priority is what keeps the key's tasks scheduled for later (at a higher priority, or at
    the same one) from being read entry by entry on every walk."""
    mine = f"FROM ox_task t WHERE {ready} AND t.limit_key = kw.k AND t.is_async = {kind}"
    if not driver_facts.correlates_into_cte:
        # MariaDB: a CTE in a subquery cannot see the outer walk's kw.k. The key's entries in
        # claim order instead, passing over the ones scheduled for later.
        text = f"(SELECT t.id {mine} AND t.run_after <= %s ORDER BY t.priority DESC, t.run_after, t.id LIMIT 1)"
        return text, [queue, at]
    due = "AND t.priority = lv.p AND t.run_after <= %s"
    text = (
        f"(WITH RECURSIVE lv(p) AS (SELECT (SELECT max(t.priority) {mine})"
        f" UNION ALL SELECT (SELECT max(t.priority) {mine} AND t.priority < lv.p) FROM lv"
        f" WHERE lv.p IS NOT NULL AND NOT EXISTS (SELECT 1 {mine} {due}))"
        f" SELECT (SELECT t.id {mine} {due} ORDER BY t.run_after, t.id LIMIT 1)"
        " FROM lv WHERE lv.p IS NOT NULL ORDER BY lv.p LIMIT 1)"
    )
    return text, [queue, queue, queue, at, queue, at]


def free_key_heads(conn: BaseDatabaseWrapper, queue: str, now: datetime, skip: Collection[str]) -> list[Candidate]:
    """Per key not in `skip` (up to WALK_MAX keys, in key order), its first due task of each
    kind (the gate keeps order within the key across kinds)."""
    d = driver(conn)
    ready = "t.status = 'READY' AND t.queue = %s AND t.limit_key IS NOT NULL"
    at = d.ts(conn, now)
    sync_head, sync_params = _head_sql(d, ready, d.false, at, queue)
    async_head, async_params = _head_sql(d, ready, d.true, at, queue)
    skipped_match, skipped = d.in_list(list(skip))
    text = (
        "WITH RECURSIVE kw(k, n) AS ("
        f"SELECT (SELECT min(t.limit_key) FROM ox_task t WHERE {ready}), 1"
        f" UNION ALL SELECT (SELECT min(t.limit_key) FROM ox_task t WHERE {ready} AND t.limit_key > kw.k), kw.n + 1"
        " FROM kw WHERE kw.k IS NOT NULL AND kw.n < %s)"
        f" SELECT {sync_head}, {async_head}"
        f" FROM kw WHERE kw.k IS NOT NULL AND NOT (kw.k {skipped_match})"
    )
    with conn.cursor() as cursor:
        cursor.execute(text, [queue, queue, WALK_MAX, *sync_params, *async_params, *skipped])
        ids = [i for row in cursor.fetchall() for i in row if i is not None]
    return _fetch(conn, ids)


def keyless_heads(conn: BaseDatabaseWrapper, queue: str, now: datetime, flag: int, limit: int) -> list[Candidate]:
    """The queue's first due tasks of one kind without a limit key."""
    d = driver(conn)
    kind = d.flag(flag)
    with conn.cursor() as cursor:
        cursor.execute(
            f"SELECT {_COLUMNS} FROM ox_task WHERE status = 'READY' AND queue = %s AND is_async = {kind}"
            " AND limit_key IS NULL AND run_after <= %s ORDER BY priority DESC, run_after, id LIMIT %s",
            [queue, d.ts(conn, now), limit],
        )
        rows = cursor.fetchall()
    return [Candidate.of(r) for r in rows]
