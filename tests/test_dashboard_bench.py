"""Reading bench/results/*.json: defensive, cached by mtime, charted per metric."""

import json
import os

import pytest
from django.urls import reverse

from dashboard import bench
from tests.test_dashboard_support import staff_fixture  # noqa: F401

CELL = {
    "name": "drain_c1",
    "metric": "throughput",
    "unit": "tasks/s",
    "higher_is_better": True,
    "db": "pg",
    "arms": {"ox": {"value": 100.0, "samples": [99.0, 100.0]}, "django-tasks-db": {"samples": [40.0, 50.0, 60.0]}},
}


def write(directory, name, data):
    path = directory / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_reads_runs_defensively(tmp_path):
    write(
        tmp_path, "a.json", {"schema": 1, "started_at": "2026-11-01T10:00:00+00:00", "git_sha": "abc", "cells": [CELL]}
    )
    write(tmp_path, "b.json", "{nope")
    write(tmp_path, "c.json", [1, 2])
    write(tmp_path, "d.json", {"cells": [{"name": "x"}, "junk", {"arms": {"ox": "fast"}}]})
    write(tmp_path, "notes.txt", "ignored")
    runs = {r.file: r for r in bench.load_runs(tmp_path)}
    assert set(runs) == {"a.json", "b.json", "c.json", "d.json"}
    assert runs["a.json"].cells[0].values == {"ox": 100.0, "django-tasks-db": 50.0}  # no value: the median
    assert runs["b.json"].error.startswith("unreadable")
    assert runs["c.json"].error == "not a JSON object"
    assert runs["d.json"].cells[0].values == {"ox": None}


def test_cache_follows_mtime(tmp_path):
    path = write(tmp_path, "a.json", {"cells": [CELL]})
    first = bench.load_runs(tmp_path)[0]
    assert bench.load_runs(tmp_path)[0] is first  # unchanged file: not parsed again
    write(tmp_path, "a.json", {"cells": [CELL, {**CELL, "name": "drain_c4"}]})
    os.utime(path, ns=(1, 1))
    assert len(bench.load_runs(tmp_path)[0].cells) == 2
    path.unlink()
    assert bench.load_runs(tmp_path) == []


def test_charts_one_per_metric_with_a_line_per_arm(tmp_path):
    for i, value in enumerate([100.0, 120.0]):
        cell = {**CELL, "arms": {"ox": {"value": value}, "django-ox": {"value": 80.0}}}
        write(tmp_path, f"{i}.json", {"started_at": f"2026-11-0{i + 1}T10:00:00+00:00", "cells": [cell]})
    write(tmp_path, "2.json", {"started_at": "2026-11-03T10:00:00+00:00", "cells": [{**CELL, "db": "sqlite"}]})
    charts = bench.charts(bench.load_runs(tmp_path))
    assert [c.title for c in charts] == ["drain_c1 — throughput (pg)", "drain_c1 — throughput (sqlite)"]
    pg = charts[0]
    assert [s["label"] for s in pg.series] == ["ox", "django-ox"]  # ours first
    assert pg.series[0]["data"] == [100.0, 120.0] and len(pg.labels) == 2


@pytest.mark.django_db
def test_missing_directory_is_an_empty_page(client, staff, settings, tmp_path):
    settings.OX_BENCH_RESULTS_DIR = tmp_path / "nowhere"
    response = client.get(reverse("dashboard:benchmarks"))
    assert response.status_code == 200 and b"No results yet" in response.content


@pytest.mark.django_db
def test_page_lists_runs_and_chart_data(client, staff, settings, tmp_path):
    settings.OX_BENCH_RESULTS_DIR = tmp_path
    env = {"cores": 2, "postgresql": {"version": "16", "settings": {"fsync": "on"}}}
    write(tmp_path, "a.json", {"git_sha": "0123456789abc", "git_dirty": ["x"], "environment": env, "cells": [CELL]})
    body = client.get(reverse("dashboard:benchmarks")).content.decode()
    assert 'id="bench-chart-0"' in body and 'id="bench-chart-0-data"' in body
    assert "0123456789" in body and "dirty" in body and "version 16" in body


@pytest.mark.django_db
def test_page_names_the_results_folder_relative_to_the_project(client, staff, settings, tmp_path):
    # Issue #16: the page showed the server's absolute path (its layout, its user names).
    from pathlib import Path

    settings.OX_BENCH_RESULTS_DIR = Path(settings.BASE_DIR) / "bench" / "results"
    body = client.get(reverse("dashboard:benchmarks")).content.decode()
    assert "<code>bench/results</code>" in body and str(settings.BASE_DIR) not in body
    settings.OX_BENCH_RESULTS_DIR = tmp_path  # outside the project: named by its setting only
    body = client.get(reverse("dashboard:benchmarks")).content.decode()
    assert str(tmp_path) not in body and "OX_BENCH_RESULTS_DIR" in body


def test_recorded_paths_inside_the_project_read_relative(settings):
    run = bench.Run("r.json", None, environment={"python_executable": f"{settings.BASE_DIR}/bench/.venv/bin/python"})
    assert run.environment_summary == [("python_executable", "bench/.venv/bin/python")]
