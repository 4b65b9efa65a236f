"""The benchmark matrix: which cells run, at what size, in quick and full mode. Pure data (no
Django), so the harness, the report and the tests can all read it."""

from dataclasses import dataclass, field
from typing import Any

from bench.arms import DJANGO_ARMS


@dataclass(frozen=True)
class Metric:
    key: str  # the job result key holding the samples
    name: str  # the metric's name in the results file
    unit: str
    higher_is_better: bool
    stat: str = "median"  # median | p50 | p95 | p99 | min | max | sum (over every sample kept)


@dataclass(frozen=True)
class Cell:
    name: str
    job: str
    about: str
    metrics: tuple[Metric, ...]
    params: dict[str, Any] = field(default_factory=dict)
    reps: int = 1
    db: str = "pg"  # pg | sqlite | mariadb
    arms: tuple[str, ...] = DJANGO_ARMS
    timeout: float = 900.0  # seconds the harness gives one agent job
    # (series, axis, x): cells of one series are also printed side by side, each over the
    # series' smallest x (e.g. ("backlog_c1", "backlog", 100_000): throughput at 100k / 10k).
    series: tuple[str, str, int] | None = None
    # arm -> why it does not run this cell ("cannot run: ..." or "not run yet: ..."), for arms
    # outside `arms`: the harness reports it instead of leaving the arm silently missing.
    cannot_run: dict[str, str] = field(default_factory=dict)


THROUGHPUT = Metric("throughput", "throughput", "tasks/s", True)
DRAIN_METRICS = (
    THROUGHPUT,
    Metric("cpu_ms_per_task", "cpu_per_task", "ms", False),
    Metric("peak_rss_mb", "peak_rss", "MiB", False),
    Metric("statements_per_task", "statements_per_task", "stmts", False),
)
LATENCY = tuple(Metric("latency_ms", f"latency_{q}", "ms", False, q) for q in ("p50", "p95"))
DISPATCH_METRICS = (
    *LATENCY,
    Metric("latency_ms", "latency_p99", "ms", False, "p99"),
    Metric("idle_cpu_pct", "idle_cpu", "% of a core", False),
    # VmRSS of the idle worker and its descendants at the end of idle_s, before any sample.
    Metric("idle_rss_mb", "idle_rss", "MiB", False),
)
KILL_METRICS = (
    Metric("finished", "finished", "tasks", True, "sum"),
    Metric("stuck", "stuck", "tasks", False, "sum"),
    Metric("run_twice", "run_twice", "tasks", False, "sum"),
    Metric("not_rescued", "not_rescued", "tasks", False, "sum"),
    Metric("rescue_s", "rescue_p50", "s", False, "p50"),
    Metric("rescue_s", "rescue_max", "s", False, "max"),
    Metric("reclaim_s", "reclaim_p50", "s", False, "p50"),
    Metric("reclaim_s", "reclaim_max", "s", False, "max"),
)
# Workers get persistent connections unless a cell says otherwise: with Django's default
# CONN_MAX_AGE=0 a worker built on Django's connection handling reconnects for every task,
# which the connection-policy cells measure on their own (the published reports match
# connection settings before comparing anything else).
PERSISTENT = {"BENCH_CONN_MAX_AGE": 600}
POLICIES = {"conn0": {"BENCH_CONN_MAX_AGE": 0}, "conn600": PERSISTENT, "pool": {"BENCH_POOL": 1}}
WORKLOADS = ("cpu_bound", "io_bound", "io_bound_async", "mixed")


DB_METRICS = (
    Metric("pg_cpu_ms_per_task", "pg_cpu_per_task", "ms", False),
    Metric("xact_per_task", "xact_per_task", "xacts", False),
    Metric("wal_records_per_task", "wal_records_per_task", "records", False),
    Metric("wal_bytes_per_task", "wal_bytes_per_task", "bytes", False),
    Metric("lock_wait_share", "lock_wait_share", "share", False),
    Metric("active_backends", "active_backends", "backends", False),
)
NOTIFY_METRICS = (
    Metric("throughput_on", "throughput_notify_on", "tasks/s", True),
    Metric("throughput_off", "throughput_notify_off", "tasks/s", True),
    Metric("on_off_ratio", "notify_on_off", "on/off", True),
    # LISTENing backends seen at the start of every round (the idle worker's): 1 expected.
    Metric("listeners", "listening_workers", "backends", True, "min"),
)
SIZES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000}
IDLE_QUEUE_ENV = {**PERSISTENT, "BENCH_QUEUES": "default,bench_idle"}


def backlog_cells(quick: bool) -> list[Cell]:
    """Drain N no-op tasks out of a READY backlog of 10k / 100k / 1M (quick: 2,000 out of 10k
    and 100k, one process only), PostgreSQL; SQLite at 10k and 1M (full only)."""
    n = 2000 if quick else 10_000
    cap = 60.0 if quick else 240.0
    shapes = {"c1": 1} if quick else {"c1": 1, "p4": 4}
    sizes = ("10k", "100k") if quick else ("10k", "100k", "1m")
    cells = []
    for db, prefix, db_sizes in (("pg", "", sizes), ("sqlite", "sqlite_", () if quick else ("10k", "1m"))):
        for shape, processes in shapes.items():
            if db == "sqlite" and shape != "c1":
                continue
            for size in db_sizes:
                total = SIZES[size]
                cells.append(
                    Cell(
                        f"{prefix}backlog_{size}_{shape}",
                        "backlog",
                        f"drain the first {n:,} no-op tasks of a {total:,}-task READY backlog"
                        f"{' on SQLite' if db == 'sqlite' else ''}: {processes} worker process(es),"
                        f" concurrency 1, CONN_MAX_AGE=600; capped at {cap:.0f} s",
                        DRAIN_METRICS,
                        {
                            "n": min(n, total),
                            "total": total,
                            "processes": processes,
                            "concurrency": 1,
                            "cap": cap,
                            "worker_env": PERSISTENT,
                        },
                        db=db,
                        series=(f"{prefix}backlog_{shape}", "backlog", total),
                    )
                )
    return cells


def scaling_cells(quick: bool) -> list[Cell]:
    """ox only: drain throughput at 1..16 worker processes with database-side figures, and
    enqueue throughput with the NOTIFY trigger on and off at 1..16 producers."""
    n = 30_000 if quick else 100_000
    cells = [
        Cell(
            f"procs_p{k}",
            "backlog",
            f"ox drain of {n:,} of a {n + n // 4:,}-task backlog: {k} worker process(es) at concurrency 1,"
            " CONN_MAX_AGE=600; with pg_stat_database / pg_stat_wal / wait-event samples / backend CPU",
            (THROUGHPUT, Metric("cpu_ms_per_task", "cpu_per_task", "ms", False), *DB_METRICS),
            {
                "n": n,
                "total": n + n // 4,
                "processes": k,
                "concurrency": 1,
                "cap": 120.0,
                "db_stats": True,
                "worker_env": PERSISTENT,
            },
            arms=("ox",),
            series=("procs", "processes", k),
        )
        for k in ((1, 2, 4) if quick else (1, 2, 4, 8, 16))
    ]
    seconds, rounds = (2.0, 4) if quick else (4.0, 8)
    cells += [
        Cell(
            f"notify_p{k}",
            "notify",
            f"ox enqueue: {k} producer process(es), sequential noop.enqueue() in autocommit for {seconds:.0f} s"
            f" per round, NOTIFY trigger off/on/on/off x{rounds // 4}; one idle ox worker LISTENing (queue bench_idle)",
            NOTIFY_METRICS,
            {"producers": k, "seconds": seconds, "rounds": rounds, "worker_env": IDLE_QUEUE_ENV},
            arms=("ox",),
            series=("notify", "producers", k),
        )
        for k in ((1, 4) if quick else (1, 4, 16))
    ]
    cells += [
        Cell(
            f"notify_p{k}_always",
            "notify",
            f"notify_p{k} with the producers' ox.notify = always (a NOTIFY at every enqueue commit, as before"
            " migration 0012, whether or not a worker waits)",
            NOTIFY_METRICS,
            {
                "producers": k,
                "seconds": seconds,
                "rounds": rounds,
                "worker_env": IDLE_QUEUE_ENV,
                "notify_mode": "always",
            },
            arms=("ox",),
            series=("notify_always", "producers", k),
        )
        for k in ((4,) if quick else (1, 4, 16))
    ]
    if not quick:
        cells.append(
            Cell(
                "notify_p4_nolisten",
                "notify",
                f"notify_p4 without the idle worker: nobody LISTENs ({seconds:.0f} s rounds, off/on/on/off"
                f" x{rounds // 4})",
                NOTIFY_METRICS,
                {"producers": 4, "seconds": seconds, "rounds": rounds, "idle_worker": False, "worker_env": PERSISTENT},
                arms=("ox",),
            )
        )
    return cells


def build(mode: str) -> list[Cell]:
    quick = mode == "quick"
    n_drain = 500 if quick else 10_000
    drain_reps = 1 if quick else 2
    cells = [
        Cell(
            "enqueue_seq",
            "enqueue_seq",
            "sequential task.enqueue() calls, autocommit, no-op task",
            (THROUGHPUT,),
            {"n": 500 if quick else 2000},
            reps=1 if quick else 3,
        ),
        Cell(
            "enqueue_atomic",
            "enqueue_atomic",
            "one `with atomic(): task.enqueue()` block, commit included",
            LATENCY,
            {"n": 200 if quick else 500},
            reps=1 if quick else 3,
        ),
        Cell(
            "bulk_enqueue",
            "bulk",
            "bulk enqueue in one call (each arm's bulk path; see info.path)",
            (THROUGHPUT,),
            {"n": 2000 if quick else 10_000},
            reps=1 if quick else 3,
        ),
        Cell(
            "drain_c1",
            "drain",
            "drain a no-op backlog: 1 worker process, concurrency 1, CONN_MAX_AGE=600",
            DRAIN_METRICS,
            {"n": n_drain, "processes": 1, "concurrency": 1, "worker_env": PERSISTENT},
            reps=drain_reps,
        ),
        Cell(
            "drain_c4",
            "drain",
            "drain a no-op backlog: 1 process at concurrency 4 (django-tasks-db: 4 processes), CONN_MAX_AGE=600",
            DRAIN_METRICS,
            {"n": n_drain, "processes": 1, "concurrency": 4, "worker_env": PERSISTENT},
            reps=drain_reps,
        ),
    ]
    if not quick:
        for policy, env in POLICIES.items():
            cells.append(
                Cell(
                    f"drain_p4_{policy}",
                    "drain",
                    f"drain a no-op backlog: 4 worker processes at concurrency 1, {policy}",
                    DRAIN_METRICS,
                    {"n": n_drain, "processes": 4, "concurrency": 1, "worker_env": env},
                    reps=1,
                )
            )
    cells.append(
        Cell(
            "dispatch",
            "dispatch",
            "idle worker: enqueue commit -> task start, random pause of 0..1 s between samples; first its CPU"
            " over idle_s seconds of an empty queue and its resident memory (VmRSS with its descendants) then",
            DISPATCH_METRICS,
            {"n": 10 if quick else 200, "gap": 1.0, "idle_s": 2.0 if quick else 5.0, "worker_env": PERSISTENT},
            timeout=900,
        )
    )
    if not quick:
        for workload in WORKLOADS:
            for concurrency in (1, 4):
                cells.append(
                    Cell(
                        f"{workload}_c{concurrency}",
                        "drain",
                        f"drain {workload} tasks: 1 process at concurrency {concurrency}"
                        " (django-tasks-db: that many processes)",
                        (THROUGHPUT, Metric("cpu_ms_per_task", "cpu_per_task", "ms", False)),
                        {
                            "n": 200,
                            "processes": 1,
                            "concurrency": concurrency,
                            "task": workload,
                            "worker_env": PERSISTENT,
                        },
                    )
                )
        cells.append(
            Cell(
                "sqlite_drain_c1",
                "drain",
                "drain a no-op backlog on SQLite (WAL): 1 worker process, concurrency 1",
                DRAIN_METRICS,
                {"n": 2000, "processes": 1, "concurrency": 1, "worker_env": PERSISTENT},
                db="sqlite",
            )
        )
    cells += backlog_cells(quick) + scaling_cells(quick)
    if not quick:
        from bench.plan_flow import flow_cells  # it builds on this module's cells and metrics

        cells += flow_cells()
    from bench.plan_mariadb import mariadb_cells  # it builds on this module's metrics

    cells += mariadb_cells(quick)
    cells.append(
        Cell(
            "kill",
            "kill",
            "SIGKILL a random worker of 2 every second while draining ledger tasks; a replacement starts each time",
            KILL_METRICS,
            {
                "n": 200 if quick else 2000,
                "workers": 2,
                "kills": 2 if quick else 20,
                "every": 1.0,
                "stall": 5.0 if quick else 20.0,
                "cap": 60.0 if quick else 300.0,
                "worker_env": PERSISTENT,
            },
            timeout=900,
        )
    )
    if not quick:
        from bench.plan_compose import compose_cells  # it builds on this module's Cell

        cells += compose_cells()
    from bench.plan_bare_row import with_bare_row  # ox only; last, so no peer overwrites its reasons
    from bench.plan_limit import with_limit  # the bound (bare SQL): it builds on this module's Cell too
    from bench.plan_peers import with_peers  # oban, dj-queue, celery: it builds on this module's Cell
    from bench.plan_pgqueuer import with_pgqueuer  # the same
    from bench.plan_procrastinate import with_procrastinate  # the same
    from bench.plan_scale import with_scale  # enqueue_p*, drain_p2/_p8 (every arm): the same

    return with_bare_row(with_peers(with_limit(with_procrastinate(with_pgqueuer(with_scale(cells, quick))))), quick)
