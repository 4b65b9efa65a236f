"""bench/run --ci: the comparison of ox's ratios against a baseline (pure logic, on JSON files
written here), the subset's plan against the committed baseline, and .ci/run keeping the tests'
exit status whatever the benchmark step does (the real script, run on stubs)."""

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench import ci

REPO = Path(__file__).resolve().parent.parent


def cell(name: str, metric: str, hib: bool, ratios: dict[str, float | None]) -> dict[str, Any]:
    """A results document's cell entry, as bench.harness writes it (what compare reads)."""
    return {
        "name": name,
        "metric": metric,
        "unit": "x",
        "higher_is_better": hib,
        "stat": "median",
        "db": "pg",
        "about": "",
        "arms": {"ox": {"samples": [1.0], "value": 1.0}},
        "ratios": ratios,
    }


def write(path: Path, cells: list[dict[str, Any]], **extra: Any) -> Path:
    path.write_text(json.dumps({"schema": 1, "cells": cells, **extra}))
    return path


def by_key(rows: list[ci.Row]) -> dict[tuple[str, str, str], ci.Row]:
    return {(r.cell, r.metric.removesuffix(" (lower better)"), r.peer): r for r in rows}


def test_a_regression_over_20_percent_warns_and_10_percent_does_not(tmp_path):
    baseline = write(
        tmp_path / "baseline.json",
        [
            cell("drain_c1", "throughput", True, {"django-ox": 10.0, "django-tasks-db": 10.0, "pgqueuer": 2.0}),
            cell("drain_c1", "cpu_per_task", False, {"django-ox": 0.05, "django-tasks-db": 0.05, "pgqueuer": 0.5}),
        ],
    )
    current = write(
        tmp_path / "current.json",
        [
            # throughput ratios (higher is better): -25% warns, -10% does not, +30% is "better"
            cell("drain_c1", "throughput", True, {"django-ox": 7.5, "django-tasks-db": 9.0, "pgqueuer": 2.6}),
            # cost ratios (lower is better): +25% warns, +10% does not, -40% is "better"
            cell("drain_c1", "cpu_per_task", False, {"django-ox": 0.0625, "django-tasks-db": 0.055, "pgqueuer": 0.3}),
        ],
        runs=[],
    )
    rows = by_key(ci.compare_files(baseline, current))
    assert rows[("drain_c1", "throughput", "django-ox")].status == "WARNING"
    assert rows[("drain_c1", "throughput", "django-ox")].change == pytest.approx(-0.25)
    assert rows[("drain_c1", "throughput", "django-tasks-db")].status == "ok"
    assert rows[("drain_c1", "throughput", "pgqueuer")].status == "better"
    assert rows[("drain_c1", "cpu_per_task", "django-ox")].status == "WARNING"
    assert rows[("drain_c1", "cpu_per_task", "django-tasks-db")].status == "ok"
    assert rows[("drain_c1", "cpu_per_task", "pgqueuer")].status == "better"
    # The printed table marks exactly the two regressions.
    text = ci.table(list(rows.values()))
    flagged = [line for line in text.splitlines() if line.rstrip().endswith("WARNING")]
    assert len(flagged) == 2
    assert all("django-ox" in line for line in flagged)


def test_missing_peers_and_cells_on_either_side(tmp_path):
    baseline = write(
        tmp_path / "baseline.json",
        [
            cell("enqueue_seq", "throughput", True, {"django-ox": 1.5, "pgqueuer": 1.0}),
            cell("dispatch", "latency_p50", False, {"pgqueuer": 2.0}),  # a cell this run lacks
        ],
    )
    current = write(
        tmp_path / "current.json",
        [
            # pgqueuer gone from the cell, a new peer in it, and one peer whose arm failed (None)
            cell("enqueue_seq", "throughput", True, {"django-ox": 1.5, "django-tasks-db": 3.0}),
            cell("drain_c4", "throughput", True, {"django-ox": None}),  # a cell the baseline lacks
        ],
        runs=[],
    )
    rows = by_key(ci.compare_files(baseline, current))
    assert rows[("enqueue_seq", "throughput", "django-ox")].status == "ok"
    assert rows[("enqueue_seq", "throughput", "django-tasks-db")].status == "new"
    assert rows[("enqueue_seq", "throughput", "pgqueuer")].status == "missing"
    assert rows[("dispatch", "latency_p50", "pgqueuer")].status == "missing"
    assert rows[("drain_c4", "throughput", "django-ox")].status == "missing"
    assert not [r for r in rows.values() if r.status == "WARNING"]
    text = ci.table(list(rows.values()))
    assert "(no baseline)" in text and "(no ratio this run)" in text
    # Nothing to compare against at all: every row is new, none warns.
    assert {r.status for r in ci.compare({}, json.loads(current.read_text()))} <= {"new", "missing"}


def test_a_baseline_written_from_a_run_compares_clean_with_it(tmp_path):
    doc = {
        "run_id": "x-ci",
        "environment": {"cores": 2},
        "cells": [cell("drain_c1", "throughput", True, {"django-ox": 12.0}), cell("x", "y", False, {"p": 0.5})],
        "runs": [],
    }
    written = write(tmp_path / "b.json", ci.baseline_doc(doc)["cells"])
    rows = ci.compare_files(written, write(tmp_path / "c.json", doc["cells"]))
    assert [(r.status, r.change) for r in rows] == [("ok", 0.0), ("ok", 0.0)]


def test_the_subset_and_the_committed_baseline_agree():
    plan = ci.ci_plan()
    assert [c.name for c in plan] == list(ci.SUBSET)
    for c in plan:
        pick = ci.SUBSET[c.name]
        assert [m.name for m in c.metrics] == list(pick.metrics), c.name  # every metric exists
        assert set(c.arms) == set(pick.arms) and set(c.arms) <= set(ci.ARMS)
        assert c.timeout <= ci.AGENT_TIMEOUT_S and c.db == "pg"
    baseline = json.loads(ci.BASELINE.read_text())
    have = {(e["name"], e["metric"], p) for e in baseline["cells"] for p, r in e["ratios"].items() if r}
    want = {(c.name, m.name, a) for c in plan for m in c.metrics for a in c.arms if a != "ox"}
    # A changed subset needs a new baseline: bench/run --ci --write-baseline.
    assert have == want


# ------------------------------------------------------------------ .ci/run's exit status
def executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def ci_tree(tmp_path):
    """The real .ci/run in a tree whose ./test, bench/run, .venv/bin/python and apt-get are
    stubs, driven by environment variables."""
    if not (shutil.which("flock") and shutil.which("timeout")):
        pytest.skip("needs flock and timeout (util-linux, coreutils)")
    tree = tmp_path / "repo"
    executable(tree / ".ci" / "run", (REPO / ".ci" / "run").read_text())
    executable(tree / "test", '#!/bin/sh\necho "stub tests"\nexit "${STUB_TEST_RC:-0}"\n')
    executable(tree / "bench" / "run", '#!/bin/sh\necho "$@" > bench-ran\nexit "${STUB_BENCH_RC:-0}"\n')
    executable(tree / ".venv" / "bin" / "python", '#!/bin/sh\nexit "${STUB_PG_RC:-0}"\n')  # pg_ready.py
    executable(tmp_path / "bin" / "apt-get", "#!/bin/sh\nexit 0\n")  # never install anything here

    def run(caller_ci: str = "true", **stubs: int) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "CI"}
        env.update({f"STUB_{k.upper()}_RC": str(v) for k, v in stubs.items()})
        env.update(PATH=f"{tmp_path / 'bin'}:{env['PATH']}", OX_BENCH_LOCK=str(tmp_path / "lock"))
        if caller_ci:
            env["CI"] = caller_ci
        return subprocess.run(
            ["bash", str(tree / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60, check=False
        )

    run.ran = lambda: (tree / "bench-ran").read_text().strip() if (tree / "bench-ran").exists() else None
    return run


def test_ci_run_exits_with_the_tests_status_and_skips_the_bench_on_failure(ci_tree):
    out = ci_tree(test=3)
    assert out.returncode == 3, out.stdout + out.stderr
    assert ci_tree.ran() is None
    assert "SKIPPED bench/run --ci: the tests failed" in out.stdout


def test_ci_run_runs_the_bench_after_passing_tests(ci_tree):
    out = ci_tree(test=0, bench=0)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ci_tree.ran() == "--ci"


def test_a_bench_crash_is_loud_but_does_not_fail_the_build(ci_tree):
    out = ci_tree(test=0, bench=1)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ci_tree.ran() == "--ci"
    assert "WARNING: bench/run --ci did not finish (exit 1" in out.stderr


def test_outside_ci_the_bench_is_skipped_without_postgresql(ci_tree):
    out = ci_tree(caller_ci="", test=0, pg=1)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ci_tree.ran() is None
    assert "SKIPPED bench/run --ci: PostgreSQL does not answer" in out.stdout
    # With CI=true from the caller the bench runs whether or not the check would pass.
    assert ci_tree(caller_ci="true", test=0, pg=1).returncode == 0 and ci_tree.ran() == "--ci"
