"""Where the oban, dj-queue and celery arms stand in the matrix (bench.plan): the cells each runs,
and for every other cell why not. Pure data, like bench.plan_pgqueuer and bench.plan_procrastinate.

Issue 14 asks every peer in every cell it can run: RUNS holds each peer's cells (each validated by
a run beside ox); a cell one could run but has no job for yet says "not run yet", one it cannot run
says "cannot run" and why.
"""

from collections.abc import Callable
from dataclasses import replace

from bench.arms import DJANGO_ARMS
from bench.plan import SIZES, WORKLOADS, Cell
from bench.plan_scale import DRAIN_CELLS, ENQUEUE_CELLS

OBAN, DJQUEUE, CELERY = "oban", "dj-queue", "celery"
PEERS = (OBAN, DJQUEUE, CELERY)
# The cells each peer runs, validated one by one (bench/README.md, each peer's section).
FIRST = frozenset({"enqueue_seq", "drain_c1", "drain_c4", "dispatch", "kill"})
WORKLOAD_CELLS = frozenset(f"{w}_c{c}" for w in WORKLOADS for c in (1, 4))
DRAIN_P4 = frozenset({"drain_p4_conn0", "drain_p4_conn600", "drain_p4_pool"})
BACKLOG_CELLS = frozenset(f"backlog_{size}_{shape}" for size in SIZES for shape in ("c1", "p4"))
# enqueue_p4/_p16 (each peer's producer hook: bench.oban_jobs / bench.celery_jobs .producer, dj-queue
# the Django Tasks default) and drain_p2/_p8 (as drain_p4_conn600: each process 1 at a time).
SCALE_CELLS = frozenset(ENQUEUE_CELLS + DRAIN_CELLS)
RUNS: dict[str, frozenset[str]] = {
    OBAN: FIRST | {"enqueue_atomic", "bulk_enqueue", "drain_p4_conn600"} | WORKLOAD_CELLS | BACKLOG_CELLS | SCALE_CELLS,
    # A Django Tasks backend whose processes use Django's connections: the shared jobs as for django-ox.
    DJQUEUE: FIRST
    | {"enqueue_atomic", "bulk_enqueue", "drain_defaults"}
    | {"drain_p4_conn0", "drain_p4_conn600"}
    | WORKLOAD_CELLS
    | BACKLOG_CELLS
    | SCALE_CELLS
    # dj-queue runs on SQLite (polling) and MariaDB too: the cells of those databases that are not
    # ox against itself.
    | {"sqlite_drain_c1", "sqlite_backlog_10k_c1", "sqlite_backlog_1m_c1"}
    | {"mariadb_enqueue_seq", "mariadb_drain_c1", "mariadb_dispatch", "mariadb_kill"},
    # enqueue_p*: celery's delay() is a Redis publish, not a commit (said in the cell and its README).
    CELERY: FIRST
    | {"bulk_enqueue", "drain_p4_conn600", "drain_defaults"}
    | WORKLOAD_CELLS
    | BACKLOG_CELLS
    | SCALE_CELLS,
}

OBAN_POSTGRES_ONLY = (
    "cannot run: oban (Python) is PostgreSQL only (psycopg 3 pool, FOR UPDATE SKIP LOCKED, LISTEN/NOTIFY;"
    " its Elixir original has MySQL and SQLite engines, the Python port has none)"
)
CELERY_NO_SQL_QUEUE = (
    "cannot run: celery keeps its queue in its broker (Redis here), not in the database; the cell varies"
    " the database under the queue"
)

COMMON: dict[str, str] = {
    "procs": "cannot run: an ox-only series (ox's claim at 1..16 processes with database-side figures)",
    "notify": ("cannot run: the cell switches ox's own NOTIFY trigger (ox_task_notify) on and off around ox enqueues"),
}

OBAN_REASONS: dict[str, str] = {
    "drain_defaults": (
        "cannot run: an oban queue has no default limit (`oban start --queues default:N` must name one, its"
        " docs' example is 10): drain_c1 and drain_c4 are its runs at 1 and 4 at a time"
    ),
    "drain_p4": (
        "cannot run: the drain_p4_* cells vary Django's connection handling, which oban's workers do not use"
        " (their own psycopg pool); for oban the three are one measurement, run as drain_p4_conn600 (4"
        " processes at default:1)"
    ),
    "flow": (
        "cannot run: the cell compares ox with and without its LIMITS / unique tasks, ox against itself; global"
        " limits and unique jobs are Oban Pro features"
    ),
}

DJQUEUE_REASONS: dict[str, str] = {
    "drain_p4_pool": (
        "cannot run: dj-queue's default fork mode forks its worker and dispatcher from a supervisor that"
        " already holds Django's psycopg pool, and connections.close_all() before the fork returns the"
        " connections to that pool without closing it, so the processes share pooled connections: in run"
        " 20261204T222608Z they failed with psycopg ProgrammingError (\"the last operation didn't produce"
        ' records"), 2 of 10,000 tasks done in 90 s (its async mode, not the default, would be another cell)'
    ),
    "sqlite": "not run yet: dj-queue supports SQLite (polling only); the SQLite cells are not validated for it",
    "mariadb": "not run yet: dj-queue supports MariaDB; the MariaDB cells are ox and django-ox only so far",
    "flow": (
        "cannot run: the cell compares ox with and without its LIMITS / unique tasks, ox against itself;"
        " dj-queue's concurrency controls (semaphores) would need cells of their own"
    ),
}

CELERY_REASONS: dict[str, str] = {
    "enqueue_atomic": (
        "cannot run: celery's enqueue is a Redis publish, not part of the database transaction (there is no"
        " enqueue to commit with the caller's rows; transaction.on_commit() only delays the publish)"
    ),
    "drain_p4": (
        "cannot run: the drain_p4_* cells vary Django's connection handling, which celery's queue does not use"
        " (a no-op task never touches the database); for celery the three are one measurement, run as"
        " drain_p4_conn600 (4 workers at --concurrency 1)"
    ),
    "flow": (
        "cannot run: the cell compares ox with and without its LIMITS / unique tasks, ox against itself;"
        " celery's rate_limit is per worker and would need a cell of its own"
    ),
}


def _reason(cell: Cell, peer: str, reasons: dict[str, str], other_db: Callable[[Cell], str]) -> str | None:
    if cell.name in RUNS[peer]:
        return None
    if cell.arms and not set(cell.arms) & set(DJANGO_ARMS):
        return f"cannot run: a {', '.join(cell.arms)}-only cell"
    if cell.db != "pg":
        return other_db(cell)
    name = cell.name
    if name in reasons:
        return reasons[name]
    if name.startswith("drain_p4_"):
        return reasons["drain_p4"]
    if "variants" in cell.params:
        return reasons["flow"]
    if name.startswith("procs_"):
        return COMMON["procs"]
    if name.startswith("notify_"):
        return COMMON["notify"]
    return f"not run yet: no {peer} job for this cell"


def _djqueue_other_db(cell: Cell) -> str:
    if "variants" in cell.params:  # ox against itself on any database
        return DJQUEUE_REASONS["flow"]
    return DJQUEUE_REASONS["sqlite" if cell.db == "sqlite" else "mariadb"]


def reason(cell: Cell, peer: str) -> str | None:
    """Why the peer does not run the cell, or None when it does."""
    if peer == OBAN:
        return _reason(cell, peer, OBAN_REASONS, lambda _c: OBAN_POSTGRES_ONLY)
    if peer == DJQUEUE:
        return _reason(cell, peer, DJQUEUE_REASONS, _djqueue_other_db)
    return _reason(cell, peer, CELERY_REASONS, lambda _c: CELERY_NO_SQL_QUEUE)


def with_peers(cells: list[Cell]) -> list[Cell]:
    """The plan with each of the three peers added to the cells it runs, its reason on every other."""
    out = []
    for cell in cells:
        for peer in PEERS:
            why = reason(cell, peer)
            if why is None:
                cell = replace(cell, arms=(*cell.arms, peer))
            else:
                cell = replace(cell, cannot_run={**cell.cannot_run, peer: why})
        out.append(cell)
    return out
