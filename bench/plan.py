"""The benchmark matrix: which cells run, at what size, in quick and full mode. Pure data (no
Django), so the harness, the report and the tests can all read it."""

from dataclasses import dataclass, field
from typing import Any

from bench.arms import ARM_NAMES


@dataclass(frozen=True)
class Metric:
    key: str  # the job result key holding the samples
    name: str  # the metric's name in the results file
    unit: str
    higher_is_better: bool
    stat: str = "median"  # median | p50 | p95 | p99 | max | sum (over every sample kept)


@dataclass(frozen=True)
class Cell:
    name: str
    job: str
    about: str
    metrics: tuple[Metric, ...]
    params: dict[str, Any] = field(default_factory=dict)
    reps: int = 1
    db: str = "pg"  # pg | sqlite
    arms: tuple[str, ...] = ARM_NAMES
    timeout: float = 900.0  # seconds the harness gives one agent job


THROUGHPUT = Metric("throughput", "throughput", "tasks/s", True)
DRAIN_METRICS = (
    THROUGHPUT,
    Metric("cpu_ms_per_task", "cpu_per_task", "ms", False),
    Metric("peak_rss_mb", "peak_rss", "MiB", False),
    Metric("statements_per_task", "statements_per_task", "stmts", False),
)
LATENCY = tuple(Metric("latency_ms", f"latency_{q}", "ms", False, q) for q in ("p50", "p95"))
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
            "idle worker: enqueue commit -> task start, random pause of 0..1 s between samples",
            (
                *LATENCY,
                Metric("latency_ms", "latency_p99", "ms", False, "p99"),
                Metric("idle_cpu_pct", "idle_cpu", "% of a core", False),
            ),
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
    return cells
