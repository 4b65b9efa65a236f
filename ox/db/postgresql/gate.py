"""The gate (ox.flow.gate) on PostgreSQL in two round trips (the gate does the same in a
statement per step on SQLite, where statements cost no round trip, and wherever a statement
cannot carry several).

Round trip one sends, as one query: BEGIN; the completions riding on the claim; the lock of
the queues' rows (SELECT ... FOR UPDATE, in name order); and one read of what runs per
(queue, key) with the first due READY candidates of each kind. Each statement of a READ
COMMITTED transaction takes its own snapshot, so the read after the lock sees everything the
previous lock holder committed. Round trip two sends the claim's UPDATE, the rate schedules
and COMMIT. The lock is held from the end of the first to the commit of the second.
"""

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db.base import SET_RUNNING
from ox.db.postgresql.claim import candidates_sql, complete_sql
from ox.db.rows import CLAIM_COLUMNS, Claimed, Completion, read_claimed, read_id
from ox.flow.decide import Candidate


def usable(conn: BaseDatabaseWrapper) -> bool:
    """Several statements with parameters in one query need client-side binding (Django's
    default cursor); server-side binding (OPTIONS server_side_binding) sends one statement
    per query. Not inside a caller's atomic(): the gate's own BEGIN/COMMIT would break it."""
    if conn.in_atomic_block:
        return False
    with conn.cursor() as cursor:
        return isinstance(cursor.cursor, psycopg.ClientCursor)


def _results(cursor: Any) -> list[list[tuple[Any, ...]] | None]:
    """Every result of a multi-statement query, in order (None: a statement without rows)."""
    out: list[list[tuple[Any, ...]] | None] = []
    while True:
        out.append(cursor.fetchall() if cursor.description else None)
        if not cursor.nextset():
            return out


def _marks(values: Sequence[object]) -> str:
    return ", ".join(["%s"] * len(values))


def lock_and_read(
    conn: BaseDatabaseWrapper,
    names: list[str],
    windows: dict[tuple[str, int], int],
    now: datetime,
    done: Sequence[Completion],
) -> tuple[
    set[tuple[Any, int]],
    dict[str, tuple[bool, float | None]],
    tuple[Counter[str], Counter[tuple[str, str]]],
    dict[tuple[str, int], list[Candidate]],
]:
    """Round trip one. Returns the completions written, the queues' rows (paused, rate_tat),
    the RUNNING counts (per queue, per (queue, key)) and per (queue, kind) its window of
    candidates in claim order. The transaction is left open, holding the locks."""
    # READ COMMITTED whatever the database's default: the read after the lock must see what
    # the last holder committed (a REPEATABLE READ snapshot would predate the lock).
    parts: list[str] = ["BEGIN ISOLATION LEVEL READ COMMITTED"]
    params: list[object] = []
    if done:
        done_sql, complete_params = complete_sql(done)
        parts.append(done_sql)
        params += complete_params
    parts.append(
        f"SELECT name, paused, rate_tat FROM ox_queue WHERE name IN ({_marks(names)}) ORDER BY name FOR UPDATE"
    )
    params += names
    reads = [
        "SELECT -1, NULL::uuid, queue, limit_key, count(*)::int, NULL::smallint, NULL::timestamptz FROM ox_task"
        f" WHERE status = 'RUNNING' AND queue IN ({_marks(names)}) GROUP BY queue, limit_key"
    ]
    params += names
    for (queue, flag), window in sorted(windows.items()):
        # A window per queue: one queue's backlog never crowds another's tasks out of it.
        cand, cand_params = candidates_sql(
            "true" if flag else "false",
            [queue],
            now,
            window,
            window,
            columns="c.id, c.queue, c.limit_key, l.priority, c.run_after",
            gate=True,
        )
        reads.append(f"SELECT {flag}, c.id, c.queue, c.limit_key, 0, c.priority::smallint, c.run_after FROM ({cand}) c")
        params += cand_params
    parts.append(" UNION ALL ".join(f"({r})" for r in reads))
    with conn.cursor() as cursor:
        cursor.execute("; ".join(parts), params)
        results = _results(cursor)
    written: set[tuple[Any, int]] = set()
    if done:
        written = {(read_id(r[0]), int(r[1])) for r in results[1] or []}
    states = {name: (bool(paused), tat) for name, paused, tat in results[-2] or []}
    per_queue: Counter[str] = Counter()
    per_key: Counter[tuple[str, str]] = Counter()
    found: dict[tuple[str, int], list[Candidate]] = {k: [] for k in windows}
    for kind, task_id, queue, key, count, priority, run_after in results[-1] or []:
        if kind < 0:
            per_queue[queue] += count
            if key is not None:
                per_key[(queue, key)] += count
        else:
            found[(queue, kind)].append(Candidate(task_id, queue, bool(kind), key, priority, run_after))
    for rows in found.values():
        rows.sort(key=lambda c: c.order)
    return written, states, (per_queue, per_key), found


def finish(
    conn: BaseDatabaseWrapper,
    worker_id: str,
    ids: list[object],
    lease: datetime,
    rate_tats: dict[str, float],
    key_tats: dict[tuple[str, str], float],
) -> list[Claimed]:
    """Round trip two: the claim, the rate schedules, COMMIT."""
    parts: list[str] = []
    params: list[object] = []
    if ids:
        parts.append(f"{SET_RUNNING} WHERE id = ANY(%s) AND status = 'READY' RETURNING {CLAIM_COLUMNS}")
        params += [worker_id, lease, ids]
    for queue, tat in sorted(rate_tats.items()):
        parts.append("UPDATE ox_queue SET rate_tat = %s WHERE name = %s")
        params += [tat, queue]
    if key_tats:
        rows = sorted(key_tats.items())
        values = ", ".join(["(%s, %s, %s)"] * len(rows))
        parts.append(
            f"INSERT INTO ox_key_rate (queue, key, tat) VALUES {values}"
            " ON CONFLICT (queue, key) DO UPDATE SET tat = excluded.tat"
        )
        params += [v for (queue, key), tat in rows for v in (queue, key, tat)]
    parts.append("COMMIT")
    with conn.cursor() as cursor:
        cursor.execute("; ".join(parts), params)
        results = _results(cursor)
    return read_claimed(results[0] or []) if ids else []


def rollback(conn: BaseDatabaseWrapper) -> None:
    with conn.cursor() as cursor:
        cursor.execute("ROLLBACK")
