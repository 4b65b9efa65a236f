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

from bench import report
from bench.arms import ARM_NAMES, ARMS
from bench.harness import Harness
from bench.limit_sql import INSERT, INSERT_MANY, PAYLOAD, TABLE, Loop, create_schema
from bench.plan import build
from bench.plan_limit import LIMIT, POSTGRES_ONLY, REASONS, RUNS

ROOT = Path(__file__).resolve().parent.parent
SERVER = os.environ.get("OX_LIMIT_TEST_PG", "postgres://postgres@127.0.0.1:5432")
DBNAME = "oxlimit_test"


def test_limit_is_an_arm_with_a_database_of_its_own():
    assert LIMIT in ARM_NAMES and ARM_NAMES[-1] == LIMIT  # its column and ratio come last
    settings, module, database = ARMS[LIMIT]
    assert (settings, module, database) == ("bench.settings_limit", "bench.arms.limit", "oxbench_limit")


def test_limit_runs_its_cells_and_says_why_for_every_other():
    for mode in ("quick", "full"):
        plan = build(mode)
        assert {c.name for c in plan if LIMIT in c.arms} == RUNS, mode
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
        assert by_name["enqueue_atomic"].cannot_run[LIMIT] == REASONS["enqueue_atomic"]
        assert by_name["kill_pgq_recovery"].cannot_run[LIMIT] == "cannot run: a pgqueuer-only cell"
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
