"""Smoke tests for the benchmark harness's pure parts: statistics, ratios, the printed table,
the plan and the results schema, the scaling series (backlog, processes, NOTIFY), and the
database-side figures' arithmetic. Nothing here starts a worker; one test writes a small
backlog with the fast fill into the test database."""

import argparse
import os

import pytest

from bench import pgstats, procs, report, scale
from bench.harness import Harness
from bench.plan import build

JOBS = {"enqueue_seq", "enqueue_atomic", "bulk", "drain", "dispatch", "kill", "backlog", "notify", "producers"}


def test_summarize_statistics():
    samples = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert report.summarize(samples, "median") == 3.0
    assert report.summarize(samples, "sum") == 15.0
    assert report.summarize(samples, "max") == 5.0
    assert report.summarize(samples, "p50") == 3.0
    assert report.summarize(samples, "p95") == pytest.approx(4.8)
    assert report.summarize([], "median") is None
    assert report.summarize([None, 2.0], "median") == 2.0
    with pytest.raises(ValueError):
        report.summarize(samples, "mode")


def test_ratio_and_direction():
    assert report.ratio(200.0, 100.0) == 2.0
    assert report.ratio(None, 1.0) is None
    assert report.ratio(1.0, 0) is None
    assert report.ox_wins(2.0, higher_is_better=True) is True
    assert report.ox_wins(2.0, higher_is_better=False) is False
    assert report.ox_wins(None, higher_is_better=True) is None


def test_plan_is_consistent():
    quick, full = build("quick"), build("full")
    for plan in (quick, full):
        names = [c.name for c in plan]
        assert len(names) == len(set(names))
        assert {c.job for c in plan} <= JOBS
        assert all(c.metrics and c.reps >= 1 for c in plan)
    assert {c.name for c in quick} <= {c.name for c in full}
    assert len(quick) < len(full)
    full_by_name = {c.name: c for c in full}
    assert full_by_name["bulk_enqueue"].params["n"] == 10_000
    assert full_by_name["dispatch"].params["n"] >= 200
    assert full_by_name["kill"].params["n"] == 2000


def fake_harness(tmp_path, cells, arms="ox,django-tasks-db,django-ox"):
    # The Django arms by default: pgqueuer's place in the matrix is tested in test_bench_pgqueuer.
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


def test_cell_aggregation_matches_schema_and_prints(tmp_path, monkeypatch):
    harness = fake_harness(tmp_path, "drain_c1,kill")
    speed = {"ox": 300.0, "django-tasks-db": 100.0, "django-ox": 150.0}

    def agent(arm, job, params, db, timeout, label):
        if job == "kill":
            if arm == "django-ox":
                return {"ok": False, "error": "Traceback ...\nRuntimeError: boom"}
            return {"ok": True, "result": {"finished": 10, "stuck": 0, "rescue_s": [1.0, 2.0, 3.0]}}
        info = {"notes": ["DNF: 1 of 2"]} if arm == "django-tasks-db" else {}
        return {"ok": True, "result": {"throughput": speed[arm], "cpu_ms_per_task": 1.0, "info": info}}

    monkeypatch.setattr(harness, "agent", agent)
    for index, cell in enumerate(harness.plan):
        harness.run_cell(index, cell)
    doc = harness.doc
    assert report.validate(doc) == []
    by = {(c["name"], c["metric"]): c for c in doc["cells"]}
    throughput = by[("drain_c1", "throughput")]
    assert throughput["arms"]["ox"] == {"samples": [300.0], "value": 300.0}
    assert throughput["ratios"] == {"django-tasks-db": 3.0, "django-ox": 2.0}
    assert by[("drain_c1", "peak_rss")]["arms"]["ox"]["value"] is None
    assert by[("kill", "rescue_p50")]["arms"]["ox"]["value"] == 2.0
    assert by[("kill", "finished")]["arms"]["django-ox"]["samples"] == []
    assert len(doc["runs"]) == 6

    text = report.table(doc)
    assert "ox/django-tasks-db" in text
    assert "3.00x+" in text and "2.00x+" in text
    notes = report.notes(doc)
    assert any("ERROR RuntimeError: boom" in n for n in notes)
    assert any("DNF" in n for n in notes)


def test_validate_reports_problems():
    problems = report.validate({"schema": 2, "mode": "slow", "cells": [{"name": "x", "arms": {"ox": {}}}]})
    assert any("schema is 2" in p for p in problems)
    assert any("mode" in p for p in problems)
    assert any("samples is not a list" in p for p in problems)


def test_proc_readings_of_this_process():
    cpu, hwm = procs._stat(os.getpid())[1], procs._hwm_kb(os.getpid())
    assert cpu > 0 and hwm > 0
    assert procs._stat(2**22 + 12345) is None


# ---------------------------------------------------------------- issue #10: scaling cells
def by_name(mode):
    return {c.name: c for c in build(mode)}


def test_backlog_cells_plan():
    quick, full = by_name("quick"), by_name("full")
    assert {n for n in quick if "backlog" in n} == {"backlog_10k_c1", "backlog_100k_c1"}
    expected_full = {f"backlog_{s}_{k}" for s in ("10k", "100k", "1m") for k in ("c1", "p4")}
    expected_full |= {"sqlite_backlog_10k_c1", "sqlite_backlog_1m_c1"}
    assert {n for n in full if "backlog" in n} == expected_full
    sizes = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000}
    for plan in (quick, full):
        for name, cell in plan.items():
            if "backlog" not in name:
                continue
            size, shape = name.split("_")[-2:]
            p = cell.params
            assert cell.job == "backlog" and p["total"] == sizes[size]
            assert p["n"] <= p["total"] and p["cap"] > 0 and p["concurrency"] == 1
            assert p["processes"] == {"c1": 1, "p4": 4}[shape]
            assert p["worker_env"]["BENCH_CONN_MAX_AGE"] == 600
            assert cell.db == ("sqlite" if name.startswith("sqlite_") else "pg")
            # The Django arms run every backlog cell; the peers that join one say so in their own tests.
            assert {"ox", "django-tasks-db", "django-ox"} <= set(cell.arms)
            assert cell.series == (f"{'sqlite_' if cell.db == 'sqlite' else ''}backlog_{shape}", "backlog", p["total"])
    # Full: the same 10,000 tasks measured at every backlog size.
    assert {c.params["n"] for n, c in full.items() if "backlog" in n} == {10_000}


def test_processes_and_notify_cells_plan():
    quick, full = by_name("quick"), by_name("full")
    for plan, counts, producers in ((quick, (1, 2, 4), (1, 4)), (full, (1, 2, 4, 8, 16), (1, 4, 16))):
        procs_cells = [plan[f"procs_p{k}"] for k in counts]
        assert len([n for n in plan if n.startswith("procs_")]) == len(counts)
        for k, cell in zip(counts, procs_cells, strict=True):
            assert cell.arms == ("ox",) and cell.params["processes"] == k and cell.params["db_stats"] is True
            assert cell.params["total"] >= cell.params["n"] >= 30_000
            assert cell.series == ("procs", "processes", k)
            assert {m.name for m in cell.metrics} >= {
                "throughput",
                "xact_per_task",
                "wal_bytes_per_task",
                "lock_wait_share",
                "pg_cpu_per_task",
            }
        plain = [n for n in plan if n.startswith("notify_") and "nolisten" not in n and "always" not in n]
        assert len(plain) == len(producers)
        always = (4,) if plan is quick else producers
        for k in always:  # the same cell with every enqueue notifying (ox.notify = always)
            cell = plan[f"notify_p{k}_always"]
            assert cell.params["notify_mode"] == "always" and cell.series == ("notify_always", "producers", k)
        for k in producers:
            cell = plan[f"notify_p{k}"]
            assert cell.job == "notify" and cell.arms == ("ox",) and cell.params["producers"] == k
            assert cell.params["rounds"] % 4 == 0  # off/on/on/off blocks
            assert "bench_idle" in cell.params["worker_env"]["BENCH_QUEUES"].split(",")
            assert {m.name for m in cell.metrics} >= {"throughput_notify_on", "throughput_notify_off", "notify_on_off"}

    assert full["notify_p4_nolisten"].params["idle_worker"] is False
    assert full["notify_p4_nolisten"].series is None and "notify_p4_nolisten" not in quick


def test_round_pattern_is_balanced_and_on_off_ratio():
    pattern = scale.round_pattern(8)
    assert pattern[:4] == ["off", "on", "on", "off"]
    assert pattern.count("on") == pattern.count("off") == 4
    assert scale.on_off({"on": [100.0, 300.0, 200.0], "off": [400.0]}) == 0.5
    assert scale.on_off({"on": [1.0], "off": []}) is None


def series_doc():
    def cell(name, series, x, metric, values):
        return {
            "name": name,
            "metric": metric,
            "unit": "tasks/s",
            "higher_is_better": True,
            "stat": "median",
            "db": "pg",
            "about": "",
            "series": {"name": series, "axis": "backlog", "x": x},
            "arms": {a: {"samples": [v], "value": v} for a, v in values.items()},
            "ratios": {},
        }

    cells = [
        cell("backlog_1m_c1", "backlog_c1", 1_000_000, "throughput", {"ox": 250.0, "django-ox": 90.0}),
        cell("backlog_10k_c1", "backlog_c1", 10_000, "throughput", {"ox": 1000.0, "django-ox": 100.0}),
        cell("backlog_100k_c1", "backlog_c1", 100_000, "throughput", {"ox": 500.0, "django-ox": None}),
        cell("backlog_10k_c1", "backlog_c1", 10_000, "peak_rss", {"ox": 50.0}),
    ]
    return {"arms": ["ox", "django-tasks-db", "django-ox"], "cells": cells}


def test_series_ratios_to_the_smallest_backlog():
    doc = series_doc()
    groups = report.series(doc)
    assert list(groups) == [("backlog_c1", "throughput")]  # peak_rss stays in the main table
    cells = groups[("backlog_c1", "throughput")]
    assert [c["series"]["x"] for c in cells] == [10_000, 100_000, 1_000_000]
    assert report.scaled(cells, "ox") == [1.0, 0.5, 0.25]
    assert report.scaled(cells, "django-ox") == [1.0, None, pytest.approx(0.9)]
    [block] = report.series_tables(doc)
    lines = block.splitlines()
    assert lines[0].startswith("backlog_c1: throughput")
    assert "django-tasks-db" not in block  # an arm that ran none of the series gets no column
    row_1m = next(line for line in lines if line.startswith("1,000,000"))
    assert row_1m.split()[-2:] == ["0.25x", "0.90x"]
    assert next(line for line in lines if line.startswith("100,000")).split()[-1] == "-"


def test_scaling_cells_aggregate_with_series(tmp_path, monkeypatch):
    harness = fake_harness(tmp_path, "backlog_10k_c1,backlog_100k_c1,notify_p1")
    rate = {"backlog_10k_c1": 400.0, "backlog_100k_c1": 300.0}

    def agent(arm, job, params, db, timeout, label):
        if job == "notify":
            assert arm == "ox"
            return {
                "ok": True,
                "result": {
                    "throughput_on": [80.0, 60.0],
                    "throughput_off": [100.0],
                    "on_off_ratio": 0.7,
                    "listeners": [1, 1],
                },
            }
        cell = label.split("-")[0]
        return {"ok": True, "result": {"throughput": rate[cell] * (2 if arm == "ox" else 1), "info": {}}}

    monkeypatch.setattr(harness, "agent", agent)
    for index, cell in enumerate(harness.plan):
        harness.run_cell(index, cell)
    doc = harness.doc
    assert report.validate(doc) == []
    by = {(c["name"], c["metric"]): c for c in doc["cells"]}
    assert by[("backlog_100k_c1", "throughput")]["series"] == {"name": "backlog_c1", "axis": "backlog", "x": 100_000}
    notify = by[("notify_p1", "throughput_notify_on")]
    assert set(notify["arms"]) == {"ox"} and notify["arms"]["ox"]["value"] == 70.0
    assert by[("notify_p1", "listening_workers")]["arms"]["ox"]["value"] == 1
    assert len([r for r in doc["runs"] if r["cell"] == "notify_p1"]) == 1
    tables = "\n".join(report.series_tables(doc))
    assert "backlog_c1: throughput" in tables and "0.75x" in tables
    assert "notify: notify_on_off" in tables
    doc["cells"][0]["series"] = {"name": "x"}
    assert any("'series'" in p for p in report.validate(doc))


def test_pgstats_arithmetic():
    assert pgstats.server_url("postgres://u@127.0.0.1:5432/oxbench_ox") == "postgres://u@127.0.0.1:5432/postgres"
    assert pgstats.state_of("active", None, None) == "cpu"
    assert pgstats.state_of("active", "Lock", "tuple") == "Lock:tuple"
    assert pgstats.state_of("idle", "Client", "ClientRead") == "idle"
    waits = pgstats.tally([["cpu", "Lock:tuple", "idle"], ["LWLock:WALWrite", "IO:WALSync", "idle"]])
    assert waits["samples"] == 2 and waits["mean_backends"] == 3.0 and waits["mean_active"] == 2.0
    assert waits["lock_wait_share"] == 0.5 and waits["io_wait_share"] == 0.25
    assert pgstats.tally([])["lock_wait_share"] is None
    counters = pgstats.delta({"xact_commit": 10.0, "wal_bytes": 100.0}, {"xact_commit": 30.0, "wal_bytes": 500.0})
    assert pgstats.per_task(counters, 10) == {"xact_commit_per_task": 2.0, "wal_bytes_per_task": 40.0}
    assert pgstats.per_task(counters, 0) == {}


@pytest.mark.django_db(transaction=True)
def test_fast_fill_writes_distinct_ready_rows():
    """The backlog fill (one template row, copied by INSERT ... SELECT) on the test database."""
    from django.db import transaction

    from bench.arms.ox import OxArm
    from ox.models import Task

    arm = OxArm()
    with transaction.atomic():
        arm.fill_fast(scale.noop, 1500)
    rows = list(Task.objects.values_list("id", "status", "task_path"))
    assert len(rows) == 1500 and len({r[0] for r in rows}) == 1500
    assert {(r[1], r[2]) for r in rows} == {("READY", "bench.tasks.noop")}
    with pytest.raises(RuntimeError, match="empty table"):
        arm.fill_fast(scale.noop, 10)


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its entry waits for its parent


def test_kill_and_stop_take_descendants_forked_after_the_last_look(tmp_path):
    # A supervisor that forks its workers (dj-queue): killed alone, its children lived on as
    # orphans holding database connections. spawn() gives each process a group of its own,
    # and kill() and stop() end the whole group.
    import sys
    import time

    script = (
        "import os, sys, time\n"
        "for _ in range(2):\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60); sys.exit(0)\n"
        "time.sleep(60)\n"
    )
    for end in (procs.kill, lambda p: procs.stop([p], grace=0.5)):
        proc = procs.spawn([sys.executable, "-c", script], dict(os.environ), tmp_path / "log", "fork", tmp_path)
        deadline = time.monotonic() + 10
        children: list[int] = []
        while len(children) < 2 and time.monotonic() < deadline:
            found = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
            children = [int(c) for c in found]
            time.sleep(0.05)
        assert len(children) == 2
        assert not proc.children  # never sampled: only the process group finds them
        end(proc)
        deadline = time.monotonic() + 10
        while any(_alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(c) for c in children)
        assert not proc.alive()
