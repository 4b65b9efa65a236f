"""The gate's way past full keys: when the first WINDOW_MAX due tasks of a queue all belong
to keys a limit holds, the next candidates are the first due task of each other key, found by
walking the queue's keys in key order through ox_task_ready_key (one index probe per key)
instead of reading the backlog. Keys a limit holds are at most as many as the tasks that
run (or were just refused a rate), so the walk costs about that plus what it takes."""

import json
from collections.abc import Collection
from datetime import datetime

from django.db.backends.base.base import BaseDatabaseWrapper

from ox import sql
from ox.flow.decide import Candidate

WALK_MAX = 1000  # keys looked at per queue and claim, at most


def free_key_heads(
    conn: BaseDatabaseWrapper,
    queue: str,
    flag: int,
    now: datetime,
    skip: Collection[str],
    want: int,
) -> list[Candidate]:
    """Up to `want` tasks, each the first due one (claim order within its key) of a key not
    in `skip`, keys in key order."""
    pg = sql.is_postgres(conn)
    kind = ("true" if flag else "false") if pg else str(flag)
    ready = f"t.status = 'READY' AND t.queue = %s AND t.limit_key IS NOT NULL AND t.is_async = {kind}"
    not_skipped = "keys.k <> ALL(%s)" if pg else "keys.k NOT IN (SELECT value FROM json_each(%s))"
    text = (
        "WITH RECURSIVE keys(k, n) AS ("
        f"SELECT (SELECT min(t.limit_key) FROM ox_task t WHERE {ready}), 1"
        f" UNION ALL SELECT (SELECT min(t.limit_key) FROM ox_task t WHERE {ready} AND t.limit_key > keys.k), keys.n + 1"
        " FROM keys WHERE keys.k IS NOT NULL AND keys.n < %s)"
        " SELECT head FROM (SELECT (SELECT t.id FROM ox_task t"
        f" WHERE {ready} AND t.limit_key = keys.k AND t.run_after <= %s"
        " ORDER BY t.priority DESC, t.run_after, t.id LIMIT 1) AS head"
        f" FROM keys WHERE keys.k IS NOT NULL AND {not_skipped}) AS h WHERE head IS NOT NULL LIMIT %s"
    )
    skipped: object = list(skip) if pg else json.dumps(list(skip))
    params = [queue, queue, WALK_MAX, queue, sql._ts(conn, now), skipped, want]
    with conn.cursor() as cursor:
        cursor.execute(text, params)
        ids = [r[0] for r in cursor.fetchall()]
        if not ids:
            return []
        if pg:
            cursor.execute(
                "SELECT id, queue, is_async, limit_key, priority, run_after FROM ox_task WHERE id = ANY(%s)", [ids]
            )
        else:
            cursor.execute(
                "SELECT id, queue, is_async, limit_key, priority, run_after FROM ox_task"
                " WHERE id IN (SELECT value FROM json_each(%s))",
                [json.dumps(ids)],
            )
        found = {r[0]: Candidate(r[0], r[1], bool(r[2]), r[3], r[4], sql._read_ts(r[5])) for r in cursor.fetchall()}
    return [found[i] for i in ids if i in found]
