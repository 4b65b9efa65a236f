"""The workload cells' task bodies for the pgqueuer worker (bench.pgq_worker), without Django.

bench.tasks holds the benchmark's workloads as Django tasks, and importing it needs Django's
settings, which the pgqueuer worker does not load (Django would add its own import and memory
to every pgqueuer figure). So the same bodies are here, plain functions, call for call:
sha_rounds(100_000) / time.sleep(0.05) / asyncio.sleep(0.05) / sha_rounds(50_000) then
time.sleep(0.02). tests/test_bench_pgqueuer.py runs both sets with the clock and the hashing
recorded and fails if they ever differ.

How pgqueuer runs them (its executor refuses a plain `def` and says: "Wrap blocking code with
asyncio.to_thread()"): the blocking bodies through asyncio.to_thread (the event loop's default
thread pool), the async one awaited directly (bench.pgq_worker).
"""

import asyncio
import hashlib
import time
from collections.abc import Callable


def sha_rounds(rounds: int) -> None:
    digest = b"ox-bench"
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()


def cpu_bound() -> None:
    sha_rounds(100_000)


def io_bound() -> None:
    time.sleep(0.05)


async def io_bound_async() -> None:
    await asyncio.sleep(0.05)


def mixed() -> None:
    sha_rounds(50_000)
    time.sleep(0.02)


# Entrypoint name (bench.tasks' function name, which the arm's enqueue uses) -> blocking body.
BLOCKING: dict[str, Callable[[], None]] = {"cpu_bound": cpu_bound, "io_bound": io_bound, "mixed": mixed}
# Every workload cell's entrypoint (bench.plan.WORKLOADS).
WORKLOADS = (*BLOCKING, "io_bound_async")
