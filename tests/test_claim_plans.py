"""What the worker's statements cost as the backlog grows (issue #10): every statement on the
worker's hot path, run for real (inside a transaction that is rolled back) on a table of READY,
RUNNING and finished tasks, then again after the READY backlog grew fivefold.

PostgreSQL (EXPLAIN ANALYZE, BUFFERS):
- no Seq Scan on ox_task; every Sort sorts a bounded set (at most limit x queues x priorities
  candidates), never the backlog;
- the buffers each statement touches stay flat when the backlog grows fivefold, also when the
  new tasks are scheduled for later at a higher priority than the due ones (a scan in
  (priority, run_after) order would walk every one of them on each claim).
SQLite (EXPLAIN QUERY PLAN): no full scan of ox_task; the claim and earliest_ready search the
READY index per queue. The backlog's own growth is what the benchmark's backlog cells measure
(bench/README.md).
"""

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from ox import clock, sql
from ox.db.postgresql.claim import claim_parts
from ox.flow import gate
from ox.flow.limits import QueueLimits, Rate
from ox.models import Worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

pg = connection.vendor == "postgresql"
QUEUES = ["default", "emails", "reports"]
PRIORITIES = (-10, 0, 0, 0, 10)  # three levels, most tasks at the default
LATER = (50, 60, 60, 60, 70)  # priorities of tasks scheduled for tomorrow
BASE_READY = 12_000
GATED = QueueLimits(concurrency=1000, key_concurrency=2, rate=Rate(10_000, 1), key_rate=Rate(100, 1))
# After the backlog grew fivefold, at most this many times the buffers (+ SLACK): the READY
# index may have grown a level, which adds a page to each of a statement's dozens of probes.
# A scan of the backlog grows fivefold.
GROWTH = 1.5
SLACK = 12

FILL_PG = """
INSERT INTO ox_task (id, task_path, queue, priority, status, args, kwargs, run_after, enqueued_at,
                     attempts, max_attempts, worker_id, fence, cancel_requested, is_async)
SELECT gen_random_uuid(), 'tests.tasks.noop', (%(queues)s::text[])[1 + i %% 3],
       (%(priorities)s::int[])[1 + i %% 5], 'READY', '[]', '{}',
       now() + %(offset)s * interval '1 second' - i * interval '1 millisecond', now(),
       0, 3, '', 0, false, i %% 7 = 0
FROM generate_series(1, %(n)s) AS i
"""
FILL_SQLITE = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %s)
INSERT INTO ox_task (id, task_path, queue, priority, status, args, kwargs, run_after, enqueued_at,
                     attempts, max_attempts, worker_id, fence, cancel_requested, is_async)
SELECT lower(hex(randomblob(16))), 'tests.tasks.noop',
       CASE i % 3 WHEN 0 THEN 'default' WHEN 1 THEN 'emails' ELSE 'reports' END,
       CASE i % 5 WHEN 0 THEN -10 WHEN 4 THEN 10 ELSE 0 END, 'READY', '[]', '{}',
       strftime('%Y-%m-%d %H:%M:%f', 'now', (%s - i / 1000.0) || ' seconds'), strftime('%Y-%m-%d %H:%M:%f', 'now'),
       0, 3, '', 0, 0, i % 7 = 0
FROM n
"""


def fill(n: int, offset_seconds: float, priorities: tuple[int, ...] = PRIORITIES) -> None:
    """n READY tasks, due `offset_seconds` from now (negative: overdue), spread over QUEUES."""
    with connection.cursor() as cursor:
        if pg:
            cursor.execute(
                FILL_PG, {"queues": QUEUES, "priorities": list(priorities), "offset": offset_seconds, "n": n}
            )
            cursor.execute("VACUUM (ANALYZE) ox_task")
        else:
            cursor.execute(FILL_SQLITE, [n, offset_seconds])
            cursor.execute("ANALYZE")


def fill_running_and_finished() -> None:
    """A few RUNNING tasks of a registered worker (some with expired leases) and a history."""
    Worker.objects.create(
        id="w-plans",
        host="h",
        pid=1,
        queues=QUEUES,
        lock_key=4242,
        started_at=clock.db_now(connection),
        heartbeat_at=clock.db_now(connection),
    )
    with connection.cursor() as cursor:
        if pg:
            cursor.execute(
                "UPDATE ox_task SET status = 'RUNNING', worker_id = 'w-plans', attempts = 1, fence = 1,"
                " lease_expires_at = now() + CASE WHEN random() < 0.5 THEN interval '30 s' ELSE interval '-1 s' END"
                " WHERE id IN (SELECT id FROM ox_task WHERE status = 'READY' LIMIT 40)"
            )
            cursor.execute(
                "UPDATE ox_task SET status = 'SUCCESSFUL', finished_at = now(), attempts = 1, fence = 1"
                " WHERE id IN (SELECT id FROM ox_task WHERE status = 'READY' LIMIT 3000)"
            )
            # Earlier failed attempts of other tasks: the history read looks up a few of them.
            # Ten each (30,000 rows, ~400 pages): at 3,000 (~40 pages) the planner may rightly
            # read the whole table rather than probe its index 20 times, which says nothing.
            cursor.execute(
                "INSERT INTO ox_attempt (task_id, number, worker_id, started_at, finished_at, outcome,"
                " exception_class_path, traceback)"
                " SELECT id, n, 'w-old', now(), now(), 'failed', 'x.Boom', 'tb'"
                " FROM (SELECT id FROM ox_task WHERE status = 'SUCCESSFUL' LIMIT 3000) AS t"
                " CROSS JOIN generate_series(1, 10) AS n"
            )
            cursor.execute("VACUUM (ANALYZE) ox_task")
            cursor.execute("VACUUM (ANALYZE) ox_attempt")
        else:
            cursor.execute(
                "UPDATE ox_task SET status = 'RUNNING', worker_id = 'w-plans', attempts = 1, fence = 1,"
                " lease_expires_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '30 seconds')"
                " WHERE id IN (SELECT id FROM ox_task WHERE status = 'READY' LIMIT 40)"
            )


def running_keys() -> list[tuple[uuid.UUID, int, Any]]:
    return [(i, f, None) for i, f in sql_rows("SELECT id, fence FROM ox_task WHERE status = 'RUNNING' LIMIT 20")]


def sql_rows(text: str) -> list[tuple[uuid.UUID, int]]:
    with connection.cursor() as cursor:
        cursor.execute(text)
        return [(uuid.UUID(str(r[0])), int(r[1])) for r in cursor.fetchall()]


TRANSACTION_CONTROL = {
    "BEGIN",
    "BEGIN IMMEDIATE",
    "BEGIN ISOLATION LEVEL READ COMMITTED",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT OX_SQL",
    "RELEASE SAVEPOINT OX_SQL",
}


class Recorder:
    """Captures the statements an ox.sql call sends, to EXPLAIN them afterwards. Its own
    BEGIN/COMMIT are not sent: everything stays inside the test's transaction, which is
    rolled back, so measuring one statement never changes what the next one sees."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []

    def __call__(self, execute: Callable, sql_text: str, params: Any, many: bool, context: dict) -> Any:
        if sql_text.strip().upper() in TRANSACTION_CONTROL:
            return None
        self.statements.append((sql_text, params))
        return execute(sql_text, params, many, context)


def statements_of(call: Callable[[], Any]) -> list[tuple[str, Any]]:
    """Run one ox.sql call inside a transaction that is rolled back; the statements it sent."""
    recorder = Recorder()
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            with connection.execute_wrapper(recorder):
                call()
        finally:
            cursor.execute("ROLLBACK")
    return recorder.statements


def nodes(plan: dict) -> Iterator[dict]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def explain_pg(text: str, params: Any) -> dict:
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + text, params)
            raw = cursor.fetchone()[0]
        finally:
            cursor.execute("ROLLBACK")
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]


def explain_generic(text: str, params: Any) -> dict:
    """EXPLAIN ANALYZE of the statement's generic plan: prepared with $n parameters, run with
    plan_cache_mode = force_generic_plan, as the worker's own connection runs its claims
    (ox.db.postgresql.prepared). The plan is made without the parameters' values."""
    assert "%%" not in text
    pieces = text.split("%s")
    numbered = pieces[0] + "".join(f"${i}{piece}" for i, piece in enumerate(pieces[1:], 1))
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            cursor.execute(f"PREPARE ox_generic AS {numbered}")
            marks = ", ".join(["%s"] * (len(pieces) - 1))
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE ox_generic({marks})", params)
            raw = cursor.fetchone()[0]
        finally:
            cursor.execute("ROLLBACK")
            cursor.execute("DEALLOCATE ALL")  # PREPARE is not undone by the rollback
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]


def sort_bound(limit: int) -> int:
    return limit * len(QUEUES) * len(set(PRIORITIES) | set(LATER)) * 2


def check_pg(name: str, text: str, params: Any, limit: int, generic: bool = False) -> tuple[int, list[str]]:
    """(buffers touched, problems) of one statement (generic: of its generic plan)."""
    root = explain_generic(text, params) if generic else explain_pg(text, params)
    plan = root["Plan"]
    problems = []
    for node in nodes(plan):
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in ("ox_task", "ox_attempt"):
            problems.append(f"{name}: Seq Scan on {node['Relation Name']}")
        if node["Node Type"] == "Sort" and node.get("Actual Rows", 0) * node.get("Actual Loops", 1) > 0:
            sorted_rows = sum(c.get("Actual Rows", 0) * c.get("Actual Loops", 1) for c in node.get("Plans", []))
            if sorted_rows > sort_bound(limit):
                problems.append(f"{name}: sorts {sorted_rows} rows")
    return plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0), problems


def hot_paths(limit: int) -> dict[str, Callable[[], Any]]:
    now = clock.db_now(connection)
    lease = now + timedelta(seconds=30)
    keys = running_keys()
    done = [sql.Completion(i, f, "null", now, now) for i, f, _ in keys[:5]]
    return {
        "claim one queue": lambda: sql.claim(connection, "w-x", ["default"], (limit, 0), now, lease),
        "claim one queue, both kinds": lambda: sql.claim(connection, "w-x", ["emails"], (limit, limit), now, lease),
        "claim many queues": lambda: sql.claim(connection, "w-x", QUEUES, (limit, limit), now, lease),
        "complete and claim": lambda: sql.complete_and_claim(connection, done, "w-x", QUEUES, (limit, 0), now, lease),
        "earliest_ready one queue": lambda: sql.earliest_ready(connection, ["default"]),
        "earliest_ready many queues": lambda: sql.earliest_ready(connection, QUEUES, (True, False)),
        "earliest_ready missing queue": lambda: sql.earliest_ready(connection, ["nope"]),
        "renew": lambda: sql.renew(connection, keys, lease),
        "hand back": lambda: sql.hand_back(connection, [(i, f) for i, f, _ in keys[:5]], now),
        "heartbeat": lambda: sql.heartbeat(connection, "w-plans", now),
        "rescue": lambda: sql.rescue_and_mark(connection, now),
        "attempt history": lambda: sql.attempt_history(connection, [i for i, _f, _ in keys]),
        # Limited queues (ox.flow.gate): lock, count what runs, candidates, rates, claim.
        "claim through the gate": lambda: gate.claim_limited(
            connection, "w-x", {"emails": GATED, "reports": GATED}, (limit, limit), now, lease, done
        ),
    }


# The statements ox.db.postgresql.prepared runs as prepared statements with generic plans.
PREPARED = ("claim one queue", "claim one queue, both kinds", "claim many queues", "complete and claim")


def measure_all(limit: int) -> dict[str, tuple[int, list[str]]]:
    # The gate's PostgreSQL path sends its statements several to a query (ox.db.postgresql.gate),
    # which EXPLAIN cannot take: measure the same statements one at a time.
    from ox.db.postgresql import gate as gate_pg

    usable, gate_pg.usable = gate_pg.usable, lambda conn: False
    try:
        return _measure_all(limit)
    finally:
        gate_pg.usable = usable


def _measure_all(limit: int) -> dict[str, tuple[int, list[str]]]:
    out = {}
    for name, call in hot_paths(limit).items():
        total, problems = 0, []
        for text, params in statements_of(call):
            if text.lstrip().upper().startswith(("SELECT PG_TRY_ADVISORY", "SET TRANSACTION")):
                continue
            # The gate reads a window of candidates past what it takes (tasks of full keys
            # are passed over): its sorts are bounded by that window, not by `limit`.
            bound = gate._window(limit) if "gate" in name else limit
            buffers, found = check_pg(name, text, params, bound)
            total += buffers
            problems += found
        out[name] = (total, problems)
        if name in PREPARED:
            # The worker's own connection runs these prepared, with generic plans: a plan made
            # without knowing the time or the queues must not read the backlog either.
            [(text, params)] = statements_of(call)
            buffers, found = check_pg(f"{name} (generic plan)", text, params, limit, generic=True)
            out[f"{name} (generic plan)"] = (buffers, found)
    return out


@pytest.mark.skipif(not pg, reason="buffers are PostgreSQL's; SQLite's plans are checked below")
def test_hot_path_statements_cost_the_same_as_the_backlog_grows() -> None:
    fill(BASE_READY, -3600)
    fill(BASE_READY // 50, 86_400, priorities=LATER)
    fill_running_and_finished()
    limit = 10
    before = measure_all(limit)
    # Five times the backlog: more due tasks, and many more scheduled for tomorrow at a
    # priority above every due one. (What grows is the number of tasks, not of priorities:
    # earliest_ready and the claim probe the index once per priority present.)
    fill(BASE_READY * 3, -7200)
    fill(BASE_READY, 86_400, priorities=LATER)
    after = measure_all(limit)
    problems = [p for _name, (_b, found) in {**before, **after}.items() for p in found]
    for name, (was, _found) in before.items():
        now = after[name][0]
        if now > was * GROWTH + SLACK:
            problems.append(f"{name}: {was} -> {now} buffers as the backlog grew fivefold")
    assert not problems, "\n".join(problems)


@pytest.mark.skipif(not pg, reason="PostgreSQL's plans")
def test_claim_reads_the_ready_index_per_queue_and_locks_what_it_takes() -> None:
    fill(BASE_READY, -3600)
    parts = claim_parts("w-x", QUEUES, (10, 0), clock.db_now(connection), clock.db_now(connection))
    text = f"WITH {', '.join(parts.picks)} {parts.update}"
    plan = explain_pg(text, [*parts.pick_params, *parts.update_params])["Plan"]
    scans = [n for n in nodes(plan) if n.get("Relation Name") == "ox_task"]
    index_scans = {"Index Scan", "Index Only Scan"}
    assert {n.get("Index Name") for n in scans if n["Node Type"] in index_scans} >= {"ox_task_ready_claim"}
    assert any(n["Node Type"] == "LockRows" for n in nodes(plan))
    assert plan.get("Actual Rows") == 10


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's plans; PostgreSQL's are checked above")
def test_sqlite_plans_search_the_ready_index() -> None:
    fill(5_000, -3600)
    fill_running_and_finished()
    problems = []
    for name, call in hot_paths(10).items():
        seen = []
        for text, params in statements_of(call):
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN QUERY PLAN " + text, params)
                details = [str(r[3]) for r in cursor.fetchall()]
            seen += details
            for line in details:
                if line.startswith("SCAN ox_task") or line == "SCAN t" or line.startswith("SCAN t "):
                    problems.append(f"{name}: {line}")
        if name.startswith(("claim", "earliest")) and not any("ox_task_ready_claim" in d for d in seen):
            problems.append(f"{name}: does not use the READY index: {seen}")
    assert not problems, "\n".join(problems)


def test_claim_takes_the_best_due_tasks_across_queues_and_priorities() -> None:
    from tests import tasks

    later = timedelta(hours=1)
    expected = []
    for queue, priority, delay, key in [
        ("default", 50, later, "later-50"),  # above every due task, not due: never claimed
        ("emails", 40, later, "later-40"),
        ("default", 5, None, "d5"),
        ("emails", 7, None, "e7"),
        ("default", 5, None, "d5b"),
        ("emails", -3, None, "e-3"),
        ("default", 0, None, "d0"),
        ("reports", 9, None, "r9"),  # a queue this claim does not ask for
    ]:
        call = tasks.record.using(queue_name=queue, priority=priority, run_after=delay)
        result = call.enqueue(key)
        expected.append((key, result.id))
    now = clock.db_now(connection)
    for kinds in ((4, 0), (4, 4)):
        with transaction.atomic():
            got = sql.claim(connection, "w-x", ["default", "emails"], kinds, now, now + timedelta(seconds=30))
            transaction.set_rollback(True)
        keys = [json.loads(c.args_json)[0] for c in got]
        assert keys == ["e7", "d5", "d5b", "d0"], keys
    assert sql.earliest_ready(connection, ["default", "emails"]) <= now
    assert sql.earliest_ready(connection, ["nope"]) is None
