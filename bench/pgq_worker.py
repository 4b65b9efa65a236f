"""One pgqueuer worker process for the benchmark: `python -m bench.pgq_worker --concurrency-limit C
--ident ID`, started by bench.fleet like the Django arms' workers (bench.launch), but without
Django: pgqueuer's own QueueManager on its own asyncpg connection, run through
`pgqueuer.run()` (what `pgq run` calls) with every run() setting at its default.

Why asyncpg: it is the driver pgqueuer prefers (`pgq`'s default connection tries asyncpg first,
psycopg only without it). Its psycopg driver waits for notifications with
`notifies(timeout=1.0, stop_after=1)`, which holds the connection while no NOTIFY comes, so
every query of a quiet moment waits up to 1 s behind it: measured here, a concurrency-1 drain on
psycopg finished 59 no-op jobs in two minutes.

- Database: BENCH_DB_URL (the arm's database, set by the harness), pgqueuer schema installed
  by `pgq install` (bench.pgq_jobs.setup).
- Concurrency: each entrypoint's `concurrency_limit` (pgqueuer's per-entrypoint limit, enforced
  in SQL across every worker) is C. The harness gives C = the cell's processes x concurrency,
  so a single worker runs at most C tasks at a time (bench.arms.pgqueuer).
- Identity: the QueueManager's id is derived from the harness's ident, so the harness can tell
  which picked rows a worker holds (the kill cell) without asking the worker.
- Task bodies: the benchmark's tasks (bench.tasks) as async entrypoints; the ledger ones write
  through one more connection of the worker's (psycopg, autocommit), as the Django arms' tasks
  write through Django's connection.
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
from collections.abc import AsyncIterator
from typing import Any

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
async def manager(dsn: str, ident: str, limit: int) -> AsyncIterator[Any]:
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

    try:
        yield qm
    finally:
        await task_conn.close()
        await queue_conn.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.pgq_worker")
    parser.add_argument("--concurrency-limit", type=int, required=True)
    parser.add_argument("--ident", required=True)
    args = parser.parse_args(argv)

    import pgqueuer

    # Quiet, as the Django arms' workers are (bench.settings_base LOGGING): warnings only.
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    atexit.register(_dump)
    factory = functools.partial(manager, os.environ["BENCH_DB_URL"], args.ident, args.concurrency_limit)
    # pgqueuer.run() with no settings: its defaults (dequeue_timeout 30 s, batch_size 10,
    # heartbeat_timeout 30 s, continuous mode, no max_concurrent_tasks); it stops on SIGTERM.
    # On uvloop when installed, as `pgq run` does.
    try:
        import uvloop
    except ImportError:
        asyncio.run(pgqueuer.run(factory))
    else:
        uvloop.run(pgqueuer.run(factory))


if __name__ == "__main__":
    main()
