"""The MariaDB cells of the benchmark matrix (bench.plan): ox against django-ox, the peer that
runs on MySQL/MariaDB too."""

from bench.plan import DISPATCH_METRICS, DRAIN_METRICS, KILL_METRICS, PERSISTENT, THROUGHPUT, Cell

MARIADB_ARMS = ("ox", "django-ox")  # django-ox runs on MySQL/MariaDB too; the peer there


def mariadb_cells(quick: bool) -> list[Cell]:
    """The enqueue, drain, dispatch and kill cells on MariaDB (utf8mb4_nopad_bin, READ COMMITTED,
    oxproject's settings for every arm), ox against django-ox."""
    n = 500 if quick else 10_000
    on = " on MariaDB (READ COMMITTED, utf8mb4)"
    return [
        Cell(
            "mariadb_enqueue_seq",
            "enqueue_seq",
            f"sequential task.enqueue() calls{on}, autocommit, no-op task",
            (THROUGHPUT,),
            {"n": 500 if quick else 2000},
            reps=1 if quick else 3,
            db="mariadb",
            arms=MARIADB_ARMS,
        ),
        Cell(
            "mariadb_drain_c1",
            "drain",
            f"drain a no-op backlog{on}: 1 worker process, concurrency 1, CONN_MAX_AGE=600",
            DRAIN_METRICS,
            {"n": n, "processes": 1, "concurrency": 1, "worker_env": PERSISTENT},
            reps=1 if quick else 2,
            db="mariadb",
            arms=MARIADB_ARMS,
        ),
        Cell(
            "mariadb_dispatch",
            "dispatch",
            f"idle worker{on}: enqueue commit -> task start, random pause of 0..1 s between samples"
            " (no NOTIFY there: ox wakes its idle worker with KILL QUERY after the commit, django-ox"
            " polls at its default interval); first its CPU over idle_s seconds of an empty queue and its"
            " resident memory (VmRSS with its descendants) then",
            DISPATCH_METRICS,
            {"n": 10 if quick else 100, "gap": 1.0, "idle_s": 2.0 if quick else 5.0, "worker_env": PERSISTENT},
            timeout=900,
            db="mariadb",
            arms=MARIADB_ARMS,
        ),
        Cell(
            "mariadb_kill",
            "kill",
            f"SIGKILL a random worker of 2 every second while draining ledger tasks{on}; a replacement starts",
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
            db="mariadb",
            arms=MARIADB_ARMS,
        ),
    ]
