"""The benchmark's tasks as Celery tasks (`@app.task`), with the bodies of bench/tasks.py: plain
functions, the ledger writes through Django's connection (CONN_MAX_AGE=600, the cells'
worker_env; Celery's Django fixup closes stale connections around tasks).

One addition of the harness's, outside the tasks: Celery records no start time by default (the
STARTED state needs task_track_started, an extra write per task), so the drain's span would have
no worker-side start. A task_prerun handler writes, once per pool process, when that process
started its first task (HSETNX on a Redis hash, next to the results): one round trip per process
lifetime, not per task. The drain's span runs from the earliest of those to the last date_done."""

import asyncio
import hashlib
import os
import time
from typing import Any

from asgiref.sync import async_to_sync
from celery.signals import task_prerun

from bench.celery_app import app

LEDGER_TABLE = "bench_ledger"  # bench.tasks.LEDGER_TABLE (that module defines Django Tasks)
FIRST_START_KEY = "bench:first_start"
_started: list[int] = []  # the pid that stamped its first start (a forked child starts empty)


def record(key: int, at: float) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {LEDGER_TABLE} (task_key, pid, t) VALUES (%s, %s, %s)",  # noqa: S608
            [key, os.getpid(), at],
        )


@task_prerun.connect
def first_start(**_: Any) -> None:
    pid = os.getpid()
    if _started != [pid]:
        _started[:] = [pid]
        app.backend.client.hsetnx(FIRST_START_KEY, str(pid), repr(time.time()))


@app.task
def noop() -> None:
    return None


@app.task
def stamp(key: int) -> None:
    """Dispatch latency: the first thing the task does is read the clock."""
    record(key, time.time())


@app.task
def ledger(key: int, sleep_ms: int = 10) -> None:
    """Kill test: record the execution, then take a little time so kills land mid-task."""
    record(key, time.time())
    time.sleep(sleep_ms / 1000)


def sha_rounds(rounds: int) -> None:
    """bench.tasks.sha_rounds (not imported: that module defines Django Tasks)."""
    digest = b"ox-bench"
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()


# The workload cells' tasks, the bodies of bench/tasks.py. Celery runs no coroutines (a task is
# a plain function in a pool process), so io_bound_async's coroutine runs through asgiref's
# async_to_sync, what Django's Task.call does for an async task in a synchronous worker.
@app.task
def cpu_bound() -> None:
    sha_rounds(100_000)


@app.task
def io_bound() -> None:
    time.sleep(0.05)


async def _sleep_async() -> None:
    await asyncio.sleep(0.05)


@app.task
def io_bound_async() -> None:
    async_to_sync(_sleep_async)()


@app.task
def mixed() -> None:
    sha_rounds(50_000)
    time.sleep(0.02)


BY_NAME = {
    "noop": noop,
    "stamp": stamp,
    "ledger": ledger,
    "cpu_bound": cpu_bound,
    "io_bound": io_bound,
    "io_bound_async": io_bound_async,
    "mixed": mixed,
}
