"""The procrastinate arm's jobs (bench.arms.procrastinate.ProcrastinateArm.job_overrides), run in
its agent like bench.jobs. The schema needs no job of its own: the shared setup's `migrate` is
procrastinate's documented way for Django. Enqueues are procrastinate's `task.defer()` (its
tasks take keywords) on the contrib's DjangoConnector, i.e. Django's connection, as a Django view
using procrastinate enqueues; enqueue_atomic and bulk are bench.jobs' with `defer()` /
`batch_defer()` in place of Django Tasks' calls. The drain (the workload cells too) and kill cells
run the shared jobs unchanged, through the arm's fill / counts / running_on, once the arm knows the
run's log dir (where each worker writes its procrastinate worker id); the backlog cells run
bench.scale.backlog as it is, through the arm's fill_fast / first_n."""

import time
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from bench import jobs
from bench.arms.procrastinate import ProcrastinateArm
from bench.peer_jobs import dispatch_with
from bench.producer import Calls

Params = dict[str, Any]
Result = dict[str, Any]


def _prepare(arm: ProcrastinateArm, p: Params) -> None:
    arm.log_dir = Path(p["log_dir"])
    arm.seen.clear()


def enqueue_seq(arm: ProcrastinateArm, p: Params) -> Result:
    """N sequential `noop.defer()` calls in autocommit (each one statement on Django's
    connection: procrastinate_defer_jobs_v1)."""
    from bench.procrastinate_tasks import noop

    jobs._reset(arm)
    n = p["n"]
    started = time.perf_counter()
    for _ in range(n):
        noop.defer()
    elapsed = time.perf_counter() - started
    written = arm.counts().get("todo", 0)
    if written != n:
        raise RuntimeError(f"{written} todo jobs after {n} defers")
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed, "path": "task.defer()"}}


def enqueue_atomic(arm: ProcrastinateArm, p: Params) -> Result:
    """bench.jobs.enqueue_atomic with procrastinate's defer: the latency of `with atomic():
    noop.defer()`, commit included (the contrib's DjangoConnector writes on Django's connection,
    so the job commits with the block, as in a view)."""
    from bench.procrastinate_tasks import noop

    jobs._reset(arm)
    n = p["n"]
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        with transaction.atomic():
            noop.defer()
        samples.append((time.perf_counter() - started) * 1000)
    written = arm.counts().get("todo", 0)
    if written != n:
        raise RuntimeError(f"{written} todo jobs after {n} defers")
    return {"latency_ms": samples, "info": {"n": n, "path": "with atomic(): task.defer()"}}


def bulk(arm: ProcrastinateArm, p: Params) -> Result:
    """bench.jobs.bulk: N no-argument calls in one `noop.batch_defer(*kwargs)` (one statement,
    procrastinate_defer_jobs_v1 over an array of N jobs) in autocommit, as a caller without a
    transaction of its own runs it."""
    from bench.tasks import noop

    jobs._reset(arm)
    n = p["n"]
    started = time.perf_counter()
    arm.bulk_enqueue(noop, [((), {})] * n)
    elapsed = time.perf_counter() - started
    counts = arm.counts()
    if counts != {"todo": n}:
        raise RuntimeError(f"bulk enqueue of {n} left {counts}")
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed, "path": arm.bulk_path}}


def drain(arm: ProcrastinateArm, p: Params) -> Result:
    """The shared drain job: one worker at --concurrency C."""
    _prepare(arm, p)
    return jobs.drain(arm, p)


def kill(arm: ProcrastinateArm, p: Params) -> Result:
    """The shared kill job: W workers at --concurrency 1. A worker killed holding a job leaves
    it `doing` until procrastinate's documented retry_stalled_jobs periodic task (cron in
    bench.procrastinate_tasks) runs and finds its worker's heartbeat older than 30 s."""
    from bench.procrastinate_tasks import DOCS_RETRY_CRON

    _prepare(arm, p)
    result = jobs.kill(arm, p)
    # The workers' schedule: set through the cell's worker_env, not this agent's environment.
    cron = p.get("worker_env", {}).get("BENCH_PROCRASTINATE_RETRY_CRON") or DOCS_RETRY_CRON
    result["info"]["retry_stalled_jobs_cron"] = cron
    with connection.cursor() as cursor:
        # When the retry task ran, and what it retried: its jobs and its effect on the counts.
        cursor.execute(
            "SELECT j.status::text, min(e.at), max(e.at), count(*) FROM procrastinate_jobs j"
            " JOIN procrastinate_events e ON e.job_id = j.id AND e.type = 'started'"
            " WHERE j.task_name LIKE %s GROUP BY 1",
            ["%retry_stalled_jobs"],
        )
        result["info"]["retry_stalled_jobs_runs"] = [
            {"status": s, "first_start": str(a), "last_start": str(b), "runs": c} for s, a, b, c in cursor.fetchall()
        ]
        # A stalled job put back to todo by retry_job() gets a deferred_for_retry event (attempts
        # would not tell: finishing a job increments it too).
        cursor.execute("SELECT count(DISTINCT job_id) FROM procrastinate_events WHERE type = 'deferred_for_retry'")
        result["info"]["jobs_retried"] = cursor.fetchone()[0]
    return result


def dispatch(arm: ProcrastinateArm, p: Params) -> Result:
    """bench.jobs.dispatch with procrastinate's defer (bench.peer_jobs.dispatch_with):
    `stamp.defer(key=...)` in `atomic()`, committed, then until the task's first line reads
    the clock."""
    from bench.procrastinate_tasks import stamp

    _prepare(arm, p)

    def enqueue(key: int) -> None:
        with transaction.atomic():
            stamp.defer(key=key)

    return dispatch_with(arm, p, enqueue, {})


def producer() -> Calls:
    """An enqueue_p* producer's enqueue (bench.producer): enqueue_seq's call, `noop.defer()` in
    autocommit on the producer's Django connection (one procrastinate_defer_jobs_v1 statement)."""
    from bench.procrastinate_tasks import noop

    return Calls(noop.defer, "task.defer()")
