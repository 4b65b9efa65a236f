"""Statistics over kept samples, and the printed table: each metric per arm and the ratio
ours/peer. Pure functions over the results document (see README.md, "Results schema")."""

import math
import statistics
from collections.abc import Sequence
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


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _ratio_text(r: float | None, higher_is_better: bool) -> str:
    if r is None:
        return "-"
    mark = {True: "+", False: "-", None: ""}[ox_wins(r, higher_is_better) if r != 1 else None]
    return f"{r:.2f}x{mark}"


def table(doc: dict[str, Any]) -> str:
    """The results as aligned text: one row per (cell, metric)."""
    arms: list[str] = doc["arms"]
    peers = [a for a in arms if a != OURS]
    header = ["cell", "metric", "unit", *arms, *(f"ox/{p}" for p in peers)]
    rows = [header]
    for cell in doc["cells"]:
        hib = cell["higher_is_better"]
        values = {a: cell["arms"].get(a, {}).get("value") for a in arms}
        row = [cell["name"], cell["metric"] + ("" if hib else " (lower better)"), cell["unit"]]
        row += [_num(values[a]) if a in cell["arms"] else "n/a" for a in arms]
        row += [_ratio_text(ratio(values.get(OURS), values[p]), hib) for p in peers]
        rows.append(row)
    lines = _align(rows, 3)
    legend = "ratio = ox / peer; '+' ox better, '-' ox worse (direction per metric); '-' alone: no value."
    return "\n".join([*lines, "", legend])


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
            row += [_num(cell["arms"].get(a, {}).get("value")) for a in arms]
            row += ["-" if ratios[a][i] is None else f"{ratios[a][i]:.2f}x" for a in arms]
            rows.append(row)
        hib = "higher is better" if cells[0]["higher_is_better"] else "lower is better"
        blocks.append("\n".join([f"{name}: {metric} ({hib}), by {axis}", *_align(rows, 1)]))
    return blocks


def notes(doc: dict[str, Any]) -> list[str]:
    """Failures and unfinished runs worth printing under the table."""
    out = []
    trees = doc.get("ox_trees_seen") or []
    if len(trees) > 1:
        out.append(f"ox's source changed during this run ({len(trees)} versions of ox/ seen; see runs[].ox_tree_sha1)")
    # Arms that do not run a cell, one line per (arm, reason) with the cells it covers.
    absent: dict[tuple[str, str], list[str]] = {}
    for cell in doc.get("cells", []):
        for arm, why in (cell.get("cannot_run") or {}).items():
            names = absent.setdefault((arm, why), [])
            if cell["name"] not in names:
                names.append(cell["name"])
    for (arm, why), names in absent.items():
        out.append(f"{arm} {why} [{', '.join(names)}]")
    for run in doc.get("runs", []):
        where = f"{run['cell']} rep {run['rep']} {run['arm']}"
        if not run.get("ok"):
            first = (run.get("error") or "").strip().splitlines()[-1:] or ["?"]
            out.append(f"{where}: ERROR {first[0]}")
        for note in (run.get("result") or {}).get("info", {}).get("notes", []):
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
