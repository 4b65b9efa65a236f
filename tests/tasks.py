"""Tasks the test suite enqueues; importable by worker subprocesses (tests.tasks.*)."""

import asyncio
import os
import time

from django.tasks import task

from tests.testapp.models import Ledger


@task
def noop() -> None:
    return None


@task
def echo(value):
    return value


@task(queue_name="other")
def other_queue() -> str:
    return "other"


@task
def record(key: str) -> str:
    Ledger.objects.create(key=key, pid=os.getpid())
    return key


@task(takes_context=True)
def record_attempt(context, key: str) -> int:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=context.attempt)
    return context.attempt


@task(takes_context=True, max_attempts=3)
def fail_until_third(context, key: str) -> int:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=context.attempt)
    if context.attempt < 3:
        raise ValueError(f"attempt {context.attempt} fails")
    return context.attempt


@task(max_attempts=4)
def always_fails(message: str) -> None:
    raise RuntimeError(message)


@task(max_attempts=5, backoff=lambda exc, result: None if isinstance(exc, KeyError) else 0.01)
def give_up_on_keyerror(kind: str) -> None:
    raise KeyError(kind) if kind == "key" else ValueError(kind)


@task(max_attempts=1)
def fails_once_only() -> None:
    raise RuntimeError("one attempt only")


@task
def sleep_for(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@task
def busy_for(seconds: float) -> float:
    # Python-level loop: an interrupt lands at the next bytecode.
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
    return seconds


@task(timeout=0.5, max_attempts=1)
def times_out() -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        time.sleep(0.01)


@task(timeout=0.3, max_attempts=1)
def ignores_interrupt() -> None:
    end = time.monotonic() + 8
    while time.monotonic() < end:
        try:
            time.sleep(0.01)
        except BaseException:  # noqa: BLE001, S112  (this task misbehaves on purpose)
            continue


@task(timeout=0.3, max_attempts=1)
def blocks_in_sleep(seconds: float) -> float:
    # One C call: the timeout's interrupt can land only once time.sleep returns.
    time.sleep(seconds)
    return seconds


@task
async def async_echo(value):
    await asyncio.sleep(0.01)
    return value


@task(timeout=0.3, max_attempts=1)
async def async_times_out() -> None:
    await asyncio.sleep(30)


@task
async def async_sleep(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


class Unpicklable(Exception):
    def __init__(self, handle) -> None:
        super().__init__("holds a lock")
        self.handle = handle

    def __reduce__(self):
        raise TypeError("cannot pickle")


@task(max_attempts=1)
def raises_unprintable() -> None:
    raise Unprintable()


@task(max_attempts=1)
def raises_unpicklable() -> None:
    import threading

    raise Unpicklable(threading.Lock())


@task
def returns_set() -> set:
    return {1, 2}


@task(max_attempts=1)
def takes_two(a: int, b: int) -> int:
    return a + b


@task(max_attempts=1)
def exits() -> None:
    raise SystemExit(3)


@task
def record_then_sleep(key: str, seconds: float) -> str:
    # The ledger row tells a test the body has started (RUNNING alone means claimed).
    Ledger.objects.create(key=key, pid=os.getpid())
    time.sleep(seconds)
    return key


# ---------------------------------------------------------------- edges (tests/test_edges.py)
@task(max_attempts=3)
def returns_lone_surrogate() -> str:
    return "file-\udcff"  # what os.fsdecode gives for an undecodable file name


@task(max_attempts=1)
def raises_lone_surrogate() -> None:
    raise ValueError("cannot open file-\udcff")


@task
def returns_int_keys() -> dict:
    return {1: "a", "b": (1, 2)}


@task(max_attempts=2)
async def async_raises(kind: str) -> None:
    import asyncio as _asyncio

    await _asyncio.sleep(0.01)
    if kind == "cancelled":
        raise _asyncio.CancelledError()
    if kind == "exit":
        raise SystemExit(2)
    if kind == "interrupt":
        raise KeyboardInterrupt()
    if kind == "subtask-exit":

        async def child() -> None:
            raise SystemExit(4)

        await _asyncio.gather(_asyncio.ensure_future(child()))


def _inf_backoff(exc, result):
    return float("inf")


def _slow_backoff(exc, result):
    time.sleep(2.5)  # longer than the test's lease: must not starve the worker loop
    return 0.01


@task(max_attempts=2, backoff=_inf_backoff)
def backoff_inf() -> None:
    raise RuntimeError("inf backoff")


@task(max_attempts=2, backoff=_slow_backoff)
def backoff_slow() -> None:
    raise RuntimeError("slow backoff")


@task(max_attempts=3)
def fails_after(seconds: float) -> None:
    time.sleep(seconds)
    raise RuntimeError("failed after a while")


@task
def record_sleep(key: str, seconds: float) -> str:
    Ledger.objects.create(key=key, pid=os.getpid())
    time.sleep(seconds)
    return key
