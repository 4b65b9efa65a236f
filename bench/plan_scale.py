"""Scaling cells every arm runs (bench.plan adds them with `with_scale`, before the peers join):

- enqueue_p4, enqueue_p16: concurrent producers' enqueue. P producer processes, each calling the
  arm's single enqueue (what its enqueue_seq times) back to back in autocommit for a fixed window,
  all from one agreed wall-clock instant (bench.producers). Quick and full.
- drain_p2, drain_p8: the no-op drain at 2 and 8 worker processes at concurrency 1,
  CONN_MAX_AGE=600. With drain_c1 (1 process) and drain_p4_conn600 (4) they are the series 1, 2,
  4, 8 processes (`DRAIN_SERIES`), printed side by side. Full only, as drain_p4_conn600 is: eight
  worker processes on the quick plan's 500 tasks would time boots, not drains.

Pure data, like bench.plan: the peers' plan modules (bench.plan_pgqueuer, plan_procrastinate,
plan_limit, plan_peers) list these cells among the ones they run.
"""

from dataclasses import replace

from bench.plan import DRAIN_METRICS, PERSISTENT, THROUGHPUT, Cell

PRODUCERS = (4, 16)
ENQUEUE_CELLS = tuple(f"enqueue_p{k}" for k in PRODUCERS)
DRAIN_PROCESSES = (2, 8)
DRAIN_CELLS = tuple(f"drain_p{k}" for k in DRAIN_PROCESSES)
ENQUEUE_SERIES = "enqueue_producers"
DRAIN_SERIES = "drain_processes"
# The existing cells that are the series' other points: name -> worker processes.
DRAIN_POINTS = {"drain_c1": 1, "drain_p4_conn600": 4}


def enqueue_cells(quick: bool) -> list[Cell]:
    seconds = 1.5 if quick else 4.0
    reps = 1 if quick else 3
    return [
        Cell(
            f"enqueue_p{k}",
            "producers",
            f"concurrent producers' enqueue: {k} producer processes, each calling the arm's single enqueue"
            " (enqueue_seq's call: noop.enqueue(), pgqueuer's SyncQueries.enqueue, procrastinate's defer(),"
            " oban's Worker.enqueue(), celery's delay(), the limit's INSERT) back to back in autocommit for"
            f" {seconds:g} s, all from one wall-clock instant 0.5 s after every producer has booted and made"
            " one uncounted warm-up enqueue; each producer one connection of its own (the warm-up opens it,"
            " the window reuses it; no request cycle closes it, CONN_MAX_AGE=600 or not); tasks/s = enqueues"
            " finished in the window / (the start instant to the last producer's last return); the arm's"
            " table must then hold exactly those plus the warm-ups. celery: a Redis publish, not a database"
            f" commit. PostgreSQL; {reps} repetition(s)",
            (THROUGHPUT,),
            {"producers": k, "seconds": seconds, "lead": 0.5, "worker_env": PERSISTENT},
            reps=reps,
            timeout=600.0,
            series=(ENQUEUE_SERIES, "producers", k),
        )
        for k in PRODUCERS
    ]


def drain_cells(n: int) -> list[Cell]:
    return [
        Cell(
            f"drain_p{k}",
            "drain",
            f"drain a no-op backlog of {n:,}: {k} worker processes at concurrency 1 (each peer's 1 at a time,"
            " as in drain_p4_conn600: pgqueuer 2 per process, its floor), CONN_MAX_AGE=600; PostgreSQL;"
            f" with drain_c1 and drain_p4_conn600 the series 1, 2, 4, 8 processes",
            DRAIN_METRICS,
            {"n": n, "processes": k, "concurrency": 1, "worker_env": PERSISTENT},
            reps=1,
            series=(DRAIN_SERIES, "processes", k),
        )
        for k in DRAIN_PROCESSES
    ]


def with_scale(cells: list[Cell], quick: bool) -> list[Cell]:
    """The plan with enqueue_p4/_p16 after bulk_enqueue, and (full mode) drain_p2/_p8 after the
    drain_p4 cells, drain_c1 and drain_p4_conn600 then carrying the drain series' x = 1 and 4."""
    drains = [] if quick else drain_cells(next(c.params["n"] for c in cells if c.name == "drain_c1"))
    out: list[Cell] = []
    for cell in cells:
        if drains and cell.name in DRAIN_POINTS:
            cell = replace(cell, series=(DRAIN_SERIES, "processes", DRAIN_POINTS[cell.name]))
        out.append(cell)
        if cell.name == "bulk_enqueue":
            out += enqueue_cells(quick)
        if cell.name == "drain_p4_pool":
            out += drains
    missing = {c.name for c in drains} - {c.name for c in out}
    if missing:  # the anchor moved: the cells go last rather than nowhere
        out += [c for c in drains if c.name in missing]
    return out
