"""Adversarial tests of the claim by priority level (ox.db.postgresql.claim: pick_sql, claim_parts; ox.sql: claim,
_claim_sqlite, complete_and_claim, earliest_ready) and of the database's clock (ox.clock).

Claims and earliest_ready are checked against a brute force over random data (Hypothesis), on
both databases, inside and outside a caller's atomic block; PostgreSQL also gets concurrent
claimers (threads, each on its own connection) while priority levels appear and disappear.
Tests headed 'Found by review (fixed)' are bugs found here, each fixed in ox since.
"""

import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import DatabaseError, connection, connections, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ox import clock, sql
from ox.connection import open_worker_connection
from ox.db.postgresql.claim import claim_parts
from ox.models import Status, Task
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)

pg = connection.vendor == "postgresql"
ROOT = Path(__file__).resolve().parent.parent
ODD_QUEUES = ["default", "emails", "q'uote", "a b", "%s", "ünïcode", "Default", "x" * 64, "", "_%"]


@dataclass
class Row:
    id: uuid.UUID
    queue: str
    priority: int
    is_async: bool
    run_after: datetime
    status: str = "READY"


def insert(rows: list[Row], now: datetime, conn=None) -> None:
    conn = conn or connection
    new = [
        sql.NewTask(
            id=r.id,
            task_path="tests.tasks.noop",
            queue=r.queue,
            priority=r.priority,
            args=[],
            kwargs={},
            run_after=r.run_after,
            enqueued_at=now,
            max_attempts=3,
            is_async=r.is_async,
        )
        for r in rows
    ]
    # One row at a time and in batches (COPY on PostgreSQL): both insert paths.
    if new:
        sql.insert_tasks(conn, new[:1])
        sql.insert_tasks(conn, new[1:])
    others = [r for r in rows if r.status != "READY"]
    with conn.cursor() as cursor:
        for r in others:
            cursor.execute(
                "UPDATE ox_task SET status = %s, attempts = 1, fence = 1 WHERE id = %s",
                [r.status, r.id if pg else r.id.hex],
            )


def wipe() -> None:
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM ox_attempt")
        cursor.execute("DELETE FROM ox_task")


def claim_order(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (-r.priority, r.run_after, r.id))


def due(rows: list[Row], queues: list[str], is_async: bool, now: datetime) -> list[Row]:
    wanted = set(queues)
    return claim_order(
        [r for r in rows if r.status == "READY" and r.queue in wanted and r.is_async == is_async and r.run_after <= now]
    )


def brute_claim(rows: list[Row], queues: list[str], limits: tuple[int, int], now: datetime) -> list[uuid.UUID]:
    picked = due(rows, queues, False, now)[: limits[0]] + due(rows, queues, True, now)[: limits[1]]
    return [r.id for r in claim_order(picked)]


def brute_earliest(rows: list[Row], queues: list[str], kinds: tuple[bool, bool]) -> datetime | None:
    found = [
        r.run_after
        for r in rows
        if r.status == "READY"
        and r.queue in set(queues)
        and ((kinds[0] and not r.is_async) or (kinds[1] and r.is_async))
    ]
    return min(found) if found else None


def completions(claimed: list[sql.Claimed], now: datetime) -> list[sql.Completion]:
    return [
        sql.Completion(id=c.id, fence=c.fence, return_json="null", started_at=now, finished_at=now) for c in claimed
    ]


def base_now() -> datetime:
    return clock.db_now(connection).replace(microsecond=0)


# --- claim order and earliest_ready against a brute force ------------------------------------

row_strategy = st.builds(
    lambda queue, priority, is_async, offset_ms, status: (queue, priority, is_async, offset_ms, status),
    st.sampled_from(ODD_QUEUES[:6]),
    st.one_of(st.sampled_from([-100, -1, 0, 1, 100]), st.integers(-100, 100)),
    st.booleans(),
    st.sampled_from([-2000, -1, 0, 0, 0, 1, 1000, 3_600_000]),  # ties, exactly due, later
    st.sampled_from(["READY"] * 6 + ["RUNNING", "SUCCESSFUL", "FAILED"]),
)
limit_strategy = st.sampled_from([0, 1, 2, 3, 500])


def make_rows(spec, now: datetime) -> list[Row]:
    return [Row(uuid.uuid4(), q, p, a, now + timedelta(milliseconds=off), status) for q, p, a, off, status in spec]


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    spec=st.lists(row_strategy, max_size=40),
    queues=st.lists(st.sampled_from(ODD_QUEUES[:7]), min_size=1, max_size=6),  # duplicates and absent ones
    limits=st.tuples(limit_strategy, limit_strategy),
    inside_atomic=st.booleans(),
)
def test_one_claim_matches_the_brute_force(spec, queues, limits, inside_atomic):
    wipe()
    now = base_now()
    rows = make_rows(spec, now)
    insert(rows, now)
    lease = now + timedelta(seconds=30)
    if inside_atomic:
        with transaction.atomic():
            got = sql.claim(connection, "w", queues, limits, now, lease)
    else:
        got = sql.claim(connection, "w", queues, limits, now, lease)
    assert [c.id for c in got] == brute_claim(rows, queues, limits, now)
    claimed = {c.id for c in got}
    assert all(c.attempts == 1 and c.fence == 1 and c.queue in queues for c in got)
    assert set(Task.objects.filter(status=Status.RUNNING, worker_id="w").values_list("id", flat=True)) == claimed


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    spec=st.lists(row_strategy, max_size=40),
    queues=st.lists(st.sampled_from(ODD_QUEUES[:7]), min_size=1, max_size=6),
    step=st.tuples(st.sampled_from([1, 2, 3, 7]), st.sampled_from([0, 1, 2, 5])),
    inside_atomic=st.booleans(),
)
def test_draining_with_complete_and_claim_takes_every_due_task_once_in_order(spec, queues, step, inside_atomic):
    """Claim `step` at a time, completing the previous claim with the next: every due task of
    each kind comes out exactly once, in priority then FIFO order; the later ones never."""
    wipe()
    now = base_now()
    rows = make_rows(spec, now)
    insert(rows, now)
    lease = now + timedelta(seconds=30)
    taken: dict[bool, list[uuid.UUID]] = {False: [], True: []}
    previous: list[sql.Claimed] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done = completions(previous, now)
        if inside_atomic:
            with transaction.atomic():
                written, got = sql.complete_and_claim(connection, done, "w", queues, step, now, lease)
        else:
            written, got = sql.complete_and_claim(connection, done, "w", queues, step, now, lease)
        assert written == {c.key for c in previous}
        assert [c.id for c in got] == [c.id for c in claim_order_claimed(got)]
        for c in got:
            taken[c.is_async].append(c.id)
        if not got:
            break
        previous = got
    for is_async, limit in ((False, step[0]), (True, step[1])):
        expected = [r.id for r in due(rows, queues, is_async, now)] if limit else []
        assert taken[is_async] == expected
    assert Task.objects.filter(status=Status.SUCCESSFUL, worker_id="w").count() == len(taken[False]) + len(taken[True])


def claim_order_claimed(got: list[sql.Claimed]) -> list[sql.Claimed]:
    return sorted(got, key=lambda c: (-c.priority, c.run_after, c.id))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    spec=st.lists(row_strategy, max_size=40),
    queues=st.lists(st.sampled_from(ODD_QUEUES[:7]), max_size=6),
    kinds=st.tuples(st.booleans(), st.booleans()),
)
def test_earliest_ready_is_the_minimum_run_after(spec, queues, kinds):
    wipe()
    now = base_now()
    rows = make_rows(spec, now)
    insert(rows, now)
    assert sql.earliest_ready(connection, queues, kinds) == brute_earliest(rows, queues, kinds)


# --- priorities at the edges, many levels, many queues ---------------------------------------


def levels_fixture(queues: list[str], priorities: list[int], per_level: int, now: datetime) -> list[Row]:
    rows = []
    for q in queues:
        for p in priorities:
            for i in range(per_level):
                for is_async in (False, True):
                    rows.append(Row(uuid.uuid4(), q, p, is_async, now - timedelta(seconds=i % 3)))
    random.Random(7).shuffle(rows)
    return rows


def drain(queues: list[str], limits: tuple[int, int], now: datetime) -> dict[bool, list[uuid.UUID]]:
    lease = now + timedelta(seconds=30)
    taken: dict[bool, list[uuid.UUID]] = {False: [], True: []}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = sql.claim(connection, "w", queues, limits, now, lease)
        if not got:
            break
        for c in got:
            taken[c.is_async].append(c.id)
    return taken


@pytest.mark.parametrize(
    ("queue_count", "limits"),
    [(1, (500, 500)), (1, (1, 3)), (20, (500, 1)), (20, (1, 500))],
)
def test_every_priority_from_minus_100_to_100_in_order(queue_count, limits):
    """All 201 priorities in one queue; and in twenty queues a handful of levels each, -100
    and 100 among them. Drained with the claim, priority order then FIFO, per kind."""
    now = base_now()
    queues = ODD_QUEUES[:queue_count] if queue_count <= len(ODD_QUEUES) else [f"q{i}" for i in range(queue_count)]
    queues = queues + [f"z{i}" for i in range(queue_count - len(queues))]
    priorities = list(range(-100, 101)) if queue_count == 1 else [-100, -37, 0, 58, 100]
    rows = levels_fixture(queues, priorities, 2 if queue_count == 1 else 3, now)
    insert(rows, now)
    taken = drain([*queues, queues[0]], limits, now)  # a duplicated name on the way
    assert taken[False] == [r.id for r in due(rows, queues, False, now)]
    assert taken[True] == [r.id for r in due(rows, queues, True, now)]


# Found by review (fixed): SQLite: the claim is one UNION ALL branch per (queue, priority)
# waiting, and SQLite refuses a compound SELECT of more than 500 terms
# (SQLITE_MAX_COMPOUND_SELECT): 3 queues x 201 priorities makes every claim fail with 'too many
# terms in compound SELECT'.
def test_three_queues_with_every_priority():
    now = base_now()
    queues = ["default", "emails", "reports"]
    rows = levels_fixture(queues, list(range(-100, 101)), 1, now)
    insert(rows, now)
    taken = drain(queues, (50, 50), now)
    assert taken[False] == [r.id for r in due(rows, queues, False, now)]
    assert taken[True] == [r.id for r in due(rows, queues, True, now)]


# Found by review (fixed): An empty queue list builds invalid SQL: PostgreSQL `FROM () AS
# l(queue)`, SQLite `pairs(queue, is_async) AS ()` (the statement before 49bfbdc returned no
# tasks). runworker passes [] for a backend whose QUEUES is [] (Django: any queue).
def test_claim_with_no_queues_claims_nothing():
    now = base_now()
    insert([Row(uuid.uuid4(), "default", 0, False, now)], now)
    assert sql.earliest_ready(connection, []) is None
    assert sql.claim(connection, "w", [], (1, 1), now, now + timedelta(seconds=30)) == []


def test_sqlite_claim_inside_atomic_rolls_back_with_it():
    """claim() inside the caller's atomic block is part of it (a savepoint on SQLite, a plain
    statement on PostgreSQL): rolled back with it, and the block goes on after it."""
    now = base_now()
    rows = [Row(uuid.uuid4(), "default", p, False, now) for p in (5, 0)]
    insert(rows, now)
    lease = now + timedelta(seconds=30)

    class Undo(Exception):
        pass

    with pytest.raises(Undo):
        with transaction.atomic():
            got = sql.claim(connection, "w", ["default"], 1, now, lease)
            assert [c.priority for c in got] == [5]
            got = sql.claim(connection, "w", ["default"], 1, now, lease)
            assert [c.priority for c in got] == [0]
            raise Undo
    assert Task.objects.filter(status=Status.READY).count() == 2
    with transaction.atomic():
        sql.claim(connection, "w", ["default"], 5, now, lease)
        Task.objects.filter(status=Status.RUNNING).update(worker_id="w2")
    assert Task.objects.filter(status=Status.RUNNING, worker_id="w2").count() == 2


# --- PostgreSQL: claimers at once ------------------------------------------------------------

needs_pg = pytest.mark.skipif(not pg, reason="PostgreSQL: concurrent claimers")


@needs_pg
def test_concurrent_claimers_never_share_a_task_while_levels_come_and_go():
    """Four claimers (threads, each on its own connection) drain a backlog with
    complete_and_claim while a producer keeps adding tasks at priorities that appear and are
    claimed away: no task is claimed twice, none is lost, no claimer sees an error."""
    now = base_now()
    queues = ["default", "emails", "q'uote", "a b"]
    rows = levels_fixture(queues, [-100, -5, 0, 5, 100], 30, now)  # 1,200 tasks
    insert(rows, now)
    claimed: list[tuple[str, uuid.UUID, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()
    produced: list[uuid.UUID] = []
    leftover: list[int] = []

    def claimer(n: int) -> None:
        rng = random.Random(n)
        conn = connections["default"]
        previous: list[sql.Claimed] = []
        try:
            idle_since = None
            deadline = time.monotonic() + 25
            while time.monotonic() < deadline:
                mine = rng.sample(queues, rng.randint(1, 4))
                mine += mine[:1]
                limits = (rng.choice([1, 1, 5, 50]), rng.choice([0, 1, 10, 100]))
                at = clock.db_now(conn)
                written, got = sql.complete_and_claim(
                    conn, completions(previous, at), f"w{n}", mine, limits, at, at + timedelta(seconds=60)
                )
                assert written == {c.key for c in previous}
                with lock:
                    claimed.extend((f"w{n}", c.id, c.fence) for c in got)
                previous = got
                if got:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif stop.is_set() and time.monotonic() - idle_since > 0.5:
                    break
            leftover.append(len(previous))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            conn.close()

    def producer() -> None:
        conn = connections["default"]
        try:
            deadline = time.monotonic() + 3
            i = 0
            while time.monotonic() < deadline:
                at = clock.db_now(conn)
                batch = [Row(uuid.uuid4(), queues[i % 4], 100 - (i % 7) * 33, i % 3 == 0, at) for _ in range(3)]
                insert(batch, at, conn)
                produced.extend(r.id for r in batch)
                i += 1
                time.sleep(0.01)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            stop.set()
            conn.close()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)] + [threading.Thread(target=producer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=40)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    ids = [i for _w, i, _f in claimed]
    assert len(ids) == len(set(ids)), "a task was claimed twice"
    assert set(ids) == {r.id for r in rows} | set(produced)
    assert all(f == 1 for _w, _i, f in claimed)
    unfinished = sum(leftover)  # each claimer's last claim is left RUNNING
    assert Task.objects.filter(status=Status.RUNNING).count() == unfinished
    assert Task.objects.filter(status=Status.SUCCESSFUL).count() == len(claimed) - unfinished
    assert not Task.objects.filter(status=Status.READY).exists()


@needs_pg
# Found by review (fixed): Over-locking: each (queue, priority) scan locks up to `limit` rows FOR
# UPDATE and the losers stay locked until the claim commits, so a concurrent claimer skips due
# tasks no one will claim: here it takes the newer of two priority-0 tasks (FIFO broken) although
# the first claim (limit 1) only took the priority-10 task. Before 49bfbdc the claim locked
# exactly its `limit` winners.
def test_a_concurrent_claimer_is_not_locked_out_of_tasks_nobody_claims():
    now = base_now()
    older, newer = uuid.uuid4(), uuid.uuid4()
    top = Row(uuid.uuid4(), "default", 10, False, now - timedelta(seconds=3))
    insert(
        [
            top,
            Row(older, "default", 0, False, now - timedelta(seconds=2)),
            Row(newer, "default", 0, False, now - timedelta(seconds=1)),
        ],
        now,
    )
    lease = now + timedelta(seconds=30)
    other = connections.create_connection("default")
    try:
        with transaction.atomic():  # the first claim's statement, still in flight
            first = sql.claim(connection, "w1", ["default"], (1, 0), now, lease)
            assert [c.id for c in first] == [top.id]
            second = sql.claim(other, "w2", ["default"], (1, 0), now, lease)
            assert [c.id for c in second] == [older]
    finally:
        other.close()


@needs_pg
def test_rows_locked_per_claim():
    """Evidence for the over-locking above: how many rows one claim locks, by EXPLAIN
    ANALYZE's LockRows nodes, for 20 queues x 5 priorities of due tasks."""
    now = base_now()
    queues = [f"q{i}" for i in range(20)]
    insert(levels_fixture(queues, [-10, 0, 10, 20, 30], 10, now), now)
    parts = claim_parts("w", queues, (1, 0), now, now + timedelta(seconds=30))
    text = f"WITH {', '.join(parts.picks)} {parts.update}"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + text, [*parts.pick_params, *parts.update_params])
        doc = cursor.fetchone()[0]
        transaction.set_rollback(True)
    doc = json.loads(doc) if isinstance(doc, str) else doc

    def locked(node) -> int:
        own = node["Actual Rows"] * node["Actual Loops"] if node["Node Type"] == "LockRows" else 0
        return own + sum(locked(child) for child in node.get("Plans", []))

    # One task claimed, one row locked (before the fix: one per queue and priority, 100).
    assert locked(doc[0]["Plan"]) == 1


@needs_pg
def test_the_claim_is_never_jit_compiled():
    """Found by review: the recursive walk's estimate puts the claim's cost past
    jit_above_cost once a few thousand tasks wait in many queues; with PostgreSQL's default
    jit=on the claim then spent 40 ms to 0.6 s compiling (20 queues, 100k READY, limits
    (1, 100): 573 ms with JIT, 6.8 ms without). The worker's connection turns JIT off."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_jit_available(), current_setting('jit')")
        available, setting = cursor.fetchone()
        if not available or setting != "on":
            pytest.skip("this PostgreSQL has no JIT, or it is off already")
        cursor.execute(
            "INSERT INTO ox_task (id, task_path, queue, priority, status, args, kwargs, run_after, enqueued_at,"
            " attempts, max_attempts, worker_id, fence, cancel_requested, is_async)"
            " SELECT gen_random_uuid(), 'tests.tasks.noop', 'q' || (i % 20), 0, 'READY', '[]', '{}',"
            " statement_timestamp() - interval '1 hour' + i * interval '1 ms', statement_timestamp(), 0, 3, '', 0,"
            " false, i % 7 = 0 FROM generate_series(1, 20000) AS i"
        )
        cursor.execute("VACUUM (ANALYZE) ox_task")
    now = clock.db_now(connection)
    parts = claim_parts("w", [f"q{i}" for i in range(20)], (10, 100), now, now + timedelta(seconds=30))
    worker = open_worker_connection("default")
    try:
        with worker.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                f"EXPLAIN (ANALYZE, FORMAT JSON) WITH {', '.join(parts.picks)} {parts.update}",
                [*parts.pick_params, *parts.update_params],
            )
            doc = cursor.fetchone()[0]
            cursor.execute("ROLLBACK")
    finally:
        worker.close()
    doc = json.loads(doc) if isinstance(doc, str) else doc
    assert "JIT" not in doc[0], doc[0].get("JIT")


# --- the clock -------------------------------------------------------------------------------


class Reads:
    """Counts `SELECT statement_timestamp()` (ox.clock's reading) on a connection."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, text, params, many, context):
        if "statement_timestamp()" in text and text.strip().startswith("SELECT statement_timestamp"):
            self.count += 1
        return execute(text, params, many, context)


@needs_pg
def test_a_web_process_reads_the_clock_once_a_minute_not_once_per_request():
    """CONN_MAX_AGE=0: every request opens and closes its connection. The reading is per
    process and database, so twenty enqueues over twenty connections read it once."""
    clock.forget(connection)
    reads = Reads()
    with connection.execute_wrapper(reads):
        for _ in range(20):
            tasks.noop.enqueue()
            connection.close()  # what request_finished does with CONN_MAX_AGE=0
    assert reads.count == 1
    assert Task.objects.count() == 20


@needs_pg
def test_forget_reads_the_clock_again_and_db_now_follows_the_server():
    clock.forget(connection)
    reads = Reads()
    with connection.execute_wrapper(reads):
        first = clock.db_now(connection)
        clock.db_now(connection)
        clock.forget(connection)
        second = clock.db_now(connection)
    assert reads.count == 2
    assert first.tzinfo is not None and first.utcoffset() == timedelta(0)
    assert second >= first - timedelta(milliseconds=50)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        server = cursor.fetchone()[0]
    assert abs((clock.db_now(connection) - server).total_seconds()) < 0.25


@needs_pg
def test_db_now_inside_a_long_transaction_is_the_statement_time_not_the_transaction_start():
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            began = cursor.fetchone()[0]
            cursor.execute("SELECT pg_sleep(0.6)")
        clock.forget(connection)
        result = tasks.noop.enqueue()
    task = Task.objects.get(pk=result.id)
    assert task.enqueued_at - began >= timedelta(seconds=0.5)


@needs_pg
def test_an_enqueue_in_a_failed_transaction_fails_and_leaves_the_clock_usable():
    clock.forget(connection)
    with transaction.atomic():
        with pytest.raises(DatabaseError):
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1/0")
        # The transaction is aborted: reading the clock fails like the INSERT would.
        with pytest.raises(DatabaseError):
            tasks.noop.enqueue()
        transaction.set_rollback(True)
    result = tasks.noop.enqueue()
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        server = cursor.fetchone()[0]
    assert abs((Task.objects.get(pk=result.id).enqueued_at - server).total_seconds()) < 1


def test_first_reading_in_a_thread_serves_the_whole_process():
    out: list[datetime] = []

    def work() -> None:
        conn = connections["default"]
        try:
            clock.forget(conn)
            out.append(clock.db_now(conn))
        finally:
            conn.close()

    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=10)
    assert out and out[0].tzinfo is not None
    assert abs((clock.estimated_now() - clock.db_now(connection)).total_seconds()) < 0.25
    assert abs((clock.estimated_now() - datetime.now(UTC)).total_seconds()) < 5  # this host is not skewed


FAKETIME = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
SHIM = Path(__file__).resolve().parent / "faketime_shim"


@needs_pg
@pytest.mark.skipif(not FAKETIME, reason="libfaketime is not installed")
# Found by review (fixed): ox.operations.retry() writes run_after and cancel() finished_at with
# timezone.now(), the web host's clock, not the database's (README: every time ox writes is the
# database's): from a host 120 s ahead, a retried task waits 120 s before any worker claims it
# (behind: it jumps ahead of older tasks of its priority); cancel()'s finished_at feeds prune.
def test_retry_and_cancel_from_a_skewed_web_host_write_database_time():
    failed = Task.objects.create(
        task_path="tests.tasks.noop",
        status=Status.FAILED,
        run_after=clock.db_now(connection),
        enqueued_at=clock.db_now(connection),
        finished_at=clock.db_now(connection),
        attempts=1,
        max_attempts=1,
        fence=1,
    )
    ready = tasks.noop.enqueue()
    from tests.conftest import database_url

    script = f"import django; django.setup(); import ox, sys; ox.retry(['{failed.id}']); ox.cancel(['{ready.id}'])"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "LD_PRELOAD": str(FAKETIME[0]),
        "FAKETIME": "+120s",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": f"{SHIM}{os.pathsep}{ROOT}",
    }
    subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, check=True, timeout=60)
    server = clock.db_now(connection)
    failed.refresh_from_db()
    cancelled = Task.objects.get(pk=ready.id)
    assert failed.status == Status.READY and cancelled.status == Status.CANCELLED
    assert abs((failed.run_after - server).total_seconds()) < 10, failed.run_after - server
    assert abs((cancelled.finished_at - server).total_seconds()) < 10, cancelled.finished_at - server
