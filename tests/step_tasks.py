"""Tasks of tests/test_steps.py (durable steps, ox.steps); importable by worker subprocesses."""

import asyncio
import os
import time
from pathlib import Path

from django.tasks import task

import ox
from tests.testapp.models import Ledger


def _work(key: str, n: int, attempt: int, fail_at: int) -> int:
    Ledger.objects.create(key=f"{key}:s{n}", pid=os.getpid(), attempt=attempt)
    if n == fail_at and attempt == 1:
        raise ValueError(f"step {n} fails on the first attempt")
    return n * 10


@task(takes_context=True, max_attempts=3)
def five_steps(context, key: str, fail_at: int) -> int:
    """Five recorded steps; step `fail_at` fails on the first attempt."""
    return sum(ox.step(f"s{n}", _work, key, n, context.attempt, fail_at) for n in range(1, 6))


def _block_first_time(key: str, gate: str, attempt: int) -> str:
    """Step 4: on the first attempt, waits (bounded) for the worker to be killed."""
    if attempt == 1:
        deadline = time.monotonic() + 60
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    Ledger.objects.create(key=f"{key}:s4", pid=os.getpid(), attempt=attempt)
    return "four"


@task(takes_context=True, max_attempts=3)
def killed_in_step_four(context, key: str, gate: str) -> list:
    out = [ox.step(f"s{n}", _work, key, n, context.attempt, 0) for n in (1, 2, 3)]
    out.append(ox.step("s4", _block_first_time, key, gate, context.attempt))
    out.append(ox.step("s5", _work, key, 5, context.attempt, 0))
    return out


async def _awork(key: str, n: int, attempt: int) -> dict:
    await asyncio.sleep(0.01)
    from asgiref.sync import sync_to_async

    await sync_to_async(Ledger.objects.create)(key=f"{key}:s{n}", pid=os.getpid(), attempt=attempt)
    if n == 2 and attempt == 1:
        raise ValueError("async step 2 fails on the first attempt")
    return {"n": n, "pair": (n, n)}


@task(takes_context=True, max_attempts=3)
async def async_steps(context, key: str) -> list:
    return [await ox.astep(f"a{n}", _awork, key, n, context.attempt) for n in (1, 2)]


@task
def same_name_twice() -> None:
    ox.step("once", int, 1)
    ox.step("once", int, 2)


@task
def unstorable_step() -> None:
    ox.step("bad", lambda: {1, 2})  # a set is not JSON
