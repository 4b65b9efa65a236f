"""The task bodies the limit's bare loop runs (bench.limit_sql.Loop), by the name a row's payload
gives: the benchmark's workloads with the same bodies as bench/tasks.py, without Django.

Why copies and not imports: bench.tasks decorates them with Django's @task, which needs Django's
settings loaded, and the limit's worker (bench.limit_worker) runs without Django.
tests/test_bench_limit.py checks that each body here compiles to the same code as its namesake in
bench.tasks, so the two cannot drift apart unnoticed.
"""

import asyncio
import hashlib
import time
from collections.abc import Callable
from typing import Any


def sha_rounds(rounds: int) -> None:
    digest = b"ox-bench"
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()


def noop() -> None:
    return None


def cpu_bound() -> None:
    sha_rounds(100_000)


def io_bound() -> None:
    time.sleep(0.05)


async def io_bound_async() -> None:
    await asyncio.sleep(0.05)


def mixed() -> None:
    sha_rounds(50_000)
    time.sleep(0.02)


# payload["task"] -> the function the loop calls (an async one is run to completion on the loop
# thread's own event loop).
TASKS: dict[str, Callable[..., Any]] = {
    "noop": noop,
    "cpu_bound": cpu_bound,
    "io_bound": io_bound,
    "io_bound_async": io_bound_async,
    "mixed": mixed,
}
