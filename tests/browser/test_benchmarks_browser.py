"""The benchmarks page in Chromium: the chosen run's table comes first, the chart sections open
and close, the metric picker swaps the charts in place (htmx, under the page's CSP); and the
README's screenshot of the page, taken over the committed bench/results."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from playwright.sync_api import expect

from dashboard import bench
from tests.browser.conftest import SCREENSHOTS, log_in
from tests.browser.test_csp_browser import COLLECT, violations

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

REAL_RESULTS = Path(django_settings.BASE_DIR) / "bench" / "results"


def cell(name, metric, unit, hib, arms, **extra):
    return {"name": name, "metric": metric, "unit": unit, "higher_is_better": hib, "stat": "median", "db": "pg"} | {
        "arms": {arm: {"value": v, "samples": [v * 0.9, v, v * 1.1]} for arm, v in arms.items()},
        **extra,
    }


def results(directory: Path) -> None:
    """Two runs of the whole matrix (ox, django-tasks-db and an arm this code does not know),
    a newer run of part of it, and a file that does not parse."""
    for i, (enqueue, drain) in enumerate([(900.0, 3000.0), (1200.0, 3300.0)]):
        doc = {
            "schema": 1,
            "started_at": f"2026-11-2{i}T10:00:00+00:00",
            "finished_at": f"2026-11-2{i}T10:40:00+00:00",
            "git_sha": f"{i}abcdef0123",
            "mode": "full",
            "arms": ["ox", "django-tasks-db", "oban"],
            "options": {
                "argv": [],
                "plan": [{"name": "drain_c1", "reps": 2, "params": {"processes": 1, "concurrency": 4}}],
            },
            "cells": [
                cell(
                    "enqueue_seq",
                    "throughput",
                    "tasks/s",
                    True,
                    {"ox": enqueue, "django-tasks-db": 600.0, "oban": 700.0},
                ),
                cell(
                    "drain_c1", "throughput", "tasks/s", True, {"ox": drain, "django-tasks-db": 140.0, "oban": 2000.0}
                ),
                cell("drain_c1", "cpu_per_task", "ms", False, {"ox": 0.13 + i, "django-tasks-db": 4.6, "oban": 1.0}),
                cell(
                    "kill",
                    "rescue_p50",
                    "s",
                    False,
                    {"ox": 1.5},
                    cannot_run={"django-tasks-db": "cannot run: never rescues", "oban": "not run yet: no kill job"},
                ),
            ],
        }
        (directory / f"2026112{i}T100000Z-full.json").write_text(json.dumps(doc))
    part = {
        "started_at": "2026-11-25T10:00:00+00:00",
        "finished_at": "2026-11-25T10:05:00+00:00",
        "git_sha": "feedbeef",
        "mode": "full",
        "arms": ["ox"],
        "options": {"argv": ["--cells", "drain_c1", "--arms", "ox"]},
        "cells": [cell("drain_c1", "throughput", "tasks/s", True, {"ox": 3500.0})],
    }
    (directory / "20261125T100000Z-full.json").write_text(json.dumps(part))
    (directory / "broken.json").write_text("{not json")


def test_table_first_sections_collapse_and_the_metric_picker_swaps_the_charts(page, operator, settings, tmp_path):
    settings.OX_BENCH_RESULTS_DIR = tmp_path
    results(tmp_path)
    page.context.add_init_script(COLLECT)
    log_in(page, "operator", "/benchmarks/")

    # The table leads: the newest run of the whole matrix, not the newer partial run.
    expect(page.locator("#bench-source")).to_contain_text("20261121T100000Z-full.json")
    expect(page.locator("#bench-source")).to_contain_text("1abcdef012")
    order = page.evaluate(
        "[...document.querySelectorAll('#bench-table, #bench-charts-head, canvas')].map(e => e.id || e.className)"
    )
    assert order[0] == "bench-table", order
    table_top = page.locator("#bench-table").bounding_box()["y"]
    assert all(table_top < page.locator("canvas").nth(i).bounding_box()["y"] for i in range(2))
    headers = page.locator("#bench-table thead th")
    expect(headers).to_have_text(
        ["Cell", "Settings", "Metric", "ox", "django-tasks-db", "oban", "ox / django-tasks-db", "ox / oban"]
    )
    drain = page.locator('#bench-table tbody[data-cell="drain_c1"] tr[data-metric="throughput"]')
    expect(drain.locator('[data-arm="ox"]')).to_have_text("3,3002,970–3,630 (3)")  # the figure, its spread
    expect(drain.locator('[data-ratio="django-tasks-db"]')).to_have_text("23.57× better")
    expect(drain.locator('[data-ratio="oban"]')).to_have_text("1.65× better")
    expect(page.locator('#bench-table tbody[data-cell="drain_c1"] .bench-settings')).to_contain_text("concurrency 4")
    kill = page.locator('#bench-table tbody[data-cell="kill"]')
    expect(kill.locator('[data-arm="django-tasks-db"] .missing')).to_have_attribute(
        "title", "cannot run: never rescues"
    )
    expect(kill.locator('[data-arm="oban"]')).to_have_text("–not run yet")
    expect(kill.locator('[data-ratio="oban"]')).to_have_text("–")
    expect(page.locator(".bench-unreadable")).to_contain_text("broken.json")
    expect(page.locator("#bench-runs tbody tr")).to_have_count(4)  # every file, the broken one too
    expect(page.locator("#bench-runs")).to_contain_text("unreadable")
    expect(page.locator("#bench-runs")).to_be_hidden()  # under its closed section

    # Sections: the first open with its chart drawn, the others closed until opened.
    enqueue, drains = page.locator("#bench-group-enqueue"), page.locator("#bench-group-drain")
    expect(enqueue).to_have_attribute("open", "")
    expect(enqueue.locator("canvas")).to_have_attribute("data-drawn", "true")
    expect(enqueue.locator("canvas")).to_be_visible()
    enqueue.locator("summary").click()
    expect(enqueue.locator("canvas")).to_be_hidden()
    expect(drains.locator("canvas").first).to_be_hidden()
    drains.locator("summary").click()
    expect(drains.locator("canvas").first).to_be_visible()
    assert drains.locator("canvas").first.bounding_box()["width"] > 100  # Chart.js sized it on opening
    enqueue.locator("summary").click()
    expect(enqueue.locator("canvas")).to_be_visible()
    first = page.evaluate("Chart.getChart(document.querySelector('#bench-group-drain canvas')).data.datasets[0].data")
    assert first == [3000.0, 3300.0, 3500.0]  # every run that measured it, the partial one too

    # The picker: the charts of another metric, swapped in place (no page load).
    page.evaluate("window.__noReload = true")
    page.select_option("#bench-metric", "cpu_per_task")
    expect(page).to_have_url(re.compile(r"[?&]metric=cpu_per_task"))
    canvases = page.locator("#bench-charts canvas")
    expect(canvases).to_have_count(1)
    expect(page.locator("#bench-charts h3")).to_have_text(["drain_c1 — cpu_per_task (pg)"])
    expect(page.locator("#bench-group-enqueue")).to_have_count(0)  # no cpu_per_task there
    expect(canvases.first).to_have_attribute("data-drawn", "true")
    data = page.evaluate("Chart.getChart(document.querySelector('#bench-charts canvas')).data.datasets")
    assert [d["label"] for d in data] == ["ox", "django-tasks-db", "oban"]
    assert [round(v, 2) for v in data[0]["data"]] == [0.13, 1.13]
    assert page.evaluate("window.__noReload") is True

    # The run picker: the partial run's table, the metric kept.
    page.select_option("#bench-run", "20261125T100000Z-full.json")
    expect(page.locator("#bench-source")).to_contain_text("feedbeef")
    expect(page.locator("#bench-table thead th")).to_have_text(["Cell", "Settings", "Metric", "ox"])
    expect(page.locator("#bench-metric")).to_have_value("cpu_per_task")
    assert page.evaluate("window.__noReload") is True
    assert violations(page) == []

    # Back: htmx fetches the earlier URL whole (the page keeps no snapshot) and draws it again.
    page.go_back()
    expect(page.locator("#bench-metric")).to_have_value("cpu_per_task")
    expect(page.locator("#bench-source")).to_contain_text("1abcdef012")
    expect(page.locator("nav a[aria-current=page]")).to_have_text("Benchmarks")
    expect(page.locator("#bench-charts canvas").first).to_have_attribute("data-drawn", "true")
    assert violations(page) == []


def committed_results(tmp_path: Path) -> Path:
    """bench/results as committed: a benchmark running on this machine writes its file there as
    it goes, untracked until someone commits it. Outside a git checkout, the folder as it is."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", "bench/results/*.json"],
            cwd=django_settings.BASE_DIR,
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        return REAL_RESULTS
    names = [name for name in listed.split("\0") if name]
    if not names:
        return REAL_RESULTS
    copy = tmp_path / "results"
    copy.mkdir()
    for name in names:
        shutil.copy2(Path(django_settings.BASE_DIR) / name, copy / Path(name).name)
    return copy


@pytest.mark.skipif(not REAL_RESULTS.is_dir(), reason="no bench/results in this checkout")
def test_readme_screenshot_over_the_committed_results(page, operator, settings, tmp_path, monkeypatch):
    """docs/screenshots/benchmarks.png: the page over the real runs in bench/results."""
    settings.OX_BENCH_RESULTS_DIR = committed_results(tmp_path)
    monkeypatch.setattr(bench, "results_dir_label", lambda: "bench/results")  # a copy of it, so named
    expected = bench.lead(bench.load_runs(settings.OX_BENCH_RESULTS_DIR))
    assert expected is not None
    log_in(page, "operator", "/benchmarks/")
    expect(page.locator("#bench-source")).to_contain_text(expected.run.file)
    expect(page.locator("#bench-source")).to_contain_text(expected.run.git_sha[:10])
    first_group = page.locator("#bench-charts details[open]").first
    charts = first_group.locator("canvas")
    for i in range(charts.count()):
        expect(charts.nth(i)).to_have_attribute("data-drawn", "true")
    # The first screen, as the README's other screenshots: what the page leads with (the table,
    # its source); the whole page (the chart sections under it) would be a strip several
    # screens tall in the README's two-column grid.
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "benchmarks.png"))
