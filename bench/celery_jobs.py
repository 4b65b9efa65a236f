"""The celery arm's jobs (bench.arms.celery.CeleryArm.job_overrides), run in its agent (on
bench/.venv-celery) like bench.jobs: enqueues are Celery's `task.delay()`, a publish to Redis that
returns once Redis has the message (no database transaction is involved, and none can include it).
The drain and kill cells run the shared jobs unchanged, through the arm's fill / counts /
running_on; the shared setup migrates the (empty) Django schema and makes the ledger."""

import time
from typing import Any

from bench import jobs
from bench.arms.celery import QUEUE, CeleryArm
from bench.peer_jobs import dispatch_with
from bench.producer import Calls

Params = dict[str, Any]
Result = dict[str, Any]


def enqueue_seq(arm: CeleryArm, p: Params) -> Result:
    """N sequential `noop.delay()` calls (each an LPUSH to the queue's list, and with the Redis
    result backend a subscription to the task's result channel, which Celery makes at every send)."""
    from bench.celery_tasks import noop

    jobs._reset(arm)
    n = p["n"]
    started = time.perf_counter()
    for _ in range(n):
        noop.delay()
    elapsed = time.perf_counter() - started
    written = int(arm.redis.llen(QUEUE))
    if written != n:
        raise RuntimeError(f"{written} queued messages after {n} sends")
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed, "path": "task.delay()"}}


def dispatch(arm: CeleryArm, p: Params) -> Result:
    """The dispatch cell with `stamp.delay(key)` (in Redis when it returns)."""
    from bench.celery_tasks import stamp

    return dispatch_with(arm, p, lambda key: stamp.delay(key), {"path": "stamp.delay(key)"})


def bulk(arm: CeleryArm, p: Params) -> Result:
    """The bulk_enqueue cell with Celery's one call for many tasks, `group(noop.s() x N).apply_async()`:
    no bulk publish underneath (Celery has none), one message per task over one producer
    connection (the group acquires one), each an LPUSH to Redis, outside any database transaction."""
    from celery import group

    from bench.celery_tasks import noop

    jobs._reset(arm)
    n = p["n"]
    started = time.perf_counter()
    group(noop.s() for _ in range(n)).apply_async()
    elapsed = time.perf_counter() - started
    written = int(arm.redis.llen(QUEUE))
    if written != n:
        raise RuntimeError(f"{written} queued messages after a group of {n}")
    path = "group(noop.s() for each call).apply_async(): one publish per task, one producer"
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed, "path": path}}


def producer() -> Calls:
    """An enqueue_p* producer's enqueue (bench.producer): enqueue_seq's call, `noop.delay()`, a
    publish to Redis (LPUSH), not a database commit: no transaction is involved."""
    from bench.celery_tasks import noop

    return Calls(noop.delay, "task.delay()")
