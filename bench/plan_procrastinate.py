"""Where the procrastinate arm stands in the matrix (bench.plan): the cells it runs, and for every
other cell why not. Pure data, like bench.plan and bench.plan_pgqueuer.

procrastinate (issue 14, the next peer after pgqueuer) runs on PostgreSQL only. It runs every
PostgreSQL cell of the shared matrix but the ox-only ones (procs_*, notify_*, the flow cells) and
two of the three drain_p4 cells (one measurement for it); a cell it could run but has no job for
yet would say "not run yet", one it cannot run says "cannot run" and why.
"""

from dataclasses import replace

from bench.arms import DJANGO_ARMS
from bench.plan import KILL_METRICS, SIZES, WORKLOADS, Cell
from bench.plan_pgqueuer import PGQUEUER
from bench.plan_scale import DRAIN_CELLS, ENQUEUE_CELLS

PROCRASTINATE = "procrastinate"
# The shared cells procrastinate runs (bench.procrastinate_jobs, or the shared job through the
# arm), quick and full; its own cell is own_cells'. drain_p4: one of the three (REASONS).
RUNS = frozenset(
    {
        "enqueue_seq",
        "enqueue_atomic",
        "bulk_enqueue",
        "drain_c1",
        "drain_c4",
        "drain_p4_conn600",
        "drain_defaults",  # pgqueuer's own cell (bench.plan_pgqueuer); concurrency 0: no flag
        "dispatch",
        "kill",
        *(f"{w}_c{c}" for w in WORKLOADS for c in (1, 4)),
        *(f"backlog_{size}_{shape}" for size in SIZES for shape in ("c1", "p4")),
        *ENQUEUE_CELLS,  # its producers' noop.defer() (bench.procrastinate_jobs.producer)
        *DRAIN_CELLS,  # as drain_p4_conn600: each worker at --concurrency 1
    }
)
# The procrastinate-only kill cell: the retry task every minute, waits long enough to see it.
RECOVERY_CRON = "* * * * *"

POSTGRES_ONLY = (
    "cannot run: procrastinate is PostgreSQL only (its schema is PL/pgSQL functions and triggers,"
    " claims with FOR UPDATE SKIP LOCKED, wakes on LISTEN/NOTIFY)"
)
REASONS: dict[str, str] = {
    "drain_p4": (
        "cannot run: these three cells vary Django's connection handling (CONN_MAX_AGE 0 / 600, Django's"
        " pool), which procrastinate's worker does not use for the queue (its statements go through its"
        " own psycopg pool, DjangoConnector.get_worker_connector()) nor for the no-op task (no database"
        " access): for procrastinate the three are one measurement, run once as drain_p4_conn600"
    ),
    "procs": "cannot run: an ox-only series (ox's claim at 1..16 processes with database-side figures)",
    "notify": (
        "cannot run: the cell switches ox's own NOTIFY trigger (ox_task_notify) on and off around ox"
        " enqueues; procrastinate's trigger is another design, which a cell of its own would have to measure"
    ),
    "flow": (
        "cannot run: the cell compares ox with and without ox's LIMITS / unique tasks, ox against"
        " itself; procrastinate's locks and queueing locks are other features that would need cells"
        " of their own"
    ),
}


def reason(cell: Cell) -> str | None:
    """Why procrastinate does not run the cell, or None when it does."""
    if cell.name in RUNS:
        return None
    if cell.arms and not set(cell.arms) & set(DJANGO_ARMS):
        # Another peer's own cell (pgqueuer's drain_pgq_default, kill_pgq_recovery).
        return f"cannot run: a {', '.join(cell.arms)}-only cell"
    if cell.db != "pg":
        return POSTGRES_ONLY
    name = cell.name
    if name in REASONS:
        return REASONS[name]
    if name.startswith("drain_p4_"):
        return REASONS["drain_p4"]
    if "variants" in cell.params:
        return REASONS["flow"]
    if name.startswith("procs_"):
        return REASONS["procs"]
    if name.startswith("notify_"):
        return REASONS["notify"]
    return "not run yet: no procrastinate job for this cell"


def own_cells(cells: list[Cell]) -> list[Cell]:
    """kill_procrastinate_recovery: the kill cell with procrastinate's documented
    retry_stalled_jobs task deferred every minute instead of the docs' every 10th minute, and
    waiting up to 100 s without progress (kill: 5 s quick, 20 s full), at most 200 s: a dead
    worker's job is retried at the first minute after its heartbeat is 30 s old, which then
    falls inside the measurement. (With the docs' schedule the kill cell sees a retry only when
    a 10-minute mark happens to fall in its window.)"""
    by_name = {c.name: c for c in cells}
    if "kill" not in by_name:
        return []
    kill = by_name["kill"]
    env = {**kill.params.get("worker_env", {}), "BENCH_PROCRASTINATE_RETRY_CRON": RECOVERY_CRON}
    return [
        Cell(
            "kill_procrastinate_recovery",
            "kill",
            "procrastinate only: the kill cell with the documented retry_stalled_jobs periodic task every minute"
            " (docs: every 10th minute), waiting up to 100 s without progress",
            KILL_METRICS,
            {**kill.params, "stall": 100.0, "cap": max(kill.params["cap"], 200.0), "worker_env": env},
            arms=(PROCRASTINATE,),
            timeout=kill.timeout,
            # The other peer says why it is absent, as it does for every cell it does not run.
            cannot_run={PGQUEUER: f"cannot run: a {PROCRASTINATE}-only cell"},
        )
    ]


def with_procrastinate(cells: list[Cell]) -> list[Cell]:
    """The plan with procrastinate added to the cells it runs, its reason on every other, and its
    own cell (own_cells) at the end."""
    out = []
    for cell in cells:
        why = reason(cell)
        if why is None:
            out.append(replace(cell, arms=(*cell.arms, PROCRASTINATE)))
        else:
            out.append(replace(cell, cannot_run={**cell.cannot_run, PROCRASTINATE: why}))
    return out + own_cells(cells)
