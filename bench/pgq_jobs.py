"""The pgqueuer arm's jobs (bench.arms.pgqueuer.PgqueuerArm.job_overrides), run in its agent
like bench.jobs. Where pgqueuer differs from a Django backend they have their own code: the
schema is installed with `pgq install`, and enqueues go through pgqueuer's SyncQueries on a
psycopg connection of their own (what a synchronous web process using pgqueuer does). The drain,
backlog and kill cells run the shared jobs unchanged, through the arm's fill / fill_fast /
counts / first_n / running_on."""

import os
import subprocess
import sys
import time
from typing import Any

from django.db import connection

from bench import jobs
from bench.arms.pgqueuer import PgqueuerArm
from bench.fleet import REPO
from bench.peer_jobs import dispatch_with
from bench.producer import Calls
from bench.tasks import noop

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


def enqueue_atomic(arm: PgqueuerArm, p: Params) -> Result:
    """What ox's enqueue_atomic measures (`with atomic(): noop.enqueue()`, commit included),
    pgqueuer's way: a transaction on the application's psycopg connection (autocommit, as
    pgqueuer's SyncPsycopgDriver requires; `conn.transaction()` sends BEGIN and COMMIT) with
    SyncQueries.enqueue over that same connection inside it: BEGIN, the enqueue statement,
    COMMIT. Like ox's job, nothing else is written in the transaction."""
    jobs._reset(arm)
    n = p["n"]
    queries, conn = _queries()
    samples = []
    try:
        for _ in range(n):
            started = time.perf_counter()
            with conn.transaction():
                queries.enqueue("noop", None)
            samples.append((time.perf_counter() - started) * 1000)
    finally:
        conn.close()
    written = arm.counts().get("queued", 0)
    if written != n:
        raise RuntimeError(f"{written} queued jobs after {n} enqueues")
    return {"latency_ms": samples, "info": {"n": n, "path": "conn.transaction(): SyncQueries.enqueue"}}


def bulk(arm: PgqueuerArm, p: Params) -> Result:
    """N no-op jobs in one call of pgqueuer's bulk path, SyncQueries.enqueue with lists (one
    statement: UNNEST of the lists, the queue rows and their `queued` log rows), on its own
    autocommit psycopg connection as enqueue_seq; the lists are built inside the timing, as
    the other arms' bulk calls build their rows from the calls."""
    from bench.pgq_worker import encode

    jobs._reset(arm)
    n = p["n"]
    calls = [((), {})] * n
    name = arm.entrypoint(noop)
    queries, conn = _queries()
    try:
        started = time.perf_counter()
        queries.enqueue([name] * len(calls), [encode(list(a), dict(k)) for a, k in calls], [0] * len(calls))
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    if arm.done() != 0 or arm.counts().get("queued", 0) != n:
        raise RuntimeError("bulk enqueue did not write the expected rows")
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed, "path": arm.bulk_path}}


def drain(arm: PgqueuerArm, p: Params) -> Result:
    """The shared drain job; each worker's pgqueuer settings for the cell's concurrency are
    bench.pgq_worker.limits(concurrency, processes), recorded in the result. A workload cell's
    workers also register its entrypoint (bench.pgq_workloads)."""
    from bench.pgq_worker import limits
    from bench.pgq_workloads import WORKLOADS

    arm.processes = p["processes"]
    task = p.get("task", "noop")
    arm.workload = task if task in WORKLOADS else None
    result = jobs.drain(arm, p)
    result["info"]["pgqueuer_settings"] = limits(p["concurrency"], p["processes"])
    if arm.workload:
        result["info"]["pgqueuer_entrypoint"] = (
            "async def awaiting asyncio.sleep" if task == "io_bound_async" else "async def: asyncio.to_thread(body)"
        )
    return result


def backlog(arm: PgqueuerArm, p: Params) -> Result:
    """The shared backlog job (bench.scale.backlog) with the arm's fill_fast and first_n; each
    worker's pgqueuer settings are limits(1, processes): C = 1 alone is the entrypoint's
    concurrency_limit 1, four processes are each pgqueuer's per-process floor, 2 at a time."""
    from bench import scale
    from bench.pgq_worker import limits

    arm.processes = p["processes"]
    result = scale.backlog(arm, p)
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
    """bench.jobs.dispatch with pgqueuer's enqueue (bench.peer_jobs.dispatch_with): an idle
    worker (one process at concurrency 1: bench.pgq_worker.limits); one `stamp` job enqueued
    in autocommit (committed when the call returns), then until the task's first line reads
    the clock."""
    from bench.pgq_worker import encode, limits

    arm.processes = 1
    queries, conn = _queries()
    try:
        return dispatch_with(
            arm, p, lambda key: queries.enqueue("stamp", encode([key], {})), {"pgqueuer_settings": limits(1, 1)}
        )
    finally:
        conn.close()


def producer() -> Calls:
    """An enqueue_p* producer's enqueue (bench.producer): enqueue_seq's call, `SyncQueries.enqueue("noop",
    None)` on a psycopg connection of the producer's own, autocommit (one statement each)."""
    queries, conn = _queries()
    return Calls(lambda: queries.enqueue("noop", None), 'SyncQueries.enqueue("noop", None)', conn.close)
