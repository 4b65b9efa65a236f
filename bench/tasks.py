"""The benchmark's task functions, identical for every arm (each arm's settings decide which
backend `@task` binds to). Imported only after django.setup()."""

import asyncio
import hashlib
import os
import time

from django.db import connection
from django.tasks import task

LEDGER_TABLE = "bench_ledger"


def record(key: int, at: float) -> None:
    """One ledger row per execution: which task (key), which process, when it started. The
    harness reads completions from the queue's own table; the ledger only answers "when did
    this run start" and "did it run twice"."""
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {LEDGER_TABLE} (task_key, pid, t) VALUES (%s, %s, %s)", [key, os.getpid(), at])


def sha_rounds(rounds: int) -> None:
    digest = b"ox-bench"
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()


@task
def noop() -> None:
    return None


@task
def noop_step(*before: object) -> None:
    """noop as a step of a chain (ox.chain): it takes the step before's result."""
    return None


@task
def cpu_bound() -> None:
    sha_rounds(100_000)


@task
def io_bound() -> None:
    time.sleep(0.05)


@task
async def io_bound_async() -> None:
    await asyncio.sleep(0.05)


@task
def mixed() -> None:
    sha_rounds(50_000)
    time.sleep(0.02)


@task
def keyed(account: str) -> None:
    """A no-op with an argument: the flow-control cells (bench.flow) make their limit keys and
    unique keys from it (ox: dataclasses.replace(keyed, limit_by=... / unique=...))."""
    return None


@task
def stamp(key: int) -> None:
    """Dispatch latency: the first thing the task does is read the clock."""
    record(key, time.time())


@task
def ledger(key: int, sleep_ms: int = 10) -> None:
    """Kill test: record the execution, then take a little time so kills land mid-task."""
    record(key, time.time())
    time.sleep(sleep_ms / 1000)


@task(takes_context=True)
async def progress_async(context, steps: int = 10, pause: float = 0.1) -> None:
    """The metadata cell (bench.plan_compose): a second of steps, saving progress after each
    (ten saves a second); `plain_async` is the same without the saves."""
    for i in range(steps):
        await asyncio.sleep(pause)
        context.metadata["progress"] = (i + 1) / steps
        await context.asave_metadata()


@task
async def plain_async(steps: int = 10, pause: float = 0.1) -> None:
    for _ in range(steps):
        await asyncio.sleep(pause)


WORKLOADS = {
    "noop": noop,
    "noop_step": noop_step,
    "cpu_bound": cpu_bound,
    "io_bound": io_bound,
    "io_bound_async": io_bound_async,
    "mixed": mixed,
    "progress_async": progress_async,
    "plain_async": plain_async,
}
