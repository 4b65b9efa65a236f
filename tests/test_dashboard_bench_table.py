"""The benchmarks page's table (issue #14): which run it leads with, a column per arm the file
names, ox's ratios, each cell's settings and spread, why a figure is missing; the chart sections
and the metric picker; a broken file or an unknown arm never a 500; a page view reads no file it
read before and runs no query per file. Results files are written to a temp dir per test."""

import json
import re
from pathlib import Path

import pytest
from django.urls import reverse

from bench import report
from dashboard import bench
from tests.test_dashboard_support import staff_fixture  # noqa: F401

URL = reverse("dashboard:benchmarks")


def cell(name, metric="throughput", arms=None, unit="tasks/s", hib=True, **extra):
    arms = {"ox": 300.0, "django-tasks-db": 100.0} if arms is None else arms
    entries = {a: {"value": v, "samples": [] if v is None else [v * 0.9, v, v * 1.1]} for a, v in arms.items()}
    return {"name": name, "metric": metric, "unit": unit, "higher_is_better": hib, "stat": "median", "db": "pg"} | {
        "arms": entries,
        **extra,
    }


def run_doc(day, *, mode="full", argv=(), arms=("ox", "django-tasks-db"), cells=None, sha=None, **extra):
    return {
        "schema": 1,
        "started_at": f"2026-11-{day:02d}T10:00:00+00:00",
        "finished_at": f"2026-11-{day:02d}T11:00:00+00:00",
        "git_sha": sha or f"{day:02d}" + "abcdef0123456789",
        "mode": mode,
        "arms": list(arms),
        "options": {"argv": list(argv), "plan": extra.pop("plan", [])},
        "cells": cells if cells is not None else [cell("drain_c1")],
        "runs": extra.pop("runs", []),
        **extra,
    }


def write(directory: Path, name: str, data) -> Path:
    path = directory / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.fixture
def results(settings, tmp_path):
    settings.OX_BENCH_RESULTS_DIR = tmp_path
    return tmp_path


def page(client, **params) -> str:
    response = client.get(URL, params)
    assert response.status_code == 200
    return response.content.decode()


def source(body: str) -> str:
    return re.search(r'id="bench-source">(.*?)</p>', body, re.S).group(1)


@pytest.mark.django_db
def test_leads_with_the_newest_full_run_of_the_whole_matrix(client, staff, results):
    write(results, "20261101T100000Z-full.json", run_doc(1))
    write(results, "20261103T100000Z-full.json", run_doc(3, sha="0123456789whole"))
    write(results, "20261105T100000Z-full.json", run_doc(5, argv=["--cells", "drain_c1"], sha="subset5"))
    write(results, "20261106T100000Z-quick.json", run_doc(6, mode="quick", argv=["--quick"], sha="quick6"))
    body = page(client)
    lead = source(body)
    assert "20261103T100000Z-full.json" in lead and "0123456789<" in lead and "2026-11-03 10:00" in lead
    assert "newest full run of the whole matrix; 2 newer runs" in body
    # The table first: before the metric picker and every chart.
    assert body.index('id="bench-table"') < body.index('id="bench-charts-head"') < body.index("<canvas")


@pytest.mark.django_db
def test_falls_back_to_the_newest_full_run_then_the_newest_run(client, staff, results):
    write(results, "a-full.json", run_doc(1, argv=["--cells", "drain_c1"], sha="subset1"))
    write(results, "b-quick.json", run_doc(2, mode="quick", sha="quick2"))
    body = page(client)
    assert "a-full.json" in source(body) and "No full run of the whole matrix: the newest full-size run" in body
    (results / "a-full.json").unlink()
    body = page(client)
    assert "b-quick.json" in source(body) and "No full run: the newest run" in body


@pytest.mark.django_db
def test_a_column_per_arm_the_file_names_with_ox_ratios(client, staff, results):
    # celery-next is in no list of this code; nightly only under a cell's arms.
    cells = [cell("drain_c1", arms={"ox": 300.0, "celery-next": 150.0, "nightly": 600.0})]
    write(results, "a-full.json", run_doc(1, arms=("ox", "celery-next"), cells=cells))
    body = page(client)
    heads = re.findall(r'<th scope="col" class="num" data-(?:arm|ratio)="([^"]+)">([^<]+)</th>', body)
    assert heads == [
        ("ox", "ox"),
        ("celery-next", "celery-next"),
        ("nightly", "nightly"),
        ("celery-next", "ox / celery-next"),
        ("nightly", "ox / nightly"),
    ]
    row = re.search(r'<tr data-metric="throughput">(.*?)</tr>', body, re.S).group(1)
    assert re.search(r'data-ratio="celery-next">2.00× <span class="verdict">better', row)
    assert re.search(r'data-ratio="nightly">0.50× <span class="verdict">worse', row)
    # The printed report has the same columns and ratios.
    text = report.table(json.loads((results / "a-full.json").read_text()))
    assert "ox/celery-next" in text and "ox/nightly" in text and "2.00x+" in text and "0.50x-" in text


@pytest.mark.django_db
def test_settings_and_spread_of_each_cell(client, staff, results):
    plan = [
        {
            "name": "backlog_1m_p4",
            "reps": 2,
            "params": {"n": 10000, "total": 1000000, "processes": 4, "concurrency": 1, "cap": 240.0}
            | {"worker_env": {"BENCH_CONN_MAX_AGE": 0}},
        },
        {"name": "drain_p4_pool", "params": {"processes": 4, "worker_env": {"BENCH_POOL": 1}}},
    ]
    cells = [cell("backlog_1m_p4", arms={"ox": 100.0, "django-tasks-db": 50.0}), cell("drain_p4_pool")]
    write(results, "a-full.json", run_doc(1, cells=cells, plan=plan))
    body = page(client)
    backlog = re.search(r'<tbody data-cell="backlog_1m_p4">(.*?)</tbody>', body, re.S).group(1)
    settings_text = re.sub(r"<[^>]+>", "", re.search(r'class="bench-settings">(.*?)</td>', backlog).group(1))
    assert settings_text == (
        "processes 4concurrency 1tasks 10,000backlog 1,000,000connections CONN_MAX_AGE=0repetitions 2"
    )
    assert "cap" not in settings_text  # plumbing, not a setting
    assert re.search(
        r'data-arm="ox">100<span class="spread" title="lowest–highest of 3 samples">90.0–110 \(3\)', backlog
    )
    pool = re.search(r'<tbody data-cell="drain_p4_pool">(.*?)</tbody>', body, re.S).group(1)
    assert "connections</span> pool" in pool


@pytest.mark.django_db
def test_a_missing_figure_says_why(client, staff, results):
    cells = [
        cell("kill", "rescue_p50", {"ox": 1.5, "django-ox": None}, "s", False)
        | {"cannot_run": {"django-tasks-db": "cannot run: never rescues <b>dead</b> workers"}},
        cell("procs_p1", arms={"ox": 900.0}),
    ]
    runs = [{"cell": "kill", "rep": 0, "arm": "django-ox", "ok": False, "error": "Traceback\nRuntimeError: boom"}]
    write(results, "a-full.json", run_doc(1, arms=("ox", "django-tasks-db", "django-ox"), cells=cells, runs=runs))
    body = page(client)
    kill = re.search(r'<tbody data-cell="kill">(.*?)</tbody>', body, re.S).group(1)
    # Escaped like everything else the file says.
    assert 'title="cannot run: never rescues &lt;b&gt;dead&lt;/b&gt; workers">–<span class="why">cannot run<' in kill
    assert 'title="error: RuntimeError: boom">–<span class="why">error<' in kill
    assert "<b>dead</b>" not in body
    procs = re.search(r'<tbody data-cell="procs_p1">(.*?)</tbody>', body, re.S).group(1)
    assert 'title="not run in this cell">–<span class="why">not run in this cell<' in procs
    assert "ERROR RuntimeError: boom" in body  # the run's notes under the table


@pytest.mark.django_db
def test_broken_and_odd_files_are_a_clear_message_never_a_500(client, staff, results):
    write(results, "20261101T100000Z-full.json", run_doc(1, sha="goodrun"))
    write(results, "broken.json", "{not json")
    write(results, "list.json", [1, 2])
    odd = {
        "mode": "full",
        "arms": "ox",
        "options": "argv",
        "runs": ["junk", {"cell": 3, "ok": False, "error": None, "result": {"info": "x"}}],
        "cells": [
            {"name": "weird", "arms": {"ox": "fast", "x": {"value": True, "samples": "many"}}, "cannot_run": [1]},
            "junk",
            {"name": "nan", "metric": "throughput", "arms": {"ox": {"value": float("nan"), "samples": [None, "a", 1]}}},
            {"name": "inf", "metric": "throughput", "arms": {"ox": {"value": float("inf")}}},
        ],
    }
    write(results, "odd.json", json.dumps(odd))  # NaN: Python's json writes and reads it
    body = page(client)
    alert = re.search(r'<section class="card bench-unreadable" role="alert">(.*?)</section>', body, re.S).group(1)
    assert "2 results files not shown" in alert and "broken.json" in alert and "unreadable" in alert
    assert "list.json" in alert and "not a JSON object" in alert
    assert "goodrun" in source(body)  # the good run still leads
    # The charts' JSON stays JSON (the browser's JSON.parse refuses NaN and Infinity).
    charts = re.findall(r'<script id="bench-chart-\d+-data" type="application/json">(.*?)</script>', body)
    assert len(charts) == 3 and not any("NaN" in c or "Infinity" in c for c in charts)
    body = page(client, run="odd.json")  # the odd one, picked: a table of what could be read
    assert "odd.json" in source(body) and '<tbody data-cell="weird">' in body
    # Picks that name nothing usable: the defaults, not an error.
    odd_picks = page(client, run="broken.json", metric="<script>")
    assert source(odd_picks) == source(page(client)) and '<option value="throughput" selected>' in odd_picks


@pytest.mark.django_db
def test_metric_picker_and_chart_sections(client, staff, results):
    cells = [
        cell("enqueue_seq"),
        cell("drain_c1"),
        cell("drain_c1", "cpu_per_task", unit="ms", hib=False),
        cell("kill", "stuck", unit="tasks", hib=False),
        cell("mariadb_drain_c1") | {"db": "mariadb"},
        cell("brand_new_cell"),
    ]
    for day in (1, 2):
        write(results, f"{day}-full.json", run_doc(day, cells=cells))
    body = page(client)
    assert re.findall(r'<option value="([^"]+)" selected>', body)[-1] == "throughput"
    groups = re.findall(r'<details class="card bench-group" id="([^"]+)" data-family="([^"]+)"( open)?>', body)
    assert groups == [
        ("bench-group-enqueue", "Enqueue", " open"),
        ("bench-group-drain", "Drain", ""),
        ("bench-group-mariadb", "MariaDB", ""),
        ("bench-group-other", "Other", ""),
    ]
    assert body.count("<canvas") == 4
    body = page(client, metric="cpu_per_task")
    assert body.count("<canvas") == 1 and "drain_c1 — cpu_per_task (pg)" in body
    assert re.findall(r'data-family="([^"]+)"', body) == ["Drain"]
    # htmx (a picker changed): the content alone; Back (a history restore): the whole page.
    partial = client.get(URL, {"metric": "stuck"}, headers={"HX-Request": "true"}).content.decode()
    assert partial.startswith('\n<form id="bench-content"') or partial.lstrip().startswith('<form id="bench-content"')
    assert "<html" not in partial and "kill — stuck (pg)" in partial
    restore = {"HX-Request": "true", "HX-History-Restore-Request": "true"}
    whole = client.get(URL, {"metric": "stuck"}, headers=restore).content.decode()
    assert "<html" in whole and "kill — stuck (pg)" in whole


def test_families_of_the_plan_cells():
    names = {
        "enqueue_seq": "Enqueue",
        "bulk_enqueue": "Enqueue",
        "unique_enqueue": "Flow control",
        "limit_global_io": "Flow control",
        "drain_p4_pool": "Drain",
        "drain_defaults": "Drain",
        "kill_procrastinate_recovery": "Kill / crash",
        "dispatch": "Dispatch",
        "io_bound_async_c4": "Workloads",
        "backlog_1m_p4": "Backlog",
        "procs_p16": "Scaling",
        "notify_p4_nolisten": "NOTIFY",
        "workflow_chain_c4": "Workflow",
        "progress_metadata": "Workflow",
        "sqlite_limit_keys": "SQLite",
        "mariadb_kill": "MariaDB",
        "oban_only_thing": "Other",
    }
    assert {name: bench.family(name) for name in names} == names
    assert bench.family("drain_c1", "mariadb") == "MariaDB"


@pytest.mark.django_db
def test_a_page_view_reads_no_file_twice_and_runs_no_query_per_file(
    client, staff, results, monkeypatch, django_assert_max_num_queries
):
    parsed = []
    real_parse = bench.parse
    monkeypatch.setattr(bench, "parse", lambda path: parsed.append(path.name) or real_parse(path))
    write(results, "broken.json", "{not json")
    for day in range(1, 3):
        write(results, f"{day}-full.json", run_doc(day))
    page(client)
    with django_assert_max_num_queries(4) as few:  # the session, the user, their permissions
        page(client)
    assert sorted(parsed) == ["1-full.json", "2-full.json", "broken.json"]  # once each, the first view
    for day in range(3, 23):
        write(results, f"{day}-full.json", run_doc(day))
    with django_assert_max_num_queries(len(few.captured_queries)):
        page(client)
    assert len(parsed) == 23
    page(client)
    assert len(parsed) == 23  # nothing changed: nothing read
    write(results, "5-full.json", run_doc(5, sha="rewritten"))
    page(client)
    assert parsed[23:] == ["5-full.json"]


REAL = Path(__file__).resolve().parents[1] / "bench" / "results"


@pytest.mark.django_db
@pytest.mark.skipif(not any(REAL.glob("*.json")), reason="no committed bench/results")
def test_page_and_bench_run_report_show_the_same_figures(client, staff, settings, capsys):
    from bench.harness import main

    settings.OX_BENCH_RESULTS_DIR = REAL
    lead = bench.lead(bench.load_runs(REAL))
    main(["--report", str(REAL / lead.run.file)])
    printed = capsys.readouterr().out
    body = page(client)
    assert lead.run.file in source(body)
    first = lead.run.rows[0]
    line = next(x for x in printed.splitlines() if x.startswith(f"{first.cell} ") and f" {first.metric}" in x)
    figures = [report.number_text(first.arms[a].value) for a in lead.run.arms if first.arms[a].ran]
    assert all(f" {f} " in f"{line} " for f in figures), (line, figures)
    row = re.search(rf'<tbody data-cell="{first.cell}">(.*?)</tbody>', body, re.S).group(1)
    assert all(f'">{f}<span class="spread"' in row for f in figures), figures
