"""ox's sequential enqueue split into rungs, from the bare SQL limit down to ox (the
enqueue_bare_row cell, bench.plan_bare_row; ox only), run by the enqueue_seq job when its
parameters say `bare_row`.

"ox" is `noop.enqueue()` as enqueue_seq times it. "bare" is the very INSERT that call sends to
ox_task, its SQL text and parameters captured from one real enqueue, run by psycopg alone on a
connection of its own with `prepare=True`, as ox runs it (ox.db.postgresql.prepared.write): the
same table, indexes and NOTIFY trigger, the same work per row, no Django and no ox in between. Each
bare call gets what ox gives each call anew (a uuid7 id, now for its timestamps), so no key clashes.
"limit" is the limit arm's thin INSERT on that bare connection, and "floor" the same INSERT behind
Django's Tasks API with nothing else (bench.floor): the most a django.tasks backend writing one
durable row per enqueue in autocommit can reach.
The kinds alternate in chunks, their order rotated by one per chunk and per round, so the machine's
noise of the moment falls on all alike (as bench.flow.compare_enqueue does); the ratios are per round.
"""

import re
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.db import connection

from bench import floor
from bench.arms.base import Arm
from bench.flow import spread
from bench.tasks import noop

Params = dict[str, Any]
Result = dict[str, Any]

# ox's enqueue, ox's row on bare psycopg, the limit's row behind Django's API, the limit's row.
KINDS = ("ox", "bare", "floor", "limit")
# The statement to take: an INSERT into ox_task itself (not ox_task_archive or another table).
INSERT_INTO_TASKS = re.compile(r'^\s*INSERT\s+INTO\s+"?ox_task"?\s*\(', re.IGNORECASE)
# How a session's prepared copy of that INSERT shows in pg_prepared_statements (psycopg sends
# the text with $n placeholders; the start is unchanged).
PREPARED_PREFIX = "INSERT INTO ox_task ("
PREPARED_SQL = "SELECT count(*) FROM pg_prepared_statements WHERE starts_with(statement, %s)"


class Captured:
    """ox's INSERT as one enqueue sent it, and which parameters a new call makes afresh."""

    def __init__(self, text: str, params: list[Any], task_id: uuid.UUID, others: list[str]) -> None:
        self.text = text
        self.params = params
        self.others = others  # the other statements the enqueue sent, if any (texts only)
        ids = [i for i, v in enumerate(params) if isinstance(v, uuid.UUID)]
        if [params[i] for i in ids] != [task_id]:
            raise RuntimeError(f"enqueue_bare_row: the captured INSERT's UUID parameters {ids} are not the task's id")
        self.id_at = ids[0]
        # enqueued_at and run_after: ox stamps both with the call's time (a noop has no other).
        self.times_at = [i for i, v in enumerate(params) if isinstance(v, datetime)]
        if not self.times_at:
            raise RuntimeError("enqueue_bare_row: the captured INSERT has no timestamp parameter")

    def describe(self) -> dict[str, Any]:
        return {
            "statement": self.text,
            "params": [repr(v) for v in self.params],
            "fresh_per_call": {"uuid7": self.id_at, "now": self.times_at},
            "other_statements": self.others,
        }


def capture(enqueue: Callable[[], Any]) -> Captured:
    """Run `enqueue` once and keep what it sent through Django's cursors (execute_wrapper: ox's
    prepared cursor is a Django cursor wrapper too). Exactly one INSERT into ox_task, or an error."""
    seen: list[tuple[str, list[Any]]] = []

    def record(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        seen.append((sql, list(params or [])))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        result = enqueue()
    inserts = [i for i, (sql, _params) in enumerate(seen) if INSERT_INTO_TASKS.match(sql)]
    if len(inserts) != 1:
        texts = [sql[:60] for sql, _ in seen]
        raise RuntimeError(
            f"enqueue_bare_row: one INSERT into ox_task expected from noop.enqueue(), captured {len(inserts)}"
            f" among {len(seen)} statement(s): {texts}"
        )
    text, params = seen[inserts[0]]
    others = [sql for i, (sql, _params) in enumerate(seen) if i != inserts[0]]
    return Captured(text, params, uuid.UUID(str(result.id)), others)


def bare_connection() -> Any:
    """A psycopg connection of its own to the database Django's connection uses, autocommit,
    psycopg's defaults otherwise (not Django's cursor class, adapters or prepare_threshold=None,
    which would refuse prepare=True)."""
    import psycopg

    params = connection.get_connection_params()
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    return psycopg.connect(**params, autocommit=True)


def bare_calls(conn: Any, row: Captured, count: int) -> float:
    """`count` executions of ox's INSERT on the bare connection; seconds. Fresh values are made
    inside the timing, as ox makes its own inside the enqueue."""
    from ox.ids import uuid7

    params = list(row.params)
    started = time.perf_counter()
    for _ in range(count):
        params[row.id_at] = uuid7()
        now = datetime.now(UTC)
        for i in row.times_at:
            params[i] = now
        conn.execute(row.text, params, prepare=True)
    return time.perf_counter() - started


def enqueue_calls(enqueue: Callable[[], Any], count: int) -> float:
    """`count` calls of `enqueue` (ox's noop.enqueue, or the floor's); seconds."""
    started = time.perf_counter()
    for _ in range(count):
        enqueue()
    return time.perf_counter() - started


def prepared(execute: Callable[[str, list[str]], int]) -> bool:
    """Whether the session holds ox's INSERT as a prepared statement."""
    return execute(PREPARED_SQL, [PREPARED_PREFIX]) > 0


def _django_count(sql: str, params: list[str]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.fetchone()[0])


# The rungs from the bound down to ox, each a fraction of the one above it: the limit arm's thin
# row on bare psycopg; that row behind Django's Tasks API (bench.floor); ox's own row on bare
# psycopg; ox's enqueue.
RATIOS = {
    "ratio_floor_limit": ("floor", "limit"),
    "ratio_bare_limit": ("bare", "limit"),
    "ratio_ox_bare": ("ox", "bare"),
    "ratio_ox_floor": ("ox", "floor"),
    "ratio_ox_limit": ("ox", "limit"),
}


def compare(arm: Arm, p: Params) -> Result:
    """Per round, on emptied tables: one uncounted call of each kind, then n calls of each in
    chunks of `chunk`, the kinds alternating per chunk (the order turning per chunk and round).
    Per kind: calls over the summed time; the ratios of RATIOS per round."""
    if arm.name != "ox":
        raise RuntimeError("the bare-row cell measures ox's own row")
    if connection.vendor != "postgresql":
        raise RuntimeError("the bare-row cell runs ox's prepared INSERT: PostgreSQL only")
    n, chunk, rounds = p["n"], p.get("chunk", 100), p["rounds"]
    calls = n // chunk * chunk
    # Only ox's tables: nothing here writes the ledger.
    arm.reset([])
    # The session's first write runs unprepared with a RETURNING of the backend's pid (ox checks
    # that no pooler stands in between): not the statement ox sends from then on, so not the one
    # to take. It also opens the connection and reads the database's clock.
    noop.enqueue()
    row = capture(noop.enqueue)
    notes: list[str] = []
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    counted: dict[str, list[int]] = {"ox_task": [], floor.TABLE: []}
    with bare_connection() as bare, floor.floor_task(noop, bare) as on_floor:
        bare_calls(bare, row, 1)
        floor.limit_calls(bare, 1)
        is_prepared = {
            "ox": prepared(_django_count),
            "bare": prepared(lambda sql, params: int(bare.execute(sql, params).fetchone()[0])),
        }
        if not all(is_prepared.values()):
            raise RuntimeError(f"enqueue_bare_row: ox's INSERT is not prepared in every session: {is_prepared}")
        run = {
            "ox": lambda count: enqueue_calls(noop.enqueue, count),
            "bare": lambda count: bare_calls(bare, row, count),
            "floor": lambda count: enqueue_calls(on_floor.enqueue, count),
            "limit": lambda count: floor.limit_calls(bare, count),
        }
        for r in range(rounds):
            arm.reset([])
            floor.empty(bare)
            # After the TRUNCATE each prepared statement is planned again at its next run: here,
            # outside the timing.
            for kind in KINDS:
                run[kind](1)
            spent = dict.fromkeys(KINDS, 0.0)
            for c in range(calls // chunk):
                # Rotated, not reversed: reversing would run the first and last kinds' chunks
                # back to back at every boundary; rotated, no kind ever follows itself.
                turn = (r + c) % len(KINDS)
                order = KINDS[turn:] + KINDS[:turn]
                for kind in order:
                    spent[kind] += run[kind](chunk)
            for kind in KINDS:
                samples[kind].append(calls / spent[kind])
            # Two kinds write each table: their calls and one warm-up each.
            for table, found in (("ox_task", arm.model.objects.count()), (floor.TABLE, floor.rows(bare))):
                counted[table].append(found)
                if found != 2 * calls + 2:
                    notes.append(
                        f"round {r}: {found} rows in {table}, want {2 * calls + 2} (2 x {calls} calls + 2 warm-ups)"
                    )
    ratios = {key: [samples[a][r] / samples[b][r] for r in range(rounds)] for key, (a, b) in RATIOS.items()}
    return {
        **{f"throughput_{kind}": samples[kind] for kind in KINDS},
        **ratios,
        "info": {
            "n": n,
            "chunk": chunk,
            "rounds": rounds,
            "calls_per_kind_and_round": calls,
            "order": "per round emptied tables and one uncounted call of each kind; chunks alternating,"
            " the order of the kinds rotated by one per chunk and per round",
            "captured": row.describe(),
            "prepared": is_prepared,
            "rows": counted["ox_task"],
            "limit_rows": counted[floor.TABLE],
            "spread": {
                **{f"throughput_{kind}": spread(samples[kind]) for kind in KINDS},
                **{f"{a}/{b}": spread(ratios[key]) for key, (a, b) in RATIOS.items()},
            },
            "notes": notes,
        },
    }
