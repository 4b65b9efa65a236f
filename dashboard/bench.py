"""The benchmark history: bench/results/*.json, read defensively and cached by file mtime.

A results file (bench/README.md documents it) looks like
    {"schema": 1, "started_at": ..., "git_sha": ..., "mode": ..., "environment": {...},
     "cells": [{"name", "metric", "unit", "higher_is_better",
                "arms": {"ox": {"value", "samples"}, "django-tasks-db": {...}, ...}}]}
A file that does not parse, or a cell missing parts, is shown as such, never a 500.
"""

import json
import statistics
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils.dateparse import parse_datetime

OURS = "ox"
ARM_COLORS = {"ox": "#2563eb", "django-tasks-db": "#d97706", "django-ox": "#7c3aed"}
EXTRA_COLORS = ["#059669", "#db2777", "#0891b2", "#65a30d"]


@dataclass(frozen=True)
class Cell:
    name: str
    metric: str
    unit: str
    higher_is_better: bool | None
    values: dict[str, float | None]  # arm -> value
    db: str = ""  # the database the cell ran on ("pg", "sqlite"); part of what it measures
    about: str = ""

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.name, self.metric, self.unit, self.db)


@dataclass(frozen=True)
class Run:
    file: str
    started_at: datetime | None
    git_sha: str = ""
    mode: str = ""
    environment: dict[str, Any] = field(default_factory=dict)
    cells: tuple[Cell, ...] = ()
    error: str = ""
    dirty: bool = False  # run from a working tree with uncommitted changes

    @property
    def environment_summary(self) -> list[tuple[str, str]]:
        """One line per top-level entry: nested settings collapse to "key value, ..." pairs.
        Paths inside the project read relative to it (a run records its interpreter's path)."""
        project = f"{Path(settings.BASE_DIR).resolve()}/"
        lines = []
        for key, value in self.environment.items():
            if isinstance(value, dict):
                parts = [f"{k} {v}" for k, v in value.items() if not isinstance(v, (dict, list))]
                text = ", ".join(parts)
            elif isinstance(value, list):
                text = ", ".join(map(str, value))
            else:
                text = str(value)
            text = text.replace(project, "")
            lines.append((str(key), text if len(text) <= 160 else text[:157] + "..."))
        return lines

    @property
    def label(self) -> str:
        when = self.started_at.strftime("%m-%d %H:%M") if self.started_at else self.file
        return f"{when} {self.git_sha[:7]}".strip()


def results_dir() -> Path:
    default = Path(settings.BASE_DIR) / "bench" / "results"
    return Path(getattr(settings, "OX_BENCH_RESULTS_DIR", default))


def results_dir_label() -> str:
    """Where the results are, as the page says it: relative to the project, never the server's
    absolute path (which tells a visitor the host's layout and user names)."""
    directory = results_dir()
    try:
        return directory.resolve().relative_to(Path(settings.BASE_DIR).resolve()).as_posix()
    except (OSError, ValueError):
        return "the folder in settings.OX_BENCH_RESULTS_DIR"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _arm_value(arm: Any) -> float | None:
    """An arm is {"value": v, "samples": [...]} (or a bare number); without a value, the median
    of its samples."""
    if not isinstance(arm, dict):
        return _number(arm)
    value = _number(arm.get("value"))
    if value is None and isinstance(arm.get("samples"), list):
        samples = [s for s in map(_number, arm["samples"]) if s is not None]
        value = statistics.median(samples) if samples else None
    return value


def _cell(raw: Any) -> Cell | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("arms"), dict):
        return None
    hib = raw.get("higher_is_better")
    return Cell(
        name=str(raw.get("name") or "?"),
        metric=str(raw.get("metric") or ""),
        unit=str(raw.get("unit") or ""),
        higher_is_better=hib if isinstance(hib, bool) else None,
        values={str(arm): _arm_value(v) for arm, v in raw["arms"].items()},
        db=str(raw.get("db") or ""),
        about=str(raw.get("about") or ""),
    )


def parse(path: Path) -> Run:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return Run(path.name, None, error=f"unreadable: {exc}")
    if not isinstance(data, dict):
        return Run(path.name, None, error="not a JSON object")
    started = data.get("started_at")
    started_at = parse_datetime(started) if isinstance(started, str) else None
    environment = data.get("environment")
    raw_cells = data.get("cells")
    cells = tuple(c for c in map(_cell, raw_cells if isinstance(raw_cells, list) else []) if c)
    return Run(
        path.name,
        started_at,
        git_sha=str(data.get("git_sha") or ""),
        mode=str(data.get("mode") or ""),
        environment=environment if isinstance(environment, dict) else {},
        cells=cells,
        error="" if cells else "no cells",
        dirty=bool(data.get("git_dirty")),
    )


_cache: dict[Path, tuple[tuple[int, int], Run]] = {}
_lock = threading.Lock()


def load_runs(directory: Path | None = None) -> list[Run]:
    """Every results file, oldest run first. A file is parsed again only when its mtime or size
    changed, so a page view costs one directory listing."""
    directory = directory or results_dir()
    try:
        entries = [e for e in directory.iterdir() if e.suffix == ".json" and e.is_file()]
    except OSError:
        return []
    runs = []
    with _lock:
        for path in entries:
            st = path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
            cached = _cache.get(path)
            if cached is None or cached[0] != stamp:
                cached = (stamp, parse(path))
                _cache[path] = cached
            runs.append(cached[1])
        for gone in set(_cache) - set(entries):
            if gone.parent == directory:
                del _cache[gone]
    return sorted(runs, key=lambda r: (r.started_at is None, r.started_at or datetime.min, r.file))


@dataclass
class MetricChart:
    name: str
    metric: str
    unit: str
    db: str
    about: str
    higher_is_better: bool | None
    labels: list[str]
    series: list[dict[str, Any]]

    @property
    def title(self) -> str:
        title = f"{self.name} — {self.metric}" if self.metric and self.metric != self.name else self.name
        return f"{title} ({self.db})" if self.db else title


def charts(runs: list[Run]) -> list[MetricChart]:
    """One chart per (cell, metric, unit, db): a line per arm across the runs that measured it."""
    keys: dict[tuple[str, str, str, str], Cell] = {}
    for run in runs:
        for cell in run.cells:
            keys.setdefault(cell.key, cell)
    by_run = [(run, {c.key: c for c in run.cells}) for run in runs]
    found = []
    for key, first in keys.items():
        measured = [(run, cells[key]) for run, cells in by_run if key in cells]
        arms = sorted({arm for _, cell in measured for arm in cell.values}, key=lambda a: (a != OURS, a))
        series = []
        for i, arm in enumerate(arms):
            color = ARM_COLORS.get(arm, EXTRA_COLORS[i % len(EXTRA_COLORS)])
            data = [cell.values.get(arm) for _, cell in measured]
            series.append({"label": arm, "data": data, "color": color, "ours": arm == OURS})
        labels = [run.label for run, _ in measured]
        found.append(MetricChart(*key, first.about, first.higher_is_better, labels, series))
    return found
