"""One pgqueuer worker process for the benchmark: `python -m bench.pgq_worker --ident ID
[--batch-size B] [--max-concurrent-tasks M] [--concurrency-limit L] [--workload W]`, started by
bench.fleet like the Django arms' workers (bench.launch), but without Django: pgqueuer's own
QueueManager on its own asyncpg connection, run through `pgqueuer.run()` (what `pgq run` calls,
and these are its `--batch-size` / `--max-concurrent-tasks`), every setting not given at
pgqueuer's default.

Why asyncpg: it is the driver pgqueuer prefers (`pgq`'s default connection tries asyncpg first,
psycopg only without it). Its psycopg driver waits for notifications with
`notifies(timeout=1.0, stop_after=1)`, which holds the connection while no NOTIFY comes, so
every query of a quiet moment waits up to 1 s behind it: measured here, a concurrency-1 drain on
psycopg finished 59 no-op jobs in two minutes.

- Database: BENCH_DB_URL (the arm's database, set by the harness), pgqueuer schema installed
  by `pgq install` (bench.pgq_jobs.setup).
- Concurrency: the harness's "C tasks at a time in one process" becomes pgqueuer settings in
  `limits()` below (the why is there); with no flag this is pgqueuer at its defaults.
- Identity: the QueueManager's id is derived from the harness's ident, so the harness can tell
  which picked rows a worker holds (the kill cell) without asking the worker.
- Task bodies: the benchmark's tasks (bench.tasks) as async entrypoints; the ledger ones write
  through one more connection of the worker's (psycopg, autocommit), as the Django arms' tasks
  write through Django's connection. The workload cells' bodies are bench.pgq_workloads (the
  same bodies without Django): blocking ones through asyncio.to_thread, as pgqueuer asks.
- BENCH_SQL_COUNT_FILE: statements sent (pgqueuer's driver calls and the task bodies' writes),
  written at exit in bench.launch's format. The boot-time LISTEN is not counted.
"""

import argparse
import asyncio
import atexit
import contextlib
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from bench import pgq_workloads as workloads
from bench.pgq_workloads import BLOCKING, WORKLOADS

COUNTS = {"executes": 0, "begins": 0, "commits": 0}
# A fixed namespace: the harness maps an ident to the same QueueManager id the worker uses.
IDENT_NAMESPACE = uuid.UUID("5b0c3c1e-7a0e-4d53-9a59-0c0ffee0b0e4")
LEDGER_TABLE = "bench_ledger"  # bench.tasks.LEDGER_TABLE (not imported: that module needs Django)


def manager_id(ident: str) -> uuid.UUID:
    """The QueueManager id of the worker started with this ident."""
    return uuid.uuid5(IDENT_NAMESPACE, ident)


def encode(args: list[Any], kwargs: dict[str, Any]) -> bytes | None:
    """A task's arguments as a pgqueuer payload (None for a call without any, like noop())."""
    if not args and not kwargs:
        return None
    return json.dumps({"args": list(args), "kwargs": dict(kwargs)}).encode()


def decode(payload: bytes | None) -> tuple[list[Any], dict[str, Any]]:
    if not payload:
        return [], {}
    data = json.loads(payload)
    return data["args"], data["kwargs"]


def limits(concurrency: int, processes: int) -> dict[str, int]:
    """pgqueuer's settings for the harness's concurrency C ("at most C tasks at a time in this
    one process") in a fleet of `processes` such workers; {} is pgqueuer at its defaults (C = 0:
    drain_defaults). What pgqueuer 1.6.0 offers, and why each pick:

    - `max_concurrent_tasks` (run()): "a hard cap on this worker's picked jobs, enforced by the
      dequeue query" (its docs: "a per-process safety ceiling"): exactly C per process, but
      pgqueuer refuses it below twice `batch_size`, so C >= 2 gets max_concurrent_tasks = C at
      the largest batch it allows, C // 2.
    - C = 1 has no per-process setting (1 < 2 x a batch of at least 1). One process alone is
      the whole fleet, so the entrypoint's `concurrency_limit` = 1 (enforced in SQL across the
      fleet; its docs: "1 serialises dispatch") is exactly one task at a time in it. Several C = 1
      processes (the kill cell) would share that one slot fleet-wide, so they get the
      per-process cap's floor instead: 2 at a time each (batch 1).
    - `batch_size` is also the size of the worker's completion-log buffer (JobStatusLogBuffer
      max_size), flushed when that many completions wait, else on a 0.1 s timer; a picked job
      holds its slot (concurrency_limit) or budget (max_concurrent_tasks) until that flush deletes
      its row. With the default batch of 10 and at most C < 10 jobs picked the buffer never
      fills, so every slot waited out the timer (about 10 jobs/s per slot). With a batch of 1 a
      completion is flushed at once; with C // 2, half the budget's completions flush while the
      other half (the next batch) runs."""
    if concurrency <= 0:
        return {}
    if concurrency == 1 and processes == 1:
        return {"concurrency_limit": 1, "batch_size": 1}
    return {"max_concurrent_tasks": max(concurrency, 2), "batch_size": max(concurrency // 2, 1)}


def limit_argv(settings: dict[str, int]) -> list[str]:
    """limits() as this module's command-line flags."""
    return [arg for key, value in sorted(settings.items()) for arg in (f"--{key.replace('_', '-')}", str(value))]


def _dump() -> None:
    path = os.environ.get("BENCH_SQL_COUNT_FILE")
    if path:
        with open(path, "w") as fh:
            json.dump(COUNTS, fh)


def counting_driver(connection: Any) -> Any:
    """pgqueuer's asyncpg driver, counting each statement it sends (one round trip each;
    pgqueuer runs every statement in autocommit, so there is no BEGIN/COMMIT to count)."""
    from pgqueuer.db import AsyncpgDriver

    class CountingDriver(AsyncpgDriver):
        async def fetch(self, query: str, *args: object) -> list[dict[str, object]]:
            COUNTS["executes"] += 1
            return await super().fetch(query, *args)

        async def execute(self, query: str, *args: object) -> str:
            COUNTS["executes"] += 1
            return await super().execute(query, *args)

    return CountingDriver(connection)


@contextlib.asynccontextmanager
async def manager(dsn: str, ident: str, limit: int, workload: str | None = None) -> AsyncIterator[Any]:
    """The factory `pgqueuer.run()` enters: a QueueManager with the benchmark's entrypoints."""
    import asyncpg
    import psycopg
    from pgqueuer import QueueManager
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries

    queue_conn = await asyncpg.connect(dsn)
    task_conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    qm = QueueManager(Queries(counting_driver(queue_conn)))
    qm.queue_manager_id = manager_id(ident)  # type: ignore[assignment]
    pid = os.getpid()

    async def record(key: int, at: float) -> None:
        COUNTS["executes"] += 1
        await task_conn.execute(
            f"INSERT INTO {LEDGER_TABLE} (task_key, pid, t) VALUES (%s, %s, %s)",  # noqa: S608
            [key, pid, at],
        )

    @qm.entrypoint("noop", concurrency_limit=limit)
    async def noop(job: Job) -> None:
        return None

    @qm.entrypoint("stamp", concurrency_limit=limit)
    async def stamp(job: Job) -> None:
        at = time.time()  # dispatch latency: the first thing the task does is read the clock
        args, _ = decode(job.payload)
        await record(args[0], at)

    @qm.entrypoint("ledger", concurrency_limit=limit)
    async def ledger(job: Job) -> None:
        at = time.time()
        args, kwargs = decode(job.payload)
        await record(args[0], at)
        await asyncio.sleep(kwargs.get("sleep_ms", 10) / 1000)

    # A workload cell's entrypoint (bench.pgq_workloads: bench.tasks' bodies), registered only
    # for that cell: every registered entrypoint is one more probe in each dequeue, so the
    # other cells' workers stay as they were. Blocking code runs in a thread of the loop's
    # default pool, as pgqueuer's executor asks; the async one on the loop.
    if workload in BLOCKING:
        qm.entrypoint(workload, concurrency_limit=limit)(_in_thread(BLOCKING[workload]))
    elif workload == "io_bound_async":

        @qm.entrypoint("io_bound_async", concurrency_limit=limit)
        async def io_bound_async(job: Job) -> None:
            await workloads.io_bound_async()

    elif workload is not None:
        raise ValueError(f"unknown workload {workload!r}")

    try:
        yield qm
    finally:
        await task_conn.close()
        await queue_conn.close()


def _in_thread(body: Callable[[], None]) -> Callable[[Any], Awaitable[None]]:
    """An async entrypoint running a blocking body through asyncio.to_thread."""

    async def entry(job: Any) -> None:
        await asyncio.to_thread(body)

    entry.__name__ = body.__name__
    return entry


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.pgq_worker")
    parser.add_argument("--ident", required=True)
    # Each absent flag leaves pgqueuer's default (limits(): concurrency_limit 0 = unlimited,
    # batch_size 10, max_concurrent_tasks None).
    parser.add_argument("--concurrency-limit", type=int, default=0)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--max-concurrent-tasks", type=int)
    # A workload cell's task (bench.pgq_workloads), registered besides noop / stamp / ledger.
    parser.add_argument("--workload", choices=[*WORKLOADS])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    import pgqueuer

    # Quiet, as the Django arms' workers are (bench.settings_base LOGGING): warnings only.
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    atexit.register(_dump)
    factory = functools.partial(manager, os.environ["BENCH_DB_URL"], args.ident, args.concurrency_limit, args.workload)
    # Only the settings given (limits()); every other run() setting at pgqueuer's default
    # (dequeue_timeout 30 s, heartbeat_timeout 30 s, continuous mode); it stops on SIGTERM.
    settings: dict[str, Any] = {}
    if args.batch_size is not None:
        settings["batch_size"] = args.batch_size
    if args.max_concurrent_tasks is not None:
        settings["max_concurrent_tasks"] = args.max_concurrent_tasks
    # On uvloop when installed, as `pgq run` does.
    try:
        import uvloop
    except ImportError:
        asyncio.run(pgqueuer.run(factory, **settings))
    else:
        uvloop.run(pgqueuer.run(factory, **settings))


if __name__ == "__main__":
    main()
