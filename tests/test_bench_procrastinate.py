"""The procrastinate arm's place in the benchmark (issue 14, the peer after pgqueuer): which cells
it runs, that every other cell says why not, that the harness reports those reasons, and the
arm's and worker's pure helpers. Nothing here starts a worker or needs procrastinate installed
(it lives in bench/.venv only); `bench/run --arms procrastinate` is the real run."""

import argparse
import json

import pytest

from bench import report
from bench.harness import Harness
from bench.plan import build
from bench.plan_pgqueuer import PGQUEUER
from bench.plan_procrastinate import POSTGRES_ONLY, PROCRASTINATE, REASONS, RECOVERY_CRON, RUNS
from bench.procrastinate_worker import id_file

OWN = {"kill_procrastinate_recovery"}
QUICK = {
    "enqueue_seq",
    "enqueue_atomic",
    "bulk_enqueue",
    "drain_c1",
    "drain_c4",
    "dispatch",
    "kill",
    "drain_defaults",
    "backlog_10k_c1",
    "backlog_100k_c1",
    "enqueue_p4",
    "enqueue_p16",
}
FULL = (QUICK - {"backlog_100k_c1", "backlog_10k_c1"}) | {
    "drain_p4_conn600",
    "drain_p2",
    "drain_p8",
    *(f"{w}_c{c}" for w in ("cpu_bound", "io_bound", "io_bound_async", "mixed") for c in (1, 4)),
    *(f"backlog_{size}_{shape}" for size in ("10k", "100k", "1m") for shape in ("c1", "p4")),
}


def test_procrastinate_runs_its_cells_and_says_why_for_every_other():
    for mode, expected in (("quick", QUICK), ("full", FULL)):
        plan = build(mode)
        runs = {c.name for c in plan if PROCRASTINATE in c.arms}
        assert runs == expected | OWN, mode
        assert runs <= RUNS | OWN
        for cell in plan:
            if PROCRASTINATE in cell.arms:
                assert PROCRASTINATE not in cell.cannot_run
                continue
            why = cell.cannot_run[PROCRASTINATE]
            assert why.startswith(("cannot run: ", "not run yet: ")), (cell.name, why)
            if cell.db != "pg":
                assert why == POSTGRES_ONLY
        by_name = {c.name: c for c in plan}
        # The other peer's own cells and this one's: each names the other as absent, with why.
        assert by_name["kill_pgq_recovery"].cannot_run[PROCRASTINATE] == "cannot run: a pgqueuer-only cell"
        recovery = by_name["kill_procrastinate_recovery"]
        assert recovery.arms == (PROCRASTINATE,)
        assert recovery.cannot_run[PGQUEUER] == "cannot run: a procrastinate-only cell"
        # Past the 30 s heartbeat timeout plus a minute of cron, with the kill cell's own settings.
        assert recovery.params["stall"] >= 90 and recovery.params["cap"] >= 180
        assert recovery.params["worker_env"]["BENCH_PROCRASTINATE_RETRY_CRON"] == RECOVERY_CRON
        assert recovery.params["worker_env"]["BENCH_CONN_MAX_AGE"] == 600
        assert "BENCH_PROCRASTINATE_RETRY_CRON" not in by_name["kill"].params["worker_env"]
        # The Django arms' cells and pgqueuer's are as before: procrastinate joins, nobody leaves.
        assert by_name["drain_c1"].arms[:5] == ("ox", "django-tasks-db", "django-ox", PGQUEUER, PROCRASTINATE)
        assert PROCRASTINATE in by_name["bulk_enqueue"].arms
        # drain_defaults is pgqueuer's own cell; procrastinate joins it at its own defaults.
        assert by_name["drain_defaults"].arms[:3] == ("ox", PGQUEUER, PROCRASTINATE)
    full = {c.name: c for c in build("full")}
    # The three drain_p4 cells are one measurement for procrastinate: run once, the other two say so.
    assert PROCRASTINATE in full["drain_p4_conn600"].arms
    for name in ("drain_p4_conn0", "drain_p4_pool"):
        assert full[name].cannot_run[PROCRASTINATE] == REASONS["drain_p4"]
        assert REASONS["drain_p4"].startswith("cannot run: ") and "drain_p4_conn600" in REASONS["drain_p4"]
    # Nothing left "not run yet"; the SQLite backlog cells are PostgreSQL-only.
    pending = {n for n, c in full.items() if c.cannot_run.get(PROCRASTINATE, "").startswith("not run yet")}
    assert pending == set()
    assert full["sqlite_backlog_1m_c1"].cannot_run[PROCRASTINATE] == POSTGRES_ONLY


def fake_harness(tmp_path, cells, arms):
    args = argparse.Namespace(
        quick=True, arms=arms, pg_url="postgres://nobody@127.0.0.1:1", cells=cells, out=str(tmp_path / "r.json")
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
    return harness


def test_the_worker_without_concurrency_is_procrastinates_default():
    # drain_defaults: the arm passes no --concurrency and the worker passes none on.
    from bench.procrastinate_worker import run

    seen = {}

    class Opened:
        async def run_worker_async(self, **options):
            seen.update(options)

    class App:
        def open_async(self):
            class Ctx:
                async def __aenter__(self):
                    return Opened()

                async def __aexit__(self, *exc):
                    return False

            return Ctx()

    import asyncio

    from tests.helpers import in_fresh_thread

    in_fresh_thread(lambda: asyncio.run(run(App(), None)))
    assert seen == {"queues": ["default"]}
    in_fresh_thread(lambda: asyncio.run(run(App(), 3)))
    assert seen == {"queues": ["default"], "concurrency": 3}


def test_harness_records_and_prints_why_a_cell_did_not_run(tmp_path, monkeypatch, capsys):
    harness = fake_harness(
        tmp_path, "drain_c1,drain_defaults,mariadb_drain_c1,kill,kill_procrastinate_recovery", "ox,procrastinate"
    )
    speed = {"ox": 5400.0, PROCRASTINATE: 1800.0}
    ran = []

    def agent(arm, job, params, db, timeout, label):
        ran.append(label)
        if job == "kill":
            return {"ok": True, "result": {"finished": 199, "stuck": 1, "run_twice": 0, "info": {}}}
        return {"ok": True, "result": {"throughput": speed[arm], "info": {}}}

    monkeypatch.setattr(harness, "agent", agent)
    for index, cell in enumerate(harness.plan):
        harness.run_cell(index, cell)
    doc = harness.doc
    assert report.validate(doc) == []
    assert sorted(ran) == sorted(
        [
            "drain_c1-0-ox",
            "drain_c1-0-procrastinate",
            "drain_defaults-0-ox",
            "drain_defaults-0-procrastinate",
            "mariadb_drain_c1-0-ox",
            "kill-0-ox",
            "kill-0-procrastinate",
            "kill_procrastinate_recovery-0-procrastinate",
        ]
    )
    by = {(c["name"], c["metric"]): c for c in doc["cells"]}
    drain = by[("drain_c1", "throughput")]
    assert drain["ratios"] == {PROCRASTINATE: 3.0} and "cannot_run" not in drain
    assert by[("kill", "stuck")]["arms"][PROCRASTINATE]["value"] == 1
    defaults = by[("drain_defaults", "throughput")]
    assert set(defaults["arms"]) == {"ox", PROCRASTINATE} and PROCRASTINATE not in defaults.get("cannot_run", {})
    assert by[("mariadb_drain_c1", "throughput")]["cannot_run"] == {PROCRASTINATE: POSTGRES_ONLY}
    assert set(by[("kill_procrastinate_recovery", "finished")]["arms"]) == {PROCRASTINATE}

    printed = capsys.readouterr().out
    assert f"{PROCRASTINATE}: {POSTGRES_ONLY}" in printed
    notes = report.notes(doc)
    assert f"{PROCRASTINATE} {POSTGRES_ONLY} [mariadb_drain_c1]" in notes
    assert not any(n.startswith(f"{PROCRASTINATE} not run yet: ") for n in notes)


def test_a_cell_no_selected_arm_runs_still_says_why(tmp_path, monkeypatch):
    harness = fake_harness(tmp_path, "mariadb_drain_c1", "procrastinate")
    monkeypatch.setattr(harness, "agent", lambda *a: (_ for _ in ()).throw(AssertionError("no agent")))
    harness.run_cell(0, harness.plan[0])
    assert report.validate(harness.doc) == []
    cells = harness.doc["cells"]
    assert cells and all(c["arms"] == {} and c["cannot_run"] == {PROCRASTINATE: POSTGRES_ONLY} for c in cells)


def test_worker_id_file_sits_next_to_the_count_file(tmp_path):
    # bench.fleet gives every worker BENCH_SQL_COUNT_FILE = <log dir>/<ident>.sql.json; the arm
    # finds the worker's procrastinate id from its ident and the run's log dir alone.
    path = id_file(tmp_path / "bench-abc.sql.json", "bench-abc")
    assert path == tmp_path / "bench-abc.procrastinate.json"
    path.write_text(json.dumps({"worker_id": 7, "pid": 1}))
    assert json.loads(path.read_text())["worker_id"] == 7


def test_call_arguments_become_task_keywords():
    # The arm imports Django; its pure helper needs no settings beyond what the test run has.
    pytest.importorskip("django")
    from bench.arms.procrastinate import as_kwargs

    assert as_kwargs("noop", (), {}) == {}
    assert as_kwargs("ledger", (3,), {"sleep_ms": 10}) == {"key": 3, "sleep_ms": 10}
    assert as_kwargs("stamp", (5,), {}) == {"key": 5}
    with pytest.raises(TypeError):
        as_kwargs("noop", (1,), {})


def test_every_workload_has_its_task_and_concurrency_zero_is_no_flag():
    pytest.importorskip("django")
    from bench.arms.procrastinate import ARM, PARAMS
    from bench.plan import WORKLOADS

    # The drain job enqueues bench.tasks.WORKLOADS[task] through the arm: each needs its procrastinate task.
    assert set(WORKLOADS) <= set(PARAMS)
    assert all(PARAMS[w] == () for w in WORKLOADS)
    assert ARM.worker_argv(4, "bench-x", None) == ["--concurrency", "4", "--ident", "bench-x"]
    assert ARM.worker_argv(0, "bench-x", None) == ["--ident", "bench-x"]  # procrastinate's own default
    assert {"enqueue_atomic", "bulk"} <= set(ARM.job_overrides)  # the shared ones use Django Tasks / a model
