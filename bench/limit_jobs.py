"""The limit arm's own jobs (bench.arms.limit.LimitArm.job_overrides), run in its agent like
bench.jobs: its schema; the enqueue cells as bare psycopg statements (enqueue_seq: an INSERT per
autocommit call; enqueue_atomic: BEGIN, INSERT, COMMIT; bulk: one COPY per call), each on a
connection opened before the clock starts; and the drain, which is bench.jobs.drain once the
workers' batch suits the cell's task. The backlog cells run bench.scale.backlog unchanged."""

import inspect
import os
import time
from typing import Any

from django.db import connection

from bench import jobs
from bench.arms.limit import LimitArm
from bench.limit_sql import ASYNC_SLOTS, BATCH, INSERT, PAYLOAD, copy_payloads, create_schema
from bench.limit_tasks import TASKS
from bench.producer import Calls
from bench.tasks import noop

Params = dict[str, Any]
Result = dict[str, Any]


def setup(arm: LimitArm, p: Params) -> Result:
    """The limit's table and index (bench.limit_sql.DDL), then the ledger table every arm has."""
    with connection.cursor() as cursor:
        create_schema(cursor)
        cursor.execute(jobs._ledger_ddl())
    return jobs.describe(arm, p)


def _check_ready(arm: LimitArm, n: int, what: str) -> None:
    counts = arm.counts()
    if counts != {"ready": n}:
        raise RuntimeError(f"{what}: {counts} after {n} enqueues, expected {n} ready rows")


def enqueue_seq(arm: LimitArm, p: Params) -> Result:
    """N INSERTs of a minimal task row, each its own autocommit transaction (one round trip, one
    durable commit), on one psycopg connection opened before the clock starts: the fastest a
    sequential durable enqueue can be on this server. psycopg prepares the statement on the
    server once it has run 5 times (prepare_threshold, its default), as it would for any
    application that keeps its connection."""
    import psycopg

    jobs._reset(arm)
    n = p["n"]
    with psycopg.connect(os.environ["BENCH_DB_URL"], autocommit=True) as conn:
        started = time.perf_counter()
        for _ in range(n):
            conn.execute(INSERT, (PAYLOAD,))
        elapsed = time.perf_counter() - started
    _check_ready(arm, n, "enqueue_seq")
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed, "path": INSERT}}


def enqueue_atomic(arm: LimitArm, p: Params) -> Result:
    """bench.jobs.enqueue_atomic's sample, bare: the latency of one transaction that enqueues,
    commit included, timed per block as that job times `with atomic(): noop.enqueue()`. The block
    is BEGIN, the INSERT of enqueue_seq, COMMIT (psycopg's conn.transaction() on an autocommit
    connection: three round trips and one durable commit, as Django's atomic() sends on its
    psycopg connection), on one connection opened before the first sample."""
    import psycopg

    jobs._reset(arm)
    n = p["n"]
    samples = []
    with psycopg.connect(os.environ["BENCH_DB_URL"], autocommit=True) as conn:
        for _ in range(n):
            started = time.perf_counter()
            with conn.transaction():
                conn.execute(INSERT, (PAYLOAD,))
            samples.append((time.perf_counter() - started) * 1000)
    _check_ready(arm, n, "enqueue_atomic")
    return {"latency_ms": samples, "info": {"n": n, "path": f"BEGIN; {INSERT}; COMMIT"}}


def bulk(arm: LimitArm, p: Params) -> Result:
    """bench.jobs.bulk, bare: N no-argument calls of the no-op enqueued by one COPY in autocommit
    (one statement, one durable commit), each call's payload built and serialised inside the
    clock, as the other arms' bulk paths serialise theirs; on a connection opened before it."""
    import psycopg

    jobs._reset(arm)
    n = p["n"]
    calls = [((), {})] * n
    with psycopg.connect(os.environ["BENCH_DB_URL"], autocommit=True) as conn:
        started = time.perf_counter()
        with conn.cursor() as cursor:
            copy_payloads(cursor, (arm.payload(noop, a, k) for a, k in calls))
        elapsed = time.perf_counter() - started
    _check_ready(arm, n, "bulk")
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed, "path": arm.bulk_path}}


def batch_for(task: str, concurrency: int) -> int:
    """Rows one claim takes for the cell's task and concurrency (C loops in the process).
    - The no-op: BATCH (100, ox's prefetch ceiling for short tasks).
    - A sync task that takes time (cpu_bound, io_bound, mixed): 1, so that each loop holds only
      the task it runs and C loops are C tasks at a time (with 100, the first two loops of a 4-loop
      worker would claim all of a 200-task backlog and leave the other two idle); it costs two
      statements per task, about a millisecond against the tasks' 20 to 100 ms.
    - An async one (io_bound_async): ASYNC_SLOTS // C, which a loop runs at once on its event loop
      (Loop.run_batch): 100 at a time in the process whatever C, as ox's runworker runs async
      tasks (--async-concurrency 100 beside --concurrency C)."""
    if task == "noop":
        return BATCH
    if inspect.iscoroutinefunction(TASKS[task]):
        return max(ASYNC_SLOTS // max(concurrency, 1), 1)
    return 1


def drain(arm: LimitArm, p: Params) -> Result:
    """bench.jobs.drain with the workers' batch set for the cell's task (batch_for)."""
    arm.batch = batch_for(p.get("task", "noop"), p.get("concurrency", 1))
    result = jobs.drain(arm, p)
    result.setdefault("info", {})["batch"] = arm.batch
    return result


def producer() -> Calls:
    """An enqueue_p* producer's enqueue (bench.producer): enqueue_seq's INSERT, one autocommit
    transaction per call, on a psycopg connection of the producer's own."""
    import psycopg

    conn = psycopg.connect(os.environ["BENCH_DB_URL"], autocommit=True)
    return Calls(lambda: conn.execute(INSERT, (PAYLOAD,)), INSERT, conn.close)
