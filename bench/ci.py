"""`bench/run --ci`: a small fixed subset of the matrix that fits CI's budget, and the comparison
of ox's ratios to its peers against a committed baseline (bench/baselines/ci.json).

Only ratios ox/peer are compared, never absolute figures: CI machines differ and are noisy, and
a peer measured in the same minutes on the same machine shares most of that noise. A ratio that
moved against ox by more than THRESHOLD prints a WARNING row. Nothing here fails a build: the
exit status is 0 with warnings; it is not only when the harness crashes, or when a baseline was
asked for from a run that lost some of its figures (README, "CI baselines")."""

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report
from bench.harness import BENCH, REPO, VAR, Harness
from bench.plan import Cell, build

BASELINE = BENCH / "baselines" / "ci.json"
OUT_DIR = VAR / "ci"  # not bench/results: a CI run is a check, not a published result
THRESHOLD = 0.20
# The peers that are cheap to run next to ox (one venv, PostgreSQL only, seconds per cell).
ARMS = ("ox", "django-tasks-db", "django-ox", "pgqueuer")
# Cells stop being started once this much time has passed since the harness started; an agent
# still running then is cut to what is left. It keeps the whole step inside CI's five minutes
# even when the machine is slower than the one the subset was sized on.
BUDGET_S = 240.0
# An agent is not started with less than this left: cut shorter, it could only time out.
MIN_AGENT_S = 15.0
# What one agent may take at most (the quick plan's cells allow 900 s: far beyond CI's budget).
AGENT_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Pick:
    """A cell of the quick plan as CI runs it."""

    source: str  # the quick plan's cell it is made from
    params: dict[str, Any]  # overrides of that cell's parameters
    reps: int
    metrics: tuple[str, ...]  # the metrics compared (the others are not measured again)
    arms: tuple[str, ...]


DJANGO_PEERS = ("ox", "django-tasks-db", "django-ox")
DRAIN = ("throughput", "cpu_per_task", "statements_per_task")
# Sizes chosen so that every arm's run takes seconds and ox's drains still span a few tenths of
# a second (at 500 tasks ox drains in a tenth: its throughput there is mostly timer noise), with
# repetitions, so that a median, not one sample, stands for each arm.
SUBSET: dict[str, Pick] = {
    "enqueue_seq": Pick("enqueue_seq", {"n": 1000}, 3, ("throughput",), ARMS),
    "drain_c1": Pick("drain_c1", {"n": 2000}, 2, DRAIN, DJANGO_PEERS),
    "drain_c4": Pick("drain_c4", {"n": 2000}, 2, DRAIN, DJANGO_PEERS),
    # pgqueuer's own cell is small (its drain at concurrency 4 runs ~1,000 tasks/s here) and
    # compares the statements a task costs, the steadiest figure: not the rate (noisy at this
    # size), nor CPU (ox spends a few 10 ms clock ticks on 400 tasks: a tick is 25% of it).
    "drain_c4_pgq": Pick("drain_c4", {"n": 400}, 1, ("statements_per_task",), ("ox", "pgqueuer")),
    # The NOTIFY-driven peer only: against the pollers (1 s interval) a p50 of a few samples is
    # the luck of where each fell in the poll cycle, far noisier than 20%.
    "dispatch": Pick("dispatch", {"n": 20, "gap": 0.5, "idle_s": 2.0}, 1, ("latency_p50",), ("ox", "pgqueuer")),
}


def ci_plan() -> list[Cell]:
    """The subset's cells: the quick plan's (with pgqueuer where it runs them), resized."""
    by_name = {c.name: c for c in build("quick")}
    cells = []
    for name, pick in SUBSET.items():
        cell = by_name[pick.source]
        cells.append(
            replace(
                cell,
                name=name,
                about=cell.about + f" (CI: {', '.join(f'{k}={v}' for k, v in pick.params.items())})",
                params={**cell.params, **pick.params},
                reps=pick.reps,
                metrics=tuple(m for m in cell.metrics if m.name in pick.metrics),
                arms=tuple(a for a in cell.arms if a in pick.arms),
                cannot_run={},
                timeout=AGENT_TIMEOUT_S,
            )
        )
    return cells


class CIHarness(Harness):
    """The harness on the CI subset, results under bench/var/ci/, bounded by a time budget."""

    def __init__(self, args: argparse.Namespace, budget_s: float = BUDGET_S) -> None:
        super().__init__(args)
        self.run_id = self.run_id.removesuffix("-quick") + "-ci"
        self.out = Path(args.out) if args.out else OUT_DIR / f"{self.run_id}.json"
        self.logs = VAR / "logs" / self.run_id
        self.plan = ci_plan()
        self.budget_s = budget_s
        self.deadline = time.monotonic() + budget_s

    def agent(self, arm: str, job: str, params: dict[str, Any], db: str, timeout: float, label: str) -> dict:
        left = self.deadline - time.monotonic()
        if left < MIN_AGENT_S:
            # Recorded as a failed run: its ratios go missing, the comparison says so.
            return {
                "ok": False,
                "error": f"skipped: less than {MIN_AGENT_S:.0f} s left of the CI budget ({self.budget_s:.0f} s)",
            }
        return super().agent(arm, job, params, db, min(timeout, left), label)


# ------------------------------------------------------------------ the comparison (pure)
@dataclass(frozen=True)
class Row:
    cell: str
    metric: str
    peer: str
    baseline: float | None
    current: float | None
    change: float | None  # current / baseline - 1
    status: str  # ok | WARNING | better | missing (no ratio this run) | new (no baseline)


def entries(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(cell, metric) -> {higher_is_better, ratios: {peer: ox/peer}}, from a results document or
    a baseline file (a baseline keeps the results' cell entries, trimmed)."""
    out = {}
    for cell in doc.get("cells", []):
        ratios = dict(cell.get("ratios") or {})
        out[(cell["name"], cell["metric"])] = {"higher_is_better": bool(cell["higher_is_better"]), "ratios": ratios}
    return out


def judge(baseline: float | None, current: float | None, higher_is_better: bool, threshold: float) -> Row:
    """One comparison (cell, metric and peer left empty for the caller to fill in)."""
    if current is None:
        return Row("", "", "", baseline, None, None, "missing")
    if baseline is None or baseline == 0:
        return Row("", "", "", baseline, current, None, "new")
    change = current / baseline - 1
    # How much worse for ox: a throughput ratio that fell, a cost ratio that rose.
    worse_by = -change if higher_is_better else change
    status = "WARNING" if worse_by > threshold else "better" if -worse_by > threshold else "ok"
    return Row("", "", "", baseline, current, change, status)


def compare(baseline: dict[str, Any], current: dict[str, Any], threshold: float = THRESHOLD) -> list[Row]:
    """Every (cell, metric, peer) of either document: this run's order first, then what only
    the baseline has."""
    old, new = entries(baseline), entries(current)
    rows = []
    for key in [*new, *(k for k in old if k not in new)]:
        hib = (new.get(key) or old[key])["higher_is_better"]
        old_ratios = (old.get(key) or {}).get("ratios", {})
        new_ratios = (new.get(key) or {}).get("ratios", {})
        for peer in [*new_ratios, *(p for p in old_ratios if p not in new_ratios)]:
            row = judge(old_ratios.get(peer), new_ratios.get(peer), hib, threshold)
            rows.append(replace(row, cell=key[0], metric=key[1] + ("" if hib else " (lower better)"), peer=peer))
    return rows


def compare_files(baseline: Path, current: Path, threshold: float = THRESHOLD) -> list[Row]:
    return compare(json.loads(baseline.read_text()), json.loads(current.read_text()), threshold)


def _r(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def table(rows: list[Row], threshold: float = THRESHOLD) -> str:
    header = ["cell", "metric", "peer", "baseline ox/peer", "this run", "change", "note"]
    lines = [header]
    for row in rows:
        change = "-" if row.change is None else f"{row.change * 100:+.1f}%"
        mark = {"ok": "", "better": "(better)", "missing": "(no ratio this run)", "new": "(no baseline)"}
        lines.append(
            [row.cell, row.metric, row.peer, _r(row.baseline), _r(row.current), change, mark.get(row.status, "WARNING")]
        )
    text = report._align(lines, 3)  # the main table's layout: names left, figures right
    legend = (
        f"WARNING marks where ox's ratio to the peer moved against ox by more than {threshold:.0%} of the baseline"
        " (a throughput ratio down, a cost or latency ratio up). Warnings only: the machine is noisy."
    )
    return "\n".join([*text, "", legend])


# ------------------------------------------------------------------ the baseline file
def baseline_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """The committed baseline: the run's ratios (and the values they came from, to read) with
    what it was measured on."""
    env = doc.get("environment", {})
    return {
        "schema": 1,
        "about": "ox's ratios to its peers on bench/run --ci's subset (bench/ci.py); written by"
        " `bench/run --ci --write-baseline`, compared by `bench/run --ci`",
        "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "run_id": doc.get("run_id"),
        "git_sha": doc.get("git_sha"),
        "git_dirty": doc.get("git_dirty", []),
        "ox_tree_sha1": doc.get("ox_tree_sha1"),
        "ox_trees_seen": doc.get("ox_trees_seen", []),  # more than one: ox/ changed during the run
        "threshold": THRESHOLD,
        "environment": {
            k: env.get(k) for k in ("cpu_model", "cores", "python", "packages", "load_average_start", "duration_s")
        }
        | {"postgresql": (env.get("postgresql") or {}).get("version")},
        "plan": {name: asdict(pick) for name, pick in SUBSET.items()},
        "cells": [
            {
                "name": c["name"],
                "metric": c["metric"],
                "unit": c["unit"],
                "higher_is_better": c["higher_is_better"],
                "values": {a: e.get("value") for a, e in c["arms"].items()},
                "ratios": c["ratios"],
            }
            for c in doc.get("cells", [])
        ],
    }


def main(args: argparse.Namespace) -> int:
    """Run the subset, then write the baseline or compare with it. 0 unless a baseline was asked
    for from a run that lost some of its figures."""
    args.quick, args.cells = True, ""
    args.arms = args.arms or ",".join(ARMS)
    harness = CIHarness(args)
    harness.run()
    where = Path(args.baseline) if args.baseline else BASELINE
    shown = where.relative_to(REPO) if where.is_relative_to(REPO) else where
    if args.write_baseline:
        failed = [f"{r['cell']} rep {r['rep']} {r['arm']}: {r['error']}" for r in harness.doc["runs"] if not r["ok"]]
        if failed:
            print("\nno baseline written: some runs failed\n  " + "\n  ".join(failed))
            return 1
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(json.dumps(baseline_doc(harness.doc), indent=1) + "\n")
        print(f"\nbaseline written: {shown}")
        print(table(compare(harness.doc, harness.doc)))
        return 0
    if not where.exists():
        print(f"\nno baseline at {shown}: nothing to compare (bench/run --ci --write-baseline writes one)")
        return 0
    rows = compare(json.loads(where.read_text()), harness.doc)
    harness.doc["ci_comparison"] = {"baseline": str(shown), "threshold": THRESHOLD, "rows": [asdict(r) for r in rows]}
    harness.write()
    print(f"\nox's ratios against the baseline ({shown}, threshold {THRESHOLD:.0%}):")
    print(table(rows))
    warned = [r for r in rows if r.status == "WARNING"]
    for r in warned:
        # One greppable line per regression, for the CI log.
        print(f"WARNING: bench {r.cell} {r.metric} ox/{r.peer}: {_r(r.baseline)} -> {_r(r.current)} ({r.change:+.0%})")
    print(f"bench --ci: {len(warned)} warning(s); exit status 0 (warnings do not fail the build)")
    return 0
