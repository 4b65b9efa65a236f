"""The limit arm (issue 14: "the physical limit as an arm"): its place in the benchmark's plan,
the reasons it gives for every cell it does not run, and its SQL run for real: a bare drain on a
PostgreSQL database of this test's own (`oxlimit_test` at 127.0.0.1:5432, dropped afterwards)
runs every row exactly once, in threads and in the worker process the harness starts. Those two
are skipped when no PostgreSQL answers there. `bench/run --arms ox,limit` is the real run."""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bench import limit_tasks, report
from bench.arms import ARM_NAMES, ARMS
from bench.harness import Harness
from bench.limit_jobs import batch_for
from bench.limit_sql import (
    ASYNC_SLOTS,
    BATCH,
    CLAIM,
    INSERT,
    INSERT_MANY,
    INSERT_SERIES,
    PAYLOAD,
    TABLE,
    Loop,
    copy_payloads,
    create_schema,
)
from bench.plan import WORKLOADS, build
from bench.plan_limit import LIMIT, POSTGRES_ONLY, REASONS, RUNS
from tests.helpers import in_fresh_thread

ROOT = Path(__file__).resolve().parent.parent
SERVER = os.environ.get("OX_LIMIT_TEST_PG", "postgres://postgres@127.0.0.1:5432")
DBNAME = "oxlimit_test"


def test_limit_is_an_arm_with_a_database_of_its_own():
    assert LIMIT in ARM_NAMES and ARM_NAMES[-1] == LIMIT  # its column and ratio come last
    settings, module, database = ARMS[LIMIT]
    assert (settings, module, database) == ("bench.settings_limit", "bench.arms.limit", "oxbench_limit")


# Every cell the limit runs, spelled out (RUNS is built from the plan's names; this is the check).
RUNS_FULL = {
    "enqueue_seq",
    "enqueue_atomic",
    "bulk_enqueue",
    "drain_c1",
    "drain_c4",
    "drain_p4_conn600",
    *(f"{w}_c{c}" for w in ("cpu_bound", "io_bound", "io_bound_async", "mixed") for c in (1, 4)),
    *(f"backlog_{size}_{shape}" for size in ("10k", "100k", "1m") for shape in ("c1", "p4")),
    "enqueue_p4",
    "enqueue_p16",
    "drain_p2",
    "drain_p8",
}
RUNS_QUICK = {
    "enqueue_seq",
    "enqueue_atomic",
    "bulk_enqueue",
    "drain_c1",
    "drain_c4",
    "backlog_10k_c1",
    "backlog_100k_c1",
    "enqueue_p4",
    "enqueue_p16",
}


def test_limit_runs_its_cells_and_says_why_for_every_other():
    assert RUNS == RUNS_FULL
    for mode, expected in (("quick", RUNS_QUICK), ("full", RUNS_FULL)):
        plan = build(mode)
        assert {c.name for c in plan if LIMIT in c.arms} == expected, mode
        for cell in plan:
            if LIMIT in cell.arms:
                assert LIMIT not in cell.cannot_run
                continue
            why = cell.cannot_run[LIMIT]
            assert why.startswith(("cannot run: ", "not run yet: ")), (cell.name, why)
            if cell.db != "pg":
                assert why == POSTGRES_ONLY
        by_name = {c.name: c for c in plan}
        for name in ("dispatch", "kill"):
            assert by_name[name].cannot_run[LIMIT] == REASONS[name]
        assert by_name["drain_defaults"].cannot_run[LIMIT] == REASONS["drain_defaults"]
        assert by_name["kill_pgq_recovery"].cannot_run[LIMIT] == "cannot run: a pgqueuer-only cell"
        if mode == "full":
            for name in ("drain_p4_conn0", "drain_p4_pool"):
                assert by_name[name].cannot_run[LIMIT] == REASONS["drain_p4"]
        # Nothing the limit could run is left without a job.
        assert not [c.name for c in plan if c.cannot_run.get(LIMIT, "").startswith("not run yet")], mode
        assert by_name["procs_p1"].cannot_run[LIMIT] == REASONS["ox_only"]
        # The other arms' cells are as before: the limit joins, nobody moves or leaves.
        drain = by_name["drain_c1"].arms
        assert drain[:5] == ("ox", "django-tasks-db", "django-ox", "pgqueuer", "procrastinate")
        assert drain[-3:] == ("oban", "dj-queue", "celery") and LIMIT in drain


def test_the_report_shows_the_limit_as_an_arm_and_ox_as_a_fraction_of_it(tmp_path, monkeypatch, capsys):
    args = argparse.Namespace(
        quick=True,
        arms="ox,limit",
        pg_url="postgres://nobody@127.0.0.1:1",
        cells="enqueue_seq,drain_c1,dispatch",
        out=str(tmp_path / "r.json"),
    )
    harness = Harness(args)
    harness.doc = {
        "schema": 1,
        "run_id": "test",
        "started_at": "2026-01-01T00:00:00+00:00",
        "git_sha": "0" * 40,
        "mode": "quick",
        "arms": harness.arms,
        "environment": {},
        "options": {},
        "cells": [],
        "runs": [],
    }
    speed = {"ox": 1000.0, LIMIT: 4000.0}
    monkeypatch.setattr(
        harness, "agent", lambda arm, *a: {"ok": True, "result": {"throughput": speed[arm], "info": {}}}
    )
    for index, cell in enumerate(harness.plan):
        harness.run_cell(index, cell)
    doc = harness.doc
    assert report.validate(doc) == []
    by = {(c["name"], c["metric"]): c for c in doc["cells"]}
    assert by[("drain_c1", "throughput")]["ratios"] == {LIMIT: 0.25}
    assert by[("dispatch", "latency_p50")]["cannot_run"] == {LIMIT: REASONS["dispatch"]}
    table = report.table(doc)
    header = table.splitlines()[0].split()
    assert header[-2:] == [LIMIT, f"ox/{LIMIT}"]
    row = next(line for line in table.splitlines() if line.startswith("enqueue_seq"))
    assert row.split()[-1] == "0.25x-"  # ox at a quarter of the limit
    assert f"{LIMIT}: {REASONS['dispatch']}" in capsys.readouterr().out


# ------------------------------------------------------------------ the SQL, for real
def _server_answers() -> bool:
    try:
        psycopg.connect(f"{SERVER}/postgres", connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


@pytest.fixture
def limit_db() -> Iterator[str]:
    """A fresh `oxlimit_test` with the limit's table, dropped afterwards."""
    if not _server_answers():
        pytest.skip(f"no PostgreSQL at {SERVER}")
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DBNAME} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DBNAME}")
    url = f"{SERVER}/{DBNAME}"
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            create_schema(conn)
        yield url
    finally:
        with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DBNAME} WITH (FORCE)")


def _fill(url: str, n: int) -> list[int]:
    """n ready rows: a few by the enqueue's own INSERT, the rest in one statement; their ids."""
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(5):
            conn.execute(INSERT, (PAYLOAD,))
        conn.execute(INSERT_MANY, (json.dumps([json.loads(PAYLOAD)] * (n - 5)),))
        return [i for (i,) in conn.execute(f"SELECT id FROM {TABLE} ORDER BY id").fetchall()]  # noqa: S608


def test_bare_loops_drain_every_row_exactly_once(limit_db):
    ids = _fill(limit_db, 400)
    with psycopg.connect(limit_db, autocommit=True) as conn:  # not due yet: never claimed
        conn.execute(
            f"INSERT INTO {TABLE} (payload, run_after) VALUES (%s::jsonb, now() + interval '1 hour')", (PAYLOAD,)
        )  # noqa: S608
    # Four loops with a small batch, so their claims overlap and SKIP LOCKED has work to do.
    loops = [Loop(limit_db, batch=7, deadline=time.monotonic() + 60, keep_ids=True) for _ in range(4)]
    threads = [threading.Thread(target=loop.run, kwargs={"until_empty": True}) for loop in loops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=70)
    assert not any(thread.is_alive() for thread in threads)
    ran = [i for loop in loops for i in loop.ran]
    assert sorted(ran) == ids  # each row once, none twice, none missed
    with psycopg.connect(limit_db) as conn:
        rows = conn.execute(
            f"SELECT status, count(*), bool_and(started_at <= finished_at) FROM {TABLE} GROUP BY 1 ORDER BY 1"  # noqa: S608
        ).fetchall()
    assert rows == [("done", 400, True), ("ready", 1, None)]
    # Two statements per batch (a claim may come back short while other loops hold rows, so at
    # least 400 / 7 batches), and one empty claim per loop at the end.
    batched = sum(loop.statements for loop in loops) - 4
    assert batched % 2 == 0 and batched // 2 >= -(-400 // 7)


def test_the_worker_process_drains_and_reports_its_statements(limit_db, tmp_path):
    ids = _fill(limit_db, 300)
    count_file = tmp_path / "counts.json"
    env = {**os.environ, "BENCH_DB_URL": limit_db, "BENCH_SQL_COUNT_FILE": str(count_file)}
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen(  # noqa: S603  (our interpreter, our module)
            [sys.executable, "-m", "bench.limit_worker", "--concurrency", "2", "--ident", "t", "--batch", "50"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        done = 0
        with psycopg.connect(limit_db, autocommit=True) as conn:
            while time.monotonic() < deadline:
                done = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE status = 'done'").fetchone()[0]  # noqa: S608
                if done == len(ids):
                    break
                time.sleep(0.1)
        assert done == len(ids), (tmp_path / "worker.log").read_text()
        os.kill(worker.pid, signal.SIGTERM)
        assert worker.wait(timeout=20) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)
    counts = json.loads(count_file.read_text())
    # 300 rows in batches of 50: at least 6 claims and 6 completions, plus the idle polls.
    assert counts["executes"] >= 12 and counts["begins"] == counts["commits"] == 0


# ------------------------------------------------------------------ the workloads and the batch
def test_the_workload_bodies_are_bench_tasks_own():
    from bench import tasks

    def code(function):
        c = function.__code__
        return c.co_code, c.co_consts, c.co_names, c.co_varnames

    assert set(limit_tasks.TASKS) == {"noop", *WORKLOADS}
    for name, function in limit_tasks.TASKS.items():
        assert code(function) == code(getattr(tasks, name).func), name
    assert code(limit_tasks.sha_rounds) == code(tasks.sha_rounds)


def test_tasks_that_take_time_are_claimed_one_per_loop_async_ones_100_per_process():
    for c in (1, 4):
        assert batch_for("noop", c) == BATCH == 100
        assert {batch_for(w, c) for w in WORKLOADS if w != "io_bound_async"} == {1}
        assert batch_for("io_bound_async", c) * c == ASYNC_SLOTS == 100  # ox's --async-concurrency default


def test_the_worker_argv_carries_the_batch():
    from bench.arms.limit import LimitArm

    arm = LimitArm()
    assert arm.worker_argv(4, "w", None) == ["--concurrency", "4", "--ident", "w", "--batch", "100"]
    arm.batch = 1
    assert arm.worker_argv(1, "w", 1.0)[-2:] == ["--batch", "1"]


def test_copy_and_the_series_fill_write_ready_rows_the_claim_finds_by_its_index(limit_db):
    with psycopg.connect(limit_db, autocommit=True) as conn:
        with conn.cursor() as cursor:  # the bulk cell's path: one COPY, a row per call
            copy_payloads(cursor, [json.loads(PAYLOAD)] * 30)
        assert conn.execute(f"SELECT count(*) FROM {TABLE} WHERE status = 'ready'").fetchone()[0] == 30  # noqa: S608
        conn.execute(f"TRUNCATE {TABLE}")  # noqa: S608
        with conn.transaction():  # the backlog cells' fill, ANALYZEd as the harness does
            conn.execute(INSERT_SERIES, (PAYLOAD, 50_000))
            conn.execute(f"ANALYZE {TABLE}")  # noqa: S608
        rows = conn.execute(f"SELECT count(*), count(DISTINCT run_after), min(payload::text) FROM {TABLE}").fetchone()  # noqa: S608
        assert rows[:2] == (50_000, 1) and json.loads(rows[2]) == json.loads(PAYLOAD)
        # The claim reads the partial index in run order and probes the primary key per row: no
        # sequential scan of the backlog (bench/README.md has the plan at 1,000,000 rows).
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (COSTS OFF) " + CLAIM.replace("%s", "100")))
        assert f"Index Scan using {TABLE}_ready" in plan and f"Index Scan using {TABLE}_pkey" in plan, plan
        assert "Seq Scan" not in plan, plan


def test_loops_run_the_workloads_one_task_each_at_a_time(limit_db):
    payloads = [{"task": name, "args": [], "kwargs": {}} for name in ("io_bound", "io_bound_async", "noop")] * 4
    with psycopg.connect(limit_db, autocommit=True) as conn:
        with conn.cursor() as cursor:
            copy_payloads(cursor, payloads)
    loops = [Loop(limit_db, batch=1, deadline=time.monotonic() + 60, keep_ids=True) for _ in range(3)]
    threads = [threading.Thread(target=loop.run, kwargs={"until_empty": True}) for loop in loops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=70)
    assert sorted(i for loop in loops for i in loop.ran) == list(range(1, 13))
    with psycopg.connect(limit_db) as conn:
        done, overlap = conn.execute(
            f"SELECT count(*), (SELECT max(n) FROM (SELECT count(*) AS n FROM {TABLE} a JOIN {TABLE} b"  # noqa: S608
            " ON b.started_at <= a.started_at AND a.started_at < b.finished_at GROUP BY a.id) x)"
            f" FROM {TABLE} WHERE status = 'done' AND finished_at - started_at >= interval '50 ms'"
        ).fetchone()
    assert done == 8  # the sleeps ran, the async one on the loop thread's event loop too
    assert overlap <= 3  # a batch of 1: never more at once than there are loops


def test_a_loop_runs_the_async_tasks_of_its_batch_at_once(limit_db):
    with psycopg.connect(limit_db, autocommit=True) as conn:
        with conn.cursor() as cursor:
            copy_payloads(cursor, [{"task": "io_bound_async", "args": [], "kwargs": {}}] * 20)
    loop = Loop(limit_db, batch=10, deadline=time.monotonic() + 60, keep_ids=True)
    in_fresh_thread(lambda: loop.run(until_empty=True))  # its event loop, not one a test left here
    assert sorted(loop.ran) == list(range(1, 21))
    with psycopg.connect(limit_db) as conn:
        batches, span = conn.execute(
            f"SELECT count(DISTINCT finished_at), extract(epoch FROM max(finished_at) - min(started_at)) FROM {TABLE}"  # noqa: S608
        ).fetchone()
    # Two claims of 10, each batch's ten 50 ms sleeps at once: about 0.1 s, not 20 x 0.05 = 1 s.
    assert batches == 2 and span < 0.6
