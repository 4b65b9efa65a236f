"""Smoke tests for the benchmark harness's pure parts: statistics, ratios, the printed table,
the plan and the results schema. Nothing here starts a worker or touches a database."""

import argparse
import os

import pytest

from bench import procs, report
from bench.harness import Harness
from bench.plan import build

JOBS = {"enqueue_seq", "enqueue_atomic", "bulk", "drain", "dispatch", "kill"}


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


def fake_harness(tmp_path, cells):
    args = argparse.Namespace(
        quick=True, arms="", pg_url="postgres://nobody@127.0.0.1:1", cells=cells, out=str(tmp_path / "r.json")
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
