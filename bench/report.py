"""Statistics over kept samples, and the tables: each metric per arm and the ratio ours/peer.
Pure functions over the results document (see README.md, "Results schema"), no Django: the
harness prints them (`bench/run`, `bench/run --report FILE`) and the dashboard's benchmarks page
renders the same rows (`rows()`), so the two never disagree. Both read files written by other
versions of the harness, or by hand: a missing or mistyped field is read as absent, never a
KeyError."""

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

OURS = "ox"


def summarize(samples: Sequence[float], stat: str) -> float | None:
    """One number from every sample kept: median, sum, min, max, or a percentile pNN
    (linear interpolation between closest ranks)."""
    values = sorted(float(s) for s in samples if s is not None and not math.isnan(s))
    if not values:
        return None
    if stat == "median":
        return statistics.median(values)
    if stat == "sum":
        return sum(values)
    if stat == "max":
        return values[-1]
    if stat == "min":
        return values[0]
    if stat.startswith("p"):
        q = float(stat[1:]) / 100
        pos = q * (len(values) - 1)
        low = math.floor(pos)
        high = min(low + 1, len(values) - 1)
        return values[low] + (values[high] - values[low]) * (pos - low)
    raise ValueError(f"unknown statistic {stat!r}")


def ratio(ours: float | None, peer: float | None) -> float | None:
    """ours / peer; None when either is missing or the peer is zero."""
    if ours is None or peer is None or peer == 0:
        return None
    return ours / peer


def ox_wins(r: float | None, higher_is_better: bool) -> bool | None:
    if r is None:
        return None
    return r > 1 if higher_is_better else r < 1


def number_text(value: float | None) -> str:
    """A figure as the tables print it: thousands separated, about three significant digits."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _ratio_text(r: float | None, higher_is_better: bool | None) -> str:
    if r is None:
        return "-"
    better = ox_wins(r, higher_is_better) if r != 1 and higher_is_better is not None else None
    return f"{r:.2f}x" + {True: "+", False: "-", None: ""}[better]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def arms_of(doc: dict[str, Any]) -> list[str]:
    """Every arm the document names: its `arms` in their order, then any other arm a cell has
    or says it could not run, in the order first seen (a results file from a newer harness may
    carry arms this code has never heard of; they get columns like any other)."""
    found = [str(a) for a in _list(doc.get("arms"))]
    for cell in map(_dict, _list(doc.get("cells"))):
        for arm in [*_dict(cell.get("arms")), *_dict(cell.get("cannot_run"))]:
            if str(arm) not in found:
                found.append(str(arm))
    return found


@dataclass(frozen=True)
class Spread:
    """The samples an arm's figure summarizes: lowest, highest, how many (rounds, repetitions,
    or per-task latencies, whichever the metric keeps)."""

    low: float
    high: float
    count: int


@dataclass(frozen=True)
class ArmFigure:
    ran: bool  # the arm is under the cell's `arms` (it ran, whatever came of it)
    value: float | None
    spread: Spread | None
    why: str = ""  # why there is no value: the harness's cannot_run reason, an error, a note


@dataclass(frozen=True)
class Row:
    """One (cell, metric) of a results document with every arm's figure and ours/peer ratios."""

    cell: str
    metric: str
    unit: str
    higher_is_better: bool | None
    stat: str
    db: str
    about: str
    arms: dict[str, ArmFigure]  # every arm of arms_of(doc), in that order
    ratios: dict[str, float | None]  # peer -> ours / peer (only when OURS is an arm of the document)
    settings: tuple[tuple[str, str], ...]


def _spread(samples: list[Any]) -> Spread | None:
    values = [v for v in map(_number, samples) if v is not None]
    return Spread(min(values), max(values), len(values)) if values else None


def _run_outcomes(doc: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    """(cell, arm) -> what its runs said went wrong: the last line of an error, the notes."""
    said: dict[tuple[str, str], list[str]] = {}
    for run in map(_dict, _list(doc.get("runs"))):
        lines = said.setdefault((str(run.get("cell")), str(run.get("arm"))), [])
        if run.get("ok") is False:
            last = str(run.get("error") or "").strip().splitlines()[-1:] or ["?"]
            lines.append(f"error: {last[0]}")
        lines.extend(str(n) for n in _list(_dict(_dict(run.get("result")).get("info")).get("notes")))
    return said


def _why(cell: dict[str, Any], arm: str, ran: bool, said: dict[tuple[str, str], list[str]]) -> str:
    if not ran:
        return str(_dict(cell.get("cannot_run")).get(arm) or "not run in this cell")
    return "; ".join(dict.fromkeys(said.get((str(cell.get("name")), arm), []))) or "no sample"


# What a cell's parameters are called on the page, in this order; parameters not named here
# follow under their own names, so a new cell's settings still show.
SETTING_NAMES = {
    "processes": "processes",
    "concurrency": "concurrency",
    "workers": "workers",
    "producers": "producers",
    "n": "tasks",
    "total": "backlog",
    "task": "task",
    "rounds": "rounds",
}
# The cell's plumbing (a wait cap, which ratios to derive) rather than a setting a reader compares.
SETTING_SKIP = {"ratios", "db_stats", "cap", "timeout"}
# Django's connection handling in the workers: shown as one "connections" setting.
POLICY_ENV = {"BENCH_POOL", "BENCH_CONN_MAX_AGE"}


def _setting_text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def cell_settings(plan: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """A cell's settings from its `options.plan` entry: the worker shape, the sizes, the
    connection policy (worker_env), the repetitions."""
    params = _dict(plan.get("params"))
    ordered = [k for k in SETTING_NAMES if k in params] + [k for k in params if k not in SETTING_NAMES]
    out: list[tuple[str, str]] = []
    for key in ordered:
        value = params[key]
        if key in SETTING_SKIP or value is None:
            continue
        if key == "worker_env":
            env = _dict(value)
            if env.get("BENCH_POOL"):
                out.append(("connections", "pool"))
            elif "BENCH_CONN_MAX_AGE" in env:
                out.append(("connections", f"CONN_MAX_AGE={env['BENCH_CONN_MAX_AGE']}"))
            out += [(k.removeprefix("BENCH_").lower(), str(v)) for k, v in env.items() if k not in POLICY_ENV]
        elif key == "variants":
            out.append(("variants", ", ".join(str(_dict(v).get("name") or "?") for v in _list(value))))
        elif not isinstance(value, (dict, list)):
            out.append((SETTING_NAMES.get(key, key), _setting_text(value)))
    if isinstance(plan.get("reps"), int) and not isinstance(plan["reps"], bool):
        out.append(("repetitions", str(plan["reps"])))
    return tuple(out)


def rows(doc: dict[str, Any]) -> list[Row]:
    """The results as rows: one per (cell, metric), in the document's order. Each carries every
    arm of the document: a value and its spread where the arm ran, else why not."""
    arms = arms_of(doc)
    peers = [a for a in arms if a != OURS] if OURS in arms else []
    plans = {str(p.get("name")): p for p in map(_dict, _list(_dict(doc.get("options")).get("plan")))}
    said = _run_outcomes(doc)
    found = []
    for cell in _list(doc.get("cells")):
        if not isinstance(cell, dict):
            continue
        entries = _dict(cell.get("arms"))
        figures = {}
        for arm in arms:
            entry = entries.get(arm)
            kept = _dict(entry)
            value = _number(kept.get("value") if isinstance(entry, dict) else entry)
            ran = arm in entries
            why = "" if value is not None else _why(cell, arm, ran, said)
            figures[arm] = ArmFigure(ran, value, _spread(_list(kept.get("samples"))), why)
        hib = cell.get("higher_is_better")
        name = str(cell.get("name") or "?")
        found.append(
            Row(
                cell=name,
                metric=str(cell.get("metric") or ""),
                unit=str(cell.get("unit") or ""),
                higher_is_better=hib if isinstance(hib, bool) else None,
                stat=str(cell.get("stat") or ""),
                db=str(cell.get("db") or ""),
                about=str(cell.get("about") or ""),
                arms=figures,
                ratios={p: ratio(figures[OURS].value, figures[p].value) for p in peers},
                settings=cell_settings(plans.get(name, {})),
            )
        )
    return found


def table(doc: dict[str, Any]) -> str:
    """The results as aligned text: one row per (cell, metric)."""
    arms = arms_of(doc)
    peers = [a for a in arms if a != OURS]
    lines = [["cell", "metric", "unit", *arms, *(f"ox/{p}" for p in peers)]]
    for row in rows(doc):
        line = [row.cell, row.metric + (" (lower better)" if row.higher_is_better is False else ""), row.unit]
        line += [number_text(row.arms[a].value) if row.arms[a].ran else "n/a" for a in arms]
        line += [_ratio_text(row.ratios.get(p), row.higher_is_better) for p in peers]
        lines.append(line)
    legend = "ratio = ox / peer; '+' ox better, '-' ox worse (direction per metric); '-' alone: no value."
    return "\n".join([*_align(lines, 3), "", legend])


def _align(rows: list[list[str]], left: int) -> list[str]:
    """Rows as aligned text: the first `left` columns left-aligned, the rest right-aligned,
    a rule under the header row."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


# Metrics of a series cell that stay in the main table only (flat by construction, or not
# about scaling).
SERIES_SKIP = {"peak_rss", "statements_per_task", "listening_workers"}


def series(doc: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Cells that belong to a series, by (series, metric), in order of x."""
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for cell in doc.get("cells", []):
        if cell.get("series") and cell["metric"] not in SERIES_SKIP:
            found.setdefault((cell["series"]["name"], cell["metric"]), []).append(cell)
    return {key: sorted(cells, key=lambda c: c["series"]["x"]) for key, cells in found.items()}


def scaled(cells: list[dict[str, Any]], arm: str) -> list[float | None]:
    """Each cell's value for the arm over the value at the series' smallest x."""
    values = [c["arms"].get(arm, {}).get("value") for c in cells]
    return [ratio(v, values[0]) for v in values]


def series_tables(doc: dict[str, Any]) -> list[str]:
    """One block per series and metric: the value at each x and its ratio to the smallest x
    (e.g. throughput at a 1M backlog over throughput at 10k), per arm that ran it."""
    blocks = []
    for (name, metric), cells in series(doc).items():
        axis, first = cells[0]["series"]["axis"], cells[0]["series"]["x"]
        arms = [a for a in doc["arms"] if any(a in c["arms"] for c in cells)]
        ratios = {a: scaled(cells, a) for a in arms}
        rows = [[axis, *(f"{a} {cells[0]['unit']}" for a in arms), *(f"{a} / {axis} {first:,}" for a in arms)]]
        for i, cell in enumerate(cells):
            row = [f"{cell['series']['x']:,}"]
            row += [number_text(cell["arms"].get(a, {}).get("value")) for a in arms]
            row += ["-" if ratios[a][i] is None else f"{ratios[a][i]:.2f}x" for a in arms]
            rows.append(row)
        hib = "higher is better" if cells[0]["higher_is_better"] else "lower is better"
        blocks.append("\n".join([f"{name}: {metric} ({hib}), by {axis}", *_align(rows, 1)]))
    return blocks


def notes(doc: dict[str, Any]) -> list[str]:
    """Failures and unfinished runs worth printing under the table."""
    out = []
    trees = _list(doc.get("ox_trees_seen"))
    if len(trees) > 1:
        out.append(f"ox's source changed during this run ({len(trees)} versions of ox/ seen; see runs[].ox_tree_sha1)")
    # Arms that do not run a cell, one line per (arm, reason) with the cells it covers.
    absent: dict[tuple[str, str], list[str]] = {}
    for cell in map(_dict, _list(doc.get("cells"))):
        for arm, why in _dict(cell.get("cannot_run")).items():
            names = absent.setdefault((str(arm), str(why)), [])
            if str(cell.get("name")) not in names:
                names.append(str(cell.get("name")))
    for (arm, why), names in absent.items():
        out.append(f"{arm} {why} [{', '.join(names)}]")
    for run in map(_dict, _list(doc.get("runs"))):
        where = f"{run.get('cell')} rep {run.get('rep')} {run.get('arm')}"
        if not run.get("ok"):
            first = str(run.get("error") or "").strip().splitlines()[-1:] or ["?"]
            out.append(f"{where}: ERROR {first[0]}")
        for note in _list(_dict(_dict(run.get("result")).get("info")).get("notes")):
            out.append(f"{where}: {note}")
    return out


TOP_KEYS = {
    "schema": int,
    "run_id": str,
    "started_at": str,
    "git_sha": str,
    "mode": str,
    "arms": list,
    "environment": dict,
    "options": dict,
    "cells": list,
    "runs": list,
}
CELL_KEYS = {
    "name": str,
    "metric": str,
    "unit": str,
    "higher_is_better": bool,
    "stat": str,
    "db": str,
    "about": str,
    "arms": dict,
    "ratios": dict,
}


def validate(doc: dict[str, Any]) -> list[str]:
    """Problems with a results document against schema 1 (empty: it conforms)."""
    problems = []
    for key, kind in TOP_KEYS.items():
        if not isinstance(doc.get(key), kind):
            problems.append(f"top-level {key!r} missing or not {kind.__name__}")
    if doc.get("schema") != 1:
        problems.append(f"schema is {doc.get('schema')!r}, expected 1")
    if doc.get("mode") not in ("quick", "full"):
        problems.append(f"mode is {doc.get('mode')!r}")
    for i, cell in enumerate(doc.get("cells") or []):
        for key, kind in CELL_KEYS.items():
            if not isinstance(cell.get(key), kind):
                problems.append(f"cells[{i}] {key!r} missing or not {kind.__name__}")
        extra = cell.get("series")
        if extra is not None and not (
            isinstance(extra, dict)
            and isinstance(extra.get("name"), str)
            and isinstance(extra.get("axis"), str)
            and isinstance(extra.get("x"), (int, float))
        ):
            problems.append(f"cells[{i}] 'series' is not {{name, axis, x}}")
        for arm, entry in (cell.get("arms") or {}).items():
            if not isinstance(entry.get("samples"), list):
                problems.append(f"cells[{i}] arm {arm!r}: samples is not a list")
            value = entry.get("value")
            if value is not None and not isinstance(value, (int, float)):
                problems.append(f"cells[{i}] arm {arm!r}: value is not a number")
    return problems
