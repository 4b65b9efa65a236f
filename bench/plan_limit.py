"""Where the limit arm stands in the matrix (bench.plan): the cells it runs, and for every other
cell why not. Pure data, like bench.plan_pgqueuer.

The limit is the bound, not a competitor (bench/README.md, "The limit"): bare psycopg SQL with no
framework. It runs where a bound exists and is worth having: the sequential enqueue (one INSERT
per commit) and the no-op drains (one claim UPDATE and one completion UPDATE per batch). A cell
it could bound but has no job for says "not run yet"; one where a bare loop bounds nothing (it has
no wake-up, no rescue, no limits of its own) says "cannot run" and why.

It joins a cell after pgqueuer and procrastinate and before oban, dj-queue and celery (bench.plan
applies with_limit between them); the harness orders every table by bench.arms.ARM_NAMES, where
the limit comes last.
"""

from dataclasses import replace

from bench.arms import DJANGO_ARMS
from bench.plan import Cell

LIMIT = "limit"
RUNS = frozenset({"enqueue_seq", "drain_c1", "drain_c4"})

POSTGRES_ONLY = (
    "cannot run: the limit is bare PostgreSQL SQL on psycopg (FOR UPDATE SKIP LOCKED); it has no SQLite or MariaDB form"
)
REASONS: dict[str, str] = {
    "enqueue_atomic": (
        "not run yet: its bound would be the same INSERT inside the caller's transaction (BEGIN, INSERT,"
        " COMMIT); that job is not written yet"
    ),
    "bulk_enqueue": (
        "not run yet: its bound would be one multi-row INSERT (or COPY) per call; that job is not written yet"
    ),
    "dispatch": (
        "cannot run: the bare loop has no wake-up (no LISTEN/NOTIFY; it polls every 0.1 s when idle), so its"
        " enqueue-to-start latency would measure a chosen poll interval, not a limit"
    ),
    "kill": (
        "cannot run: the bare loop has no lease and no rescue (a killed worker's claimed rows stay"
        " 'running'), so there is no recovery to bound"
    ),
    "drain_p4": (
        "not run yet: these cells vary Django's connection handling, which the bare loop does not use (one"
        " persistent psycopg connection per loop); one cell, 4 processes x 1 loop, would stand for all three"
    ),
    "workload": (
        "not run yet: a task that takes time is bounded by the task; the bare loop runs only the no-op so far"
    ),
    "backlog": (
        "not run yet: the bare claim over a large backlog would bound these cells; needs a fast fill and the"
        " first-n reading (fill_fast, first_n), not written yet"
    ),
    "ox_only": (
        "cannot run: an ox-only cell (ox against itself: its limits, unique tasks, workflows, NOTIFY trigger,"
        " or its claim at 1..16 processes); a bare loop has none of these to bound"
    ),
}


def reason(cell: Cell) -> str | None:
    """Why the limit does not run the cell, or None when it does."""
    if cell.name in RUNS:
        return None
    if cell.db != "pg":
        return POSTGRES_ONLY
    if cell.arms and not set(cell.arms) & set(DJANGO_ARMS):
        return f"cannot run: a {', '.join(cell.arms)}-only cell"
    if cell.arms == ("ox",):
        return REASONS["ox_only"]
    name = cell.name
    if name in REASONS:
        return REASONS[name]
    if name.startswith("drain_p4_"):
        return REASONS["drain_p4"]
    if cell.params.get("task", "noop") != "noop":
        return REASONS["workload"]
    if name.startswith("backlog_"):
        return REASONS["backlog"]
    return "not run yet: no limit job for this cell"


def with_limit(cells: list[Cell]) -> list[Cell]:
    """The plan with the limit added to the cells it runs, its reason on every other."""
    out = []
    for cell in cells:
        why = reason(cell)
        if why is None:
            out.append(replace(cell, arms=(*cell.arms, LIMIT)))
        else:
            out.append(replace(cell, cannot_run={**cell.cannot_run, LIMIT: why}))
    return out
