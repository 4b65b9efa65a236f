"""Where the pgqueuer arm stands in the matrix (bench.plan): the cells it runs, and for every
other cell why not. Pure data, like bench.plan.

pgqueuer is not a Django Tasks backend and runs on PostgreSQL only. It runs every PostgreSQL
cell of the shared matrix but the ox-only ones (RUNS); a cell it cannot run says "cannot run"
and why, and one it could run but has no job for would say "not run yet".
"""

from dataclasses import replace

from bench.plan import DRAIN_METRICS, KILL_METRICS, PERSISTENT, SIZES, WORKLOADS, Cell
from bench.plan_scale import DRAIN_CELLS, ENQUEUE_CELLS

PGQUEUER = "pgqueuer"
# The shared cells bench.pgq_jobs runs for pgqueuer (besides its own two, own_cells): the
# enqueue cells, the drains (the workload cells with bench.pgq_workloads' entrypoints), the
# PostgreSQL backlog cells (bench.arms.pgqueuer fill_fast / first_n), dispatch and kill.
WORKLOAD_CELLS = frozenset(f"{w}_c{c}" for w in WORKLOADS for c in (1, 4))
BACKLOG_CELLS = frozenset(f"backlog_{size}_{shape}" for size in SIZES for shape in ("c1", "p4"))
# enqueue_p*: its producers' SyncQueries.enqueue (bench.pgq_jobs.producer); drain_p2/_p8: as
# drain_p4_conn600, each process at pgqueuer's per-process floor (2 at a time).
RUNS = frozenset(
    {"enqueue_seq", "enqueue_atomic", "bulk_enqueue", "drain_c1", "drain_c4", "drain_p4_conn600", "dispatch", "kill"}
    | WORKLOAD_CELLS
    | BACKLOG_CELLS
    | set(ENQUEUE_CELLS + DRAIN_CELLS)
)

POSTGRES_ONLY = (
    "cannot run: pgqueuer is PostgreSQL only (claims with FOR UPDATE SKIP LOCKED, wakes on"
    " LISTEN/NOTIFY; its drivers are asyncpg and psycopg)"
)
REASONS: dict[str, str] = {
    "drain_p4": (
        "cannot run: these three cells vary Django's connection handling (CONN_MAX_AGE 0 / 600, Django's"
        " pool), which pgqueuer's workers do not use (one psycopg connection each): for pgqueuer the three"
        " are one measurement, run once as drain_p4_conn600"
    ),
    "compose": (
        "cannot run: the cell compares ox with and without its task metadata saves / ox.chain"
        " workflows, ox against itself"
    ),
    "procs": "cannot run: an ox-only series (ox's claim at 1..16 processes with database-side figures)",
    "notify": (
        "cannot run: the cell switches ox's own NOTIFY trigger (ox_task_notify) on and off around ox"
        " enqueues; pgqueuer's trigger is another design, which a cell of its own would have to measure"
    ),
    "flow": (
        "cannot run: the cell compares ox with and without ox's LIMITS / unique tasks, ox against"
        " itself; pgqueuer's entrypoint concurrency_limit and dedupe_key are other features that"
        " would need cells of their own"
    ),
}


def reason(cell: Cell) -> str | None:
    """Why pgqueuer does not run the cell, or None when it does."""
    if cell.name in RUNS:
        return None
    if cell.db != "pg":
        return POSTGRES_ONLY
    name = cell.name
    if name in REASONS:
        return REASONS[name]
    if name.startswith("drain_p4_"):
        return REASONS["drain_p4"]
    if name == "progress_metadata" or name.startswith("workflow_chain_"):
        return REASONS["compose"]
    if "variants" in cell.params:
        return REASONS["flow"]
    if name.startswith("procs_"):
        return REASONS["procs"]
    if name.startswith("notify_"):
        return REASONS["notify"]
    return "not run yet: no pgqueuer job for this cell"


def own_cells(cells: list[Cell]) -> list[Cell]:
    """Two cells of pgqueuer's that put its figures of the shared cells in context:

    - drain_defaults: drain_c1's backlog, one worker of each at its own defaults, side by side:
      ox's `runworker` with no flags (one thread for sync tasks, 100 async slots, a prefetch of
      up to 100 claimed ahead) and pgqueuer.run()'s with no concurrency limit at all (batch_size
      10 per dequeue, every picked job runs at once as an asyncio task): each as installed, where
      drain_c1 / drain_c4 hold pgqueuer to 1 / 4 at a time (bench.pgq_worker.limits).
    - kill_pgq_recovery: the kill cell, but waiting up to 40 s without progress (the kill cell: 5 s
      quick, 20 s full) so that pgqueuer's recovery, a re-pick once a dead worker's heartbeat is
      older than heartbeat_timeout (30 s by default), falls inside the measurement.
    """
    by_name = {c.name: c for c in cells}
    out = []
    if "drain_c1" in by_name:
        drain = by_name["drain_c1"]
        out.append(
            Cell(
                "drain_defaults",
                "drain",
                "each arm at its worker's defaults: drain_c1's no-op backlog, 1 worker; ox runworker"
                " without flags (1 thread, prefetch up to 100), pgqueuer run() without a concurrency_limit"
                " (batch_size 10 per dequeue, all picked jobs run at once); the peers that join it say"
                " theirs in bench/README.md",
                DRAIN_METRICS,
                # concurrency 0: no setting at all (bench.arms.ox and bench.pgq_worker.limits)
                {**drain.params, "concurrency": 0, "worker_env": PERSISTENT},
                reps=drain.reps,
                arms=("ox", PGQUEUER),
            )
        )
    if "kill" in by_name:
        kill = by_name["kill"]
        out.append(
            Cell(
                "kill_pgq_recovery",
                "kill",
                "pgqueuer only: the kill cell waiting up to 40 s without progress (pgqueuer re-picks a dead"
                " worker's job once its heartbeat is 30 s old, heartbeat_timeout's default)",
                KILL_METRICS,
                {**kill.params, "stall": 40.0, "cap": max(kill.params["cap"], 120.0)},
                arms=(PGQUEUER,),
                timeout=kill.timeout,
            )
        )
    return out


def with_pgqueuer(cells: list[Cell]) -> list[Cell]:
    """The plan with pgqueuer added to the cells it runs, its reason on every other, and its
    own two cells (own_cells) at the end."""
    out = []
    for cell in cells:
        why = reason(cell)
        if why is None:
            out.append(replace(cell, arms=(*cell.arms, PGQUEUER)))
        else:
            out.append(replace(cell, cannot_run={**cell.cannot_run, PGQUEUER: why}))
    return out + own_cells(cells)
