"""The benchmark's tasks as procrastinate tasks of the Django contrib's app, with the bodies of
bench/tasks.py (plain `def`s: procrastinate runs a sync task in a thread, through asgiref's
sync_to_async(thread_sensitive=False), and the ledger writes go through Django's connection in
that thread, as the Django arms' tasks write through theirs). Named in
PROCRASTINATE_IMPORT_PATHS (bench/settings_procrastinate.py); imported only after
django.setup().

procrastinate tasks take keyword arguments only (`task.defer(**kwargs)`): a call's positional
arguments (the harness's ((key,), {...}) calls) become the task's keywords by name
(bench.arms.procrastinate.as_kwargs).

Stalled jobs: procrastinate does not re-run by itself a job whose worker died ("if no specific
action is taken, these stalled jobs will remain in the queue forever"); its production docs
(howto/production/retry_stalled_jobs) ask the user to add a periodic task that retries the jobs
of workers whose heartbeat is older than 30 s. It is added here as documented, with the docs'
schedule (every 10th minute) unless BENCH_PROCRASTINATE_RETRY_CRON says otherwise (only the
procrastinate-only cell kill_procrastinate_recovery sets it: every minute).
"""

import asyncio
import os
import time
from typing import Any

from procrastinate.contrib.django import app

from bench.tasks import record, sha_rounds

# The docs' example schedule: "configured to be deferred at every 10th minute".
DOCS_RETRY_CRON = "*/10 * * * *"
RETRY_CRON = os.environ.get("BENCH_PROCRASTINATE_RETRY_CRON") or DOCS_RETRY_CRON


@app.task(queue="default")
def noop() -> None:
    return None


@app.task(queue="default")
def stamp(key: int) -> None:
    """Dispatch latency: the first thing the task does is read the clock."""
    record(key, time.time())


@app.task(queue="default")
def ledger(key: int, sleep_ms: int = 10) -> None:
    """Kill test: record the execution, then take a little time so kills land mid-task."""
    record(key, time.time())
    time.sleep(sleep_ms / 1000)


# The drain cells' workloads (bench.plan.WORKLOADS), bodies as in bench/tasks.py. The sync ones run
# in a thread each (procrastinate's sync_to_async), at most --concurrency C at a time; the async
# one on the worker's event loop.
@app.task(queue="default")
def cpu_bound() -> None:
    sha_rounds(100_000)


@app.task(queue="default")
def io_bound() -> None:
    time.sleep(0.05)


@app.task(queue="default")
async def io_bound_async() -> None:
    await asyncio.sleep(0.05)


@app.task(queue="default")
def mixed() -> None:
    sha_rounds(50_000)
    time.sleep(0.02)


# Verbatim from procrastinate's docs (howto/production/retry_stalled_jobs), schedule aside.
@app.periodic(cron=RETRY_CRON)
@app.task(queueing_lock="retry_stalled_jobs", pass_context=True)
async def retry_stalled_jobs(context: Any, timestamp: int) -> None:
    stalled_jobs = await app.job_manager.get_stalled_jobs()
    for job in stalled_jobs:
        await app.job_manager.retry_job(job)


# The harness's task names (bench.tasks, the Django arms' tasks) -> these.
BY_NAME = {
    "noop": noop,
    "stamp": stamp,
    "ledger": ledger,
    "cpu_bound": cpu_bound,
    "io_bound": io_bound,
    "io_bound_async": io_bound_async,
    "mixed": mixed,
}
# Jobs of the benchmark's own tasks; the periodic retry task is not one of them.
BENCH_TASK_NAMES = tuple(t.name for t in BY_NAME.values())
