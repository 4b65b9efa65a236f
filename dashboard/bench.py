"""The benchmark history: bench/results/*.json, read defensively and cached by file mtime.

A results file (bench/README.md, "Results schema") holds one run: its cells, each arm's samples
and value, the plan with every cell's settings. The table of one run comes from bench/report.py,
the same rows `bench/run --report` prints (bench is this repository's own package, stdlib only,
and ships in the same checkout and image as the dashboard). A file that does not parse, or a
cell missing parts, is shown as such, never a 500.
"""

import json
import math
import statistics
import threading
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils.dateparse import parse_datetime

from bench import report

OURS = report.OURS
# Known arms keep their colour from chart to chart; any other arm (a results file may name arms
# added after this code) gets one of EXTRA_COLORS picked by its name, so it too keeps its colour.
ARM_COLORS = {
    "ox": "#2563eb",
    "django-tasks-db": "#d97706",
    "django-ox": "#7c3aed",
    "pgqueuer": "#059669",
    "procrastinate": "#db2777",
}
EXTRA_COLORS = ["#0891b2", "#65a30d", "#b91c1c", "#4b5563", "#ca8a04", "#9333ea"]


def arm_color(arm: str) -> str:
    return ARM_COLORS.get(arm) or EXTRA_COLORS[zlib.crc32(arm.encode()) % len(EXTRA_COLORS)]


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
    finished: bool = False  # finished_at recorded: the harness got to the end of its plan
    subset: bool = False  # run with --cells or --arms: part of the matrix, not all of it
    arms: tuple[str, ...] = ()  # every arm the file names (report.arms_of)
    rows: tuple[report.Row, ...] = ()  # the run's table (report.rows)
    notes: tuple[str, ...] = ()  # failures, DNFs, absences (report.notes)

    @property
    def full(self) -> bool:
        return self.mode == "full" or (not self.mode and self.file.endswith("-full.json"))

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
    """A figure, or None: Python's json reads NaN and Infinity, which the charts' JSON (parsed by
    the browser's JSON.parse) cannot carry."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
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
    options = data.get("options")
    argv = options.get("argv") if isinstance(options, dict) else None
    argv = [str(a) for a in argv] if isinstance(argv, list) else []
    return Run(
        path.name,
        started_at,
        git_sha=str(data.get("git_sha") or ""),
        mode=str(data.get("mode") or ""),
        environment=environment if isinstance(environment, dict) else {},
        cells=cells,
        error="" if cells else "no cells",
        dirty=bool(data.get("git_dirty")),
        finished=bool(data.get("finished_at")),
        subset=any(a.split("=")[0] in ("--cells", "--arms") for a in argv),
        arms=tuple(report.arms_of(data)),
        # Computed once per file version (the cache below), so a page view does no parsing.
        rows=tuple(report.rows(data)) if cells else (),
        notes=tuple(report.notes(data)),
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


@dataclass(frozen=True)
class Lead:
    """The run the page's table shows, and why that one."""

    run: Run
    why: str
    newer: int  # runs with a table started after it


def lead(runs: list[Run], wanted: str | None = None) -> Lead | None:
    """The run named `wanted` if it has a table; else the newest full run of the whole matrix
    (finished, not a --cells/--arms subset: the answer to "how does ox compare"); else the newest
    full-size run; else the newest run. `runs` oldest first, as load_runs() returns them."""
    usable = [r for r in reversed(runs) if r.rows]
    choices = [
        (lambda r: r.file == wanted, "the run picked"),
        (lambda r: r.full and r.finished and not r.subset, "the newest full run of the whole matrix"),
        (lambda r: r.full, "no full run of the whole matrix: the newest full-size run"),
        (lambda r: True, "no full run: the newest run"),
    ]
    for test, why in choices:
        for n, run in enumerate(usable):
            if test(run):
                return Lead(run, why, n)
    return None


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

    @property
    def family(self) -> str:
        return family(self.name, self.db)


def charts(runs: list[Run], metric: str | None = None) -> list[MetricChart]:
    """One chart per (cell, metric, unit, db), only `metric`'s when given: a line per arm across
    the runs that measured it."""
    keys: dict[tuple[str, str, str, str], Cell] = {}
    for run in runs:
        for cell in run.cells:
            if metric is None or cell.metric == metric:
                keys.setdefault(cell.key, cell)
    by_run = [(run, {c.key: c for c in run.cells}) for run in runs]
    found = []
    for key, first in keys.items():
        measured = [(run, cells[key]) for run, cells in by_run if key in cells]
        arms = sorted({arm for _, cell in measured for arm in cell.values}, key=lambda a: (a != OURS, a))
        series = []
        for arm in arms:
            data = [cell.values.get(arm) for _, cell in measured]
            series.append({"label": arm, "data": data, "color": arm_color(arm), "ours": arm == OURS})
        labels = [run.label for run, _ in measured]
        found.append(MetricChart(*key, first.about, first.higher_is_better, labels, series))
    return found


def metrics(runs: list[Run]) -> list[tuple[str, int]]:
    """Every metric with how many charts it has, most charted first: the picker's choices (a
    cell that names no metric is in the table, not in a chart)."""
    keys = {cell.key for run in runs for cell in run.cells if cell.metric}
    counts: dict[str, int] = {}
    for _, metric, _, _ in keys:
        counts[metric] = counts.get(metric, 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


# A cell's family from its name (the plan's naming: bench/plan*.py); the first rule that matches
# wins, so sqlite_/mariadb_ cells go with their database and unique_enqueue with flow control.
FAMILY_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("MariaDB", ("mariadb_",)),
    ("SQLite", ("sqlite_",)),
    ("Flow control", ("limit_", "unique_")),
    ("Workflow", ("workflow_", "progress_")),
    ("Enqueue", ("enqueue", "bulk_")),
    ("Kill / crash", ("kill",)),
    ("Dispatch", ("dispatch",)),
    ("Backlog", ("backlog_",)),
    ("Scaling", ("procs_",)),
    ("NOTIFY", ("notify_",)),
    ("Workloads", ("cpu_bound", "io_bound", "mixed_")),
    ("Drain", ("drain_",)),
)
FAMILY_DATABASES = {"mariadb": "MariaDB", "sqlite": "SQLite"}
OTHER = "Other"
# Reading order of the sections: the everyday paths first, the other databases last.
FAMILY_ORDER = [
    "Enqueue",
    "Drain",
    "Dispatch",
    "Kill / crash",
    "Workloads",
    "Backlog",
    "Scaling",
    "NOTIFY",
    "Flow control",
    "Workflow",
    "SQLite",
    "MariaDB",
    OTHER,
]


def family(name: str, db: str = "") -> str:
    if db in FAMILY_DATABASES:
        return FAMILY_DATABASES[db]
    for label, prefixes in FAMILY_RULES:
        if name.startswith(prefixes):
            return label
    return OTHER


def grouped(found: list[MetricChart]) -> list[tuple[str, list[MetricChart]]]:
    """Charts by family, in FAMILY_ORDER, each family's in the order first measured."""
    groups: dict[str, list[MetricChart]] = {}
    for chart in found:
        groups.setdefault(chart.family, []).append(chart)
    return sorted(groups.items(), key=lambda item: FAMILY_ORDER.index(item[0]))
