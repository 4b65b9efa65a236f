"""The pgqueuer arm's jobs (bench.arms.pgqueuer.PgqueuerArm.job_overrides), run in its agent
like bench.jobs. Where pgqueuer differs from a Django backend they have their own code: the
schema is installed with `pgq install`, and enqueues go through pgqueuer's SyncQueries on a
psycopg connection of their own (what a synchronous web process using pgqueuer does). The drain
and kill cells run the shared jobs unchanged, through the arm's fill / counts / running_on."""

import os
import random
import subprocess
import sys
import time
from typing import Any

from django.db import connection

from bench import jobs, procs
from bench.arms.pgqueuer import PgqueuerArm
from bench.fleet import REPO, Fleet, wait
from bench.tasks import LEDGER_TABLE

Params = dict[str, Any]
Result = dict[str, Any]


def _queries() -> Any:
    """pgqueuer's synchronous client on an autocommit psycopg connection (its documented way to
    enqueue from synchronous code). The caller closes `.driver._connection`."""
    import psycopg
    from pgqueuer.db import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    conn = psycopg.connect(os.environ["BENCH_DB_URL"], autocommit=True)
    return SyncQueries(SyncPsycopgDriver(conn)), conn


def setup(arm: PgqueuerArm, p: Params) -> Result:
    """pgqueuer's schema by its documented install (`pgq install`: durability durable, no
    prefix), then the ledger table every arm has."""
    out = subprocess.run(  # noqa: S603  (our interpreter, pgqueuer's CLI module)
        [sys.executable, "-m", "pgqueuer", "--pg-dsn", os.environ["BENCH_DB_URL"], "install"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"pgq install failed ({out.returncode}): {out.stderr.strip()}")
    with connection.cursor() as cursor:
        cursor.execute(jobs._ledger_ddl())
    result = jobs.describe(arm, p)
    result["info"]["install"] = out.stderr.strip()
    return result


def enqueue_seq(arm: PgqueuerArm, p: Params) -> Result:
    """N sequential enqueues of the no-op entrypoint, each its own autocommit statement (one
    round trip: pgqueuer writes the job and its `queued` log row in one statement)."""
    jobs._reset(arm)
    n = p["n"]
    queries, conn = _queries()
    try:
        started = time.perf_counter()
        for _ in range(n):
            queries.enqueue("noop", None)
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    written = arm.counts().get("queued", 0)
    if written != n:
        raise RuntimeError(f"{written} queued jobs after {n} enqueues")
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed, "path": "SyncQueries.enqueue"}}


def drain(arm: PgqueuerArm, p: Params) -> Result:
    """The shared drain job; each worker's pgqueuer settings for the cell's concurrency are
    bench.pgq_worker.limits(concurrency, processes), recorded in the result."""
    from bench.pgq_worker import limits

    arm.processes = p["processes"]
    result = jobs.drain(arm, p)
    result["info"]["pgqueuer_settings"] = limits(p["concurrency"], p["processes"])
    return result


def kill(arm: PgqueuerArm, p: Params) -> Result:
    """The shared kill job: W workers at concurrency 1, each capped per process
    (bench.pgq_worker.limits: max_concurrent_tasks 2, pgqueuer's floor). A worker killed
    holding jobs keeps them `picked` until their heartbeat is older than heartbeat_timeout
    (30 s by default) and another worker re-picks them; the other workers' caps are their own,
    so they drain on meanwhile."""
    from bench.pgq_worker import limits

    arm.processes = p["workers"]
    result = jobs.kill(arm, p)
    result["info"]["pgqueuer_settings"] = limits(1, p["workers"])
    return result


def dispatch(arm: PgqueuerArm, p: Params) -> Result:
    """bench.jobs.dispatch with pgqueuer's enqueue: an idle worker (one process at concurrency
    1: bench.pgq_worker.limits); enqueue one `stamp` job (autocommit: committed when the call
    returns), and measure until the task's first line reads the clock (its ledger row). A
    random pause of 0..gap seconds between samples; the idle worker's CPU over a few seconds of
    an empty queue first."""
    from bench.pgq_worker import encode, limits

    jobs._reset(arm)
    arm.processes = 1
    fleet = Fleet(arm, p)
    samples: list[float] = []
    timeouts = 0
    rng = random.Random(p.get("seed", 0))  # noqa: S311
    queries, conn = _queries()
    try:
        fleet.start_all(1, 1)
        cpu0, _ = procs.measure(fleet.procs)
        time.sleep(p.get("idle_s", 3.0))
        cpu1, _ = procs.measure(fleet.procs)
        idle_pct = (cpu1 - cpu0) * 100 / p.get("idle_s", 3.0)
        for key in range(p["n"]):
            time.sleep(rng.uniform(0, p["gap"]))
            queries.enqueue("stamp", encode([key], {}))
            committed = time.time()
            seen: list[float] = []

            def started(key: int = key, seen: list[float] = seen) -> bool:
                with connection.cursor() as cursor:
                    cursor.execute(f"SELECT t FROM {LEDGER_TABLE} WHERE task_key = %s", [key])  # noqa: S608
                    row = cursor.fetchone()
                if row:
                    seen.append(row[0])
                return bool(row)

            if wait(started, p.get("timeout", 10.0), 0.005, fleet):
                samples.append((seen[0] - committed) * 1000)
            else:
                timeouts += 1
    finally:
        conn.close()
        fleet.stop()
    info = {**fleet.info(), "n": p["n"], "timeouts": timeouts, "gap_s": p["gap"], "pgqueuer_settings": limits(1, 1)}
    return {"latency_ms": samples, "idle_cpu_pct": idle_pct, "info": info}
