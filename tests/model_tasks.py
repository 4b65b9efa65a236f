"""Tasks of the model-based worker test (tests/test_model.py); importable by worker
subprocesses as tests.model_tasks.*.

Every body first records its run in the ledger (tests.testapp.models.Ledger): one row per
body run, key "<task key>#<run nonce>", with the worker's pid and the attempt number the
worker gave the run (TaskContext.attempt). The write survives terminated database sessions
(it is retried on a fresh connection, idempotently per run), so a model step that kills
backends does not turn a succeeding task into a failing one.
"""

import asyncio
import os
import time
import uuid

from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connection
from django.tasks import task

from tests.testapp.models import Ledger

SURROGATE = "\udcff"
BIGINT = (10**5000 - 1) // 9 * 7  # 5000 sevens: past int<->str's default limit (4300 digits)


def record_run(key: str, attempt: int) -> int:
    """Record one body run; returns how many runs of this task were recorded before it."""
    run = f"{key}#{uuid.uuid4().hex[:12]}"
    delay = 0.05
    for tries in range(8):
        try:
            before = Ledger.objects.filter(key__startswith=f"{key}#").exclude(key=run).count()
            Ledger.objects.get_or_create(key=run, defaults={"pid": os.getpid(), "attempt": attempt})
            return before
        except (OperationalError, InterfaceError):
            if tries == 7:
                raise
            connection.close()
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    raise AssertionError("unreachable")


async def arecord_run(key: str, attempt: int) -> int:
    return await sync_to_async(record_run, thread_sensitive=True)(key, attempt)


# ------------------------------------------------------------------ succeeding, sync and async
@task(takes_context=True, max_attempts=3)
def ok(context, key: str, seconds: float) -> str:
    record_run(key, context.attempt)
    time.sleep(seconds)
    return key


@task(takes_context=True, max_attempts=3)
async def aok(context, key: str, seconds: float) -> str:
    await arecord_run(key, context.attempt)
    await asyncio.sleep(seconds)
    return key


# ------------------------------------------------------------------ failing, with retries
class Boom(Exception):
    pass


@task(takes_context=True, max_attempts=3)
def fails_twice(context, key: str) -> str:
    """Fails its first two body runs (counted in the ledger, so runs lost to a killed
    worker count too), then succeeds."""
    if record_run(key, context.attempt) < 2:
        raise Boom(f"run of attempt {context.attempt} fails")
    return key


@task(takes_context=True, max_attempts=2)
def always_fails(context, key: str) -> None:
    record_run(key, context.attempt)
    raise Boom("always")


@task(takes_context=True, max_attempts=2)
async def aalways_fails(context, key: str) -> None:
    await arecord_run(key, context.attempt)
    raise Boom("always, async")


@task(takes_context=True, max_attempts=3, backoff=lambda exc, result: None)
def gives_up(context, key: str) -> None:
    """Its backoff says no retry: FAILED after one attempt whatever max_attempts says."""
    record_run(key, context.attempt)
    raise Boom("no retry")


# ------------------------------------------------------------------ odd exceptions (one attempt each)
class SurrogateError(Exception):
    pass


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


def _raise_odd(which: str) -> None:
    if which == "surrogate":
        raise SurrogateError(f"lone surrogate here: {SURROGATE} end")
    if which == "unprintable":
        raise Unprintable()
    if which == "system_exit":
        raise SystemExit(3)
    if which == "keyboard_interrupt":
        raise KeyboardInterrupt()
    if which == "cancelled_error":
        raise asyncio.CancelledError("raised by the task itself")
    raise AssertionError(which)


@task(takes_context=True, max_attempts=1)
def raises_odd(context, key: str, which: str) -> None:
    record_run(key, context.attempt)
    _raise_odd(which)


@task(takes_context=True, max_attempts=1)
async def araises_odd(context, key: str, which: str) -> None:
    await arecord_run(key, context.attempt)
    await asyncio.sleep(0.01)
    _raise_odd(which)


# ------------------------------------------------------------------ odd return values
def _odd_value(which: str):
    if which == "surrogate":
        return SURROGATE
    if which == "int_keys":
        return {1: "a"}
    if which == "tuple":
        return (1, "a")
    if which == "set":
        return {1, 2}
    if which == "nan":
        return float("nan")
    if which == "bigint":
        return BIGINT
    raise AssertionError(which)


@task(takes_context=True, max_attempts=3)
def returns_odd(context, key: str, which: str):
    record_run(key, context.attempt)
    return _odd_value(which)


@task(takes_context=True, max_attempts=3)
async def areturns_odd(context, key: str, which: str):
    await arecord_run(key, context.attempt)
    await asyncio.sleep(0.01)
    return _odd_value(which)


# ------------------------------------------------------------------ timing out (retried by policy)
@task(takes_context=True, max_attempts=2, timeout=0.5)
def times_out(context, key: str) -> None:
    record_run(key, context.attempt)
    end = time.monotonic() + 30
    while time.monotonic() < end:  # Python-level loop: the interrupt lands at once
        time.sleep(0.01)


@task(takes_context=True, max_attempts=2, timeout=0.5)
async def atimes_out(context, key: str) -> None:
    await arecord_run(key, context.attempt)
    await asyncio.sleep(30)
