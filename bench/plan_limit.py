"""Where the limit arm stands in the matrix (bench.plan): the cells it runs, and for every other
cell why not. Pure data, like bench.plan_pgqueuer.

The limit is the bound, not a competitor (bench/README.md, "The limit"): bare psycopg SQL with no
framework. It runs where a bound exists and is worth having: the enqueues (one INSERT per commit,
BEGIN / INSERT / COMMIT, one COPY per bulk call), the drains (one claim UPDATE and one completion
UPDATE per batch) with the no-op and with the workloads, at 1 and 4 processes, and over deep
backlogs. A cell where a bare loop bounds nothing (it has no wake-up, no rescue, no limits of its
own, no Django connection handling) says "cannot run" and why.

It joins a cell after pgqueuer and procrastinate and before oban, dj-queue and celery (bench.plan
applies with_limit between them); the harness orders every table by bench.arms.ARM_NAMES, where
the limit comes last.
"""

from dataclasses import replace

from bench.arms import DJANGO_ARMS
from bench.plan import SIZES, WORKLOADS, Cell
from bench.plan_scale import DRAIN_CELLS, ENQUEUE_CELLS

LIMIT = "limit"
RUNS = frozenset(
    {"enqueue_seq", "enqueue_atomic", "bulk_enqueue", "drain_c1", "drain_c4", "drain_p4_conn600"}
    | {f"{workload}_c{c}" for workload in WORKLOADS for c in (1, 4)}
    | {f"backlog_{size}_{shape}" for size in SIZES for shape in ("c1", "p4")}
    # enqueue_p*: its producers' bare INSERT (bench.limit_jobs.producer); drain_p2/_p8: one loop
    # per process, batch 100, as drain_p4_conn600.
    | set(ENQUEUE_CELLS + DRAIN_CELLS)
)

POSTGRES_ONLY = (
    "cannot run: the limit is bare PostgreSQL SQL on psycopg (FOR UPDATE SKIP LOCKED); it has no SQLite or MariaDB form"
)
REASONS: dict[str, str] = {
    "dispatch": (
        "cannot run: the bare loop has no wake-up (no LISTEN/NOTIFY; it polls every 0.1 s when idle), so its"
        " enqueue-to-start latency would measure a chosen poll interval, not a limit"
    ),
    "kill": (
        "cannot run: the bare loop has no lease and no rescue (a killed worker's claimed rows stay"
        " 'running'), so there is no recovery to bound"
    ),
    "drain_p4": (
        "cannot run: these three cells vary Django's connection handling (CONN_MAX_AGE 0 / 600, Django's"
        " pool), which the bare loop does not use (one persistent psycopg connection per loop): for the"
        " limit the three are one measurement, 4 processes x 1 loop, run once as drain_p4_conn600"
    ),
    "drain_defaults": (
        "cannot run: the cell sets each arm at its worker's defaults; the bare loop has no"
        " defaults to set (one loop claiming 100 rows whatever the cell), so its figure for this backlog"
        " is drain_c1's, which it runs"
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
