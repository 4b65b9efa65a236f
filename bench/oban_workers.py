"""The benchmark's tasks as oban workers (`@worker` classes with an async `process`), with the
bodies of bench/tasks.py. Imported by the agent (to build and enqueue jobs) and by the workers
(oban resolves a job's worker by its dotted name, `bench.oban_workers.Noop`, importing this module).
No Django here: the ledger writes go through one psycopg connection of the worker process
(autocommit), as pgqueuer's do (bench.pgq_worker)."""

import asyncio
import hashlib
import os
import time
from typing import Any

from oban import worker

LEDGER_TABLE = "bench_ledger"  # bench.tasks.LEDGER_TABLE (not imported: that module needs Django)
_ledger_conn: list[Any] = []  # the worker's ledger connection, opened at its first ledger write


async def record(key: int, at: float) -> None:
    import psycopg

    if not _ledger_conn:
        _ledger_conn.append(await psycopg.AsyncConnection.connect(os.environ["BENCH_DB_URL"], autocommit=True))
    await _ledger_conn[0].execute(
        f"INSERT INTO {LEDGER_TABLE} (task_key, pid, t) VALUES (%s, %s, %s)",  # noqa: S608
        [key, os.getpid(), at],
    )


@worker(queue="default")
class Noop:
    async def process(self, job: Any) -> None:
        return None


@worker(queue="default")
class Stamp:
    async def process(self, job: Any) -> None:
        at = time.time()  # dispatch latency: the first thing the task does is read the clock
        await record(job.args["key"], at)


@worker(queue="default")
class Ledger:
    async def process(self, job: Any) -> None:
        at = time.time()
        await record(job.args["key"], at)
        await asyncio.sleep(job.args.get("sleep_ms", 10) / 1000)


# The workload cells' tasks (bench.tasks: cpu_bound, io_bound, io_bound_async, mixed), the same
# bodies. oban runs async process() methods on its event loop, so blocking work goes to a thread
# (asyncio.to_thread, the default executor), as an asyncio application must: run inline, a 50 ms
# time.sleep would stall every other job of the process, and the queue's limit C would not be C.
def sha_rounds(rounds: int) -> None:
    """bench.tasks.sha_rounds (not imported: that module needs Django)."""
    digest = b"ox-bench"
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()


def _mixed() -> None:
    sha_rounds(50_000)
    time.sleep(0.02)


@worker(queue="default")
class CpuBound:
    async def process(self, job: Any) -> None:
        await asyncio.to_thread(sha_rounds, 100_000)


@worker(queue="default")
class IoBound:
    async def process(self, job: Any) -> None:
        await asyncio.to_thread(time.sleep, 0.05)


@worker(queue="default")
class IoBoundAsync:
    async def process(self, job: Any) -> None:
        await asyncio.sleep(0.05)


@worker(queue="default")
class Mixed:
    async def process(self, job: Any) -> None:
        await asyncio.to_thread(_mixed)


# The harness's task names (bench.tasks) -> these, with their parameter names: oban's args are
# one JSON object, so a call's positional arguments become its keys.
BY_NAME: dict[str, Any] = {
    "noop": Noop,
    "stamp": Stamp,
    "ledger": Ledger,
    "cpu_bound": CpuBound,
    "io_bound": IoBound,
    "io_bound_async": IoBoundAsync,
    "mixed": Mixed,
}
PARAMS = {
    "noop": (),
    "stamp": ("key",),
    "ledger": ("key", "sleep_ms"),
    "cpu_bound": (),
    "io_bound": (),
    "io_bound_async": (),
    "mixed": (),
}


def as_args(name: str, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A harness call as an oban job's args."""
    names = PARAMS[name]
    if len(args) > len(names):
        raise TypeError(f"{name} takes {len(names)} arguments, got {len(args)}")
    return {**dict(zip(names, args, strict=False)), **kwargs}
