"""The scaling cells every arm runs (bench.plan_scale): concurrent producers' enqueue (enqueue_p4,
enqueue_p16; the `producers` job, bench.producers), the drain over 1, 2, 4, 8 worker processes
(drain_p2, drain_p8 with drain_c1 and drain_p4_conn600), and the dispatch cells' idle RSS. Their
place in the plan for every arm, the producers job's arithmetic and its loss check, and the job for
real: ox on the test database (PostgreSQL) with two producer processes and a short window."""

import ast
import os
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from bench import procs, producers, report
from bench.arms import ARM_NAMES, ARMS
from bench.plan import build
from bench.plan_scale import DRAIN_CELLS, DRAIN_SERIES, ENQUEUE_CELLS, ENQUEUE_SERIES
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parent.parent


def test_every_arm_runs_the_new_cells_or_says_why():
    for mode in ("quick", "full"):
        plan = {c.name: c for c in build(mode)}
        new = [*ENQUEUE_CELLS, *(DRAIN_CELLS if mode == "full" else ())]
        assert set(new) <= set(plan), mode
        for name in new:
            cell = plan[name]
            for arm in ARM_NAMES:
                if arm in cell.arms:
                    assert arm not in cell.cannot_run, (name, arm)
                else:
                    assert cell.cannot_run[arm].startswith("cannot run: "), (name, arm)
            # Every arm has an enqueue and a drain at P processes: nobody is left out of these.
            assert set(cell.arms) == set(ARM_NAMES) and not cell.cannot_run, name
            assert cell.db == "pg"
    assert not {c.name for c in build("quick")} & set(DRAIN_CELLS)  # full only, as drain_p4_conn600


def test_enqueue_cells_settings():
    for mode, seconds, reps in (("quick", 1.5, 1), ("full", 4.0, 3)):
        plan = {c.name: c for c in build(mode)}
        for k in (4, 16):
            cell = plan[f"enqueue_p{k}"]
            assert cell.job == "producers" and cell.reps == reps
            assert cell.params["producers"] == k and cell.params["seconds"] == seconds
            assert cell.params["lead"] > 0 and cell.params["worker_env"]["BENCH_CONN_MAX_AGE"] == 600
            assert [m.name for m in cell.metrics] == ["throughput"]
            assert cell.series == (ENQUEUE_SERIES, "producers", k)
            # The settings are in the text a reader sees.
            for said in (f"{k} producer processes", "autocommit", f"{seconds:g} s", "warm-up", "connection", "celery"):
                assert said in cell.about, (cell.name, said)


def test_drain_cells_form_a_series_with_drain_c1_and_drain_p4():
    full = {c.name: c for c in build("full")}
    points = {"drain_c1": 1, "drain_p2": 2, "drain_p4_conn600": 4, "drain_p8": 8}
    for name, k in points.items():
        cell = full[name]
        assert cell.series == (DRAIN_SERIES, "processes", k)
        assert cell.params["processes"] == k and cell.params["concurrency"] == 1
        assert cell.params["n"] == full["drain_c1"].params["n"] == 10_000
        assert cell.params["worker_env"] == {"BENCH_CONN_MAX_AGE": 600}
        assert cell.arms == full["drain_p4_conn600"].arms
    assert full["drain_p4_conn0"].series is None and full["drain_p4_pool"].series is None
    assert {c.name: c for c in build("quick")}["drain_c1"].series is None  # a series of one: none
    # The report prints them side by side, each over 1 process.
    doc = {"arms": ["ox"], "cells": []}
    for name, k in points.items():
        entry = {"name": name, "metric": "throughput", "unit": "tasks/s", "higher_is_better": True}
        entry |= {"series": {"name": DRAIN_SERIES, "axis": "processes", "x": k}, "arms": {"ox": {"value": 100.0 * k}}}
        doc["cells"].append(entry)
    [block] = report.series_tables(doc)
    assert [line.split()[0] for line in block.splitlines()[3:]] == ["1", "2", "4", "8"]
    assert block.splitlines()[-1].split()[-1] == "8.00x"


def test_dispatch_cells_measure_idle_rss():
    for mode in ("quick", "full"):
        plan = {c.name: c for c in build(mode)}
        for name in ("dispatch", "mariadb_dispatch"):
            [metric] = [m for m in plan[name].metrics if m.name == "idle_rss"]
            assert (metric.key, metric.unit, metric.higher_is_better) == ("idle_rss_mb", "MiB", False)
    # Every dispatch job returns it: the shared one and the peers' (all through peer_jobs.dispatch_with).
    for path in ("bench/jobs.py", "bench/peer_jobs.py"):
        assert '"idle_rss_mb": idle_rss_mb' in (ROOT / path).read_text()
    for module in ("pgq_jobs", "procrastinate_jobs", "oban_jobs", "celery_jobs"):
        assert "dispatch_with(" in (ROOT / "bench" / f"{module}.py").read_text(), module


def test_rss_of_a_process_we_started(tmp_path):
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    proc = procs.spawn(argv, dict(os.environ), tmp_path / "log", "t", ROOT)
    try:
        # A Python interpreter holds more than 1 MiB once it has loaded; read at once, the
        # child may still be in its exec (CI read 204 KiB).
        wait_until(lambda: procs.rss_kb([proc]) > 1000, timeout=10)
        assert procs.rss_kb([proc]) > 1000
        assert procs._status_kb(os.getpid(), "VmRSS") > 0
    finally:
        procs.kill(proc)
    assert procs.rss_kb([proc]) == 0  # gone: nothing resident


def _source(module: str) -> ast.Module:
    return ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())


def _class_attribute(module: str, name: str) -> str | None:
    """A string attribute set in a class body of the module, read from its source: the arm
    modules build their ARM at import, which needs the peer installed (bench/.venv only)."""
    for node in ast.walk(_source(module)):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.Assign) and [getattr(t, "id", "") for t in item.targets] == [name]:
                    return ast.literal_eval(item.value) if isinstance(item.value, ast.Constant) else None
    return None


def test_every_arm_has_a_producer_hook_that_exists():
    from bench.arms.base import Arm

    for name, (_settings, module, _db) in ARMS.items():
        hook = _class_attribute(module, "producer_hook") or Arm.producer_hook
        hook_module, function = hook.split(":")
        defined = {n.name for n in _source(hook_module).body if isinstance(n, ast.FunctionDef)}
        assert function in defined, (name, hook)
        # One shared job (bench.producers); the hook is the arm's part.
        assert "bench.producers" not in (ROOT / (module.replace(".", "/") + ".py")).read_text(), name
    assert "producers" in producers.JOBS
    assert _class_attribute("bench.arms.pgqueuer", "producer_hook") == "bench.pgq_jobs:producer"
    assert _class_attribute("bench.arms.ox", "producer_hook") is None  # the Django Tasks default


class FakeCrowd:
    """bench.producers.Crowd without processes: canned reports."""

    reports = [{"count": 300, "began": 100.01, "end": 102.0, "path": "x"}, {"count": 100, "began": 100.3, "end": 101.9}]

    def __init__(self, work, env, hook):
        self.hook = hook

    def start(self, count):
        return 0.5

    def round(self, k, seconds, lead):
        return 100.0, self.reports

    def stop(self):
        pass


class FakeArm:
    name = "fake"
    producer_hook = "bench.producer:django_tasks"

    def __init__(self, rows):
        self.rows = list(rows)

    def reset(self, extra):
        pass

    def counts(self):
        return {"READY": self.rows.pop(0)}


def test_producers_job_arithmetic_and_its_loss_check(monkeypatch, tmp_path):
    monkeypatch.setattr(producers, "Crowd", FakeCrowd)
    p = {"producers": 2, "seconds": 2.0, "log_dir": str(tmp_path)}
    result = producers.producers(FakeArm([2, 402]), p)
    assert result["throughput"] == 200.0  # 400 calls over 100.0 -> 102.0
    info = result["info"]
    assert info["calls_each"] == [300, 100] and info["rows"] == 402 and info["window_s"] == 2.0
    assert info["notes"] and "300 ms" in info["notes"][0]  # the second producer began late
    with pytest.raises(RuntimeError, match="lost or counted twice"):
        producers.producers(FakeArm([2, 401]), p)
    with pytest.raises(RuntimeError, match="lost or counted twice"):
        producers.producers(FakeArm([3, 403]), p)  # a warm-up too many


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(int(entry))
    return found


@pytest.mark.django_db(transaction=True)
def test_producers_job_for_ox_on_postgresql(monkeypatch, tmp_path):
    """Two producer processes (bench.producer, ox's noop.enqueue()) for a short window on the test
    database: every counted enqueue and the warm-ups are rows of ox_task, and no producer is left."""
    if connection.vendor != "postgresql":
        pytest.skip("the enqueue_p* cells run on PostgreSQL")
    from bench import jobs
    from bench.arms.ox import OxArm
    from tests.conftest import database_url

    monkeypatch.setenv("DATABASE_URL", database_url())  # the producers' database: this test's
    with connection.cursor() as cursor:
        cursor.execute(jobs._ledger_ddl())  # the job resets it with the arm's tables
    try:
        started = time.monotonic()
        result = producers.producers(
            OxArm(), {"producers": 2, "seconds": 0.5, "lead": 0.3, "log_dir": str(tmp_path / "logs")}
        )
        assert time.monotonic() - started < 60
        info = result["info"]
        assert info["path"] == "noop.enqueue()" and len(info["calls_each"]) == 2
        assert all(n > 0 for n in info["calls_each"])
        assert info["rows"] == info["calls"] + 2 and info["window_s"] >= 0.5
        assert result["throughput"] == pytest.approx(info["calls"] / info["window_s"])
        from ox.models import Task

        assert Task.objects.filter(status="READY", task_path="bench.tasks.noop").count() == info["rows"]
        assert _processes_naming(str(tmp_path)) == []  # every producer stopped
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS bench_ledger")


def test_the_harness_runs_the_producers_cells_for_every_arm_and_prints_the_series(tmp_path, monkeypatch):
    import argparse

    from bench.harness import Harness

    args = argparse.Namespace(
        quick=True, arms="", pg_url="postgres://nobody@127.0.0.1:1", cells="enqueue_p4,enqueue_p16", out=""
    )
    harness = Harness(args)
    harness.doc = {"schema": 1, "run_id": "t", "started_at": "", "git_sha": "0" * 40, "mode": "quick"}
    harness.doc |= {"arms": harness.arms, "environment": {}, "options": {}, "cells": [], "runs": []}
    ran = []

    def agent(arm, job, params, db, timeout, label):
        ran.append((label, job))
        rate = 1000.0 * params["producers"] / 4 * (2 if arm == "ox" else 1)
        return {"ok": True, "result": {"throughput": rate, "info": {"calls_each": [1] * params["producers"]}}}

    monkeypatch.setattr(harness, "agent", agent)
    for index, cell in enumerate(harness.plan):
        harness.run_cell(index, cell)
    assert report.validate(harness.doc) == []
    assert {job for _, job in ran} == {"producers"} and len(ran) == 2 * len(ARM_NAMES)
    by = {c["name"]: c for c in harness.doc["cells"]}
    assert set(by["enqueue_p16"]["arms"]) == set(ARM_NAMES) and "cannot_run" not in by["enqueue_p16"]
    assert by["enqueue_p16"]["ratios"]["celery"] == 2.0
    [block] = report.series_tables(harness.doc)
    assert block.startswith(f"{ENQUEUE_SERIES}: throughput") and "4.00x" in block
