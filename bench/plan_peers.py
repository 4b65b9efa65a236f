"""Where the oban, dj-queue and celery arms stand in the matrix (bench.plan): the cells each runs,
and for every other cell why not. Pure data, like bench.plan_pgqueuer and bench.plan_procrastinate.

Issue 14 gives these three peers the enqueue, drain, dispatch and kill cells first; a cell one
could run but has no job for yet says "not run yet", one it cannot run says "cannot run" and why.
"""

from collections.abc import Callable
from dataclasses import replace

from bench.arms import DJANGO_ARMS
from bench.plan import Cell

OBAN, DJQUEUE, CELERY = "oban", "dj-queue", "celery"
PEERS = (OBAN, DJQUEUE, CELERY)
RUNS = frozenset({"enqueue_seq", "drain_c1", "drain_c4", "dispatch", "kill"})

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
    "enqueue_atomic": (
        "not run yet: oban enqueues inside the caller's transaction (enqueue(conn=...) on an async psycopg"
        " connection); that job is not written yet"
    ),
    "bulk_enqueue": (
        "not run yet: oban's enqueue_many() is one INSERT per job on one connection (bulk inserts are Oban"
        " Pro's); that job is not written yet"
    ),
    "drain_p4": (
        "not run yet: these cells vary Django's connection handling, which oban's workers do not use (their"
        " own psycopg pool); one oban cell (4 processes at default:1) would stand for all three"
    ),
    "workload": "not run yet: needs the workload workers (oban runs async process() methods), not written yet",
    "backlog": "not run yet: needs a fast fill of oban_jobs (one enqueued row copied by INSERT ... SELECT)",
    "flow": (
        "cannot run: the cell compares ox with and without its LIMITS / unique tasks, ox against itself; global"
        " limits and unique jobs are Oban Pro features"
    ),
}

DJQUEUE_REASONS: dict[str, str] = {
    "enqueue_atomic": "not run yet: the shared job would run (task.enqueue() in atomic()); not validated yet",
    "bulk_enqueue": "not run yet: the shared job would run (backend.enqueue_all()); not validated yet",
    "drain_p4": "not run yet: the shared drain at 4 processes x 1 thread; not validated yet",
    "workload": "not run yet: the shared workload tasks would run (a Django Tasks backend); not validated yet",
    "backlog": (
        "not run yet: needs a fast fill that writes dj_queue_ready_executions along with dj_queue_jobs"
        " (the shared fill_fast copies one table)"
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
    "bulk_enqueue": (
        "not run yet: celery has no bulk publish (group().apply_async() sends one message per task); not written"
    ),
    "drain_p4": (
        "not run yet: these cells vary Django's connection handling, which celery's queue does not use;"
        " one celery cell (4 workers at --concurrency 1) would stand for all three"
    ),
    "workload": "not run yet: needs the workload tasks as celery tasks, not written yet",
    "backlog": "not run yet: needs a fast fill of the Redis list (one message copied), not written yet",
    "flow": (
        "cannot run: the cell compares ox with and without its LIMITS / unique tasks, ox against itself;"
        " celery's rate_limit is per worker and would need a cell of its own"
    ),
}


def _reason(cell: Cell, peer: str, reasons: dict[str, str], other_db: Callable[[Cell], str]) -> str | None:
    if cell.name in RUNS:
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
    if cell.params.get("task", "noop") != "noop":
        return reasons["workload"]
    if name.startswith("backlog_"):
        return reasons["backlog"]
    if name.startswith("procs_"):
        return COMMON["procs"]
    if name.startswith("notify_"):
        return COMMON["notify"]
    return f"not run yet: no {peer} job for this cell"


def _djqueue_other_db(cell: Cell) -> str:
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
