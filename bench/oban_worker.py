"""One oban worker process for the benchmark: `python -m bench.oban_worker --concurrency C --ident
ID`, started by bench.fleet like the other arms' workers.

It does what `oban start --dsn $BENCH_DB_URL --queues default:C --node ID --log-level WARNING`
does (oban.cli.start): orjson for psycopg's JSON, `Config.load()` (oban.toml / OBAN_* / these
values), the pool from `Config.create_pool()` (its defaults: 1-10 connections), the Oban instance
from `Config.create_oban()`, run until SIGTERM (oban's graceful stop: 15 s shutdown grace period).
Every other option at oban's default: leadership on (a node with queues), stager every 1 s,
lifeline every 60 s rescuing jobs executing for more than 300 s, pruner (completed jobs older
than a day), refresher every 15 s, metrics off, notifier postgres (LISTEN/NOTIFY).

Why not `oban start` itself: with no `--cron-modules` it greps the working directory for cron
workers at boot (the benchmark has none), and the statements it sends would go uncounted.
BENCH_SQL_COUNT_FILE: every statement sent through psycopg's async cursors (oban's queries, the
task bodies' ledger writes, the LISTEN at boot), written at exit in bench.launch's format; oban's
transactions (`conn.transaction()`) count a BEGIN and a COMMIT each.
"""

import argparse
import asyncio
import atexit
import json
import logging
import os
import signal
from typing import Any

COUNTS = {"executes": 0, "begins": 0, "commits": 0}


def _dump() -> None:
    path = os.environ.get("BENCH_SQL_COUNT_FILE")
    if path:
        with open(path, "w") as fh:
            json.dump(COUNTS, fh)


def install_counter() -> None:
    """Count at psycopg's async cursor and transaction, which every oban query goes through."""
    from psycopg import AsyncCursor, AsyncTransaction

    def counted(original: Any, key: str, step: int = 1) -> Any:
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            COUNTS[key] += step
            return await original(*args, **kwargs)

        return wrapper

    AsyncCursor.execute = counted(AsyncCursor.execute, "executes")  # type: ignore[method-assign]
    AsyncCursor.executemany = counted(AsyncCursor.executemany, "executes")  # type: ignore[method-assign]
    AsyncTransaction.__aenter__ = counted(AsyncTransaction.__aenter__, "begins")  # type: ignore[method-assign]
    AsyncTransaction.__aexit__ = counted(AsyncTransaction.__aexit__, "commits")  # type: ignore[method-assign]
    atexit.register(_dump)


async def run(concurrency: int, ident: str) -> None:
    from oban._config import Config
    from oban.telemetry import logger as telemetry_logger

    conf = Config.load(None, dsn=os.environ["BENCH_DB_URL"], queues={"default": concurrency}, node=ident)
    pool = await conf.create_pool()
    oban = await conf.create_oban(pool)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    telemetry_logger.attach()  # as `oban start` does (its job lines are INFO: filtered out here)
    try:
        async with oban:
            await stop.wait()
    finally:
        telemetry_logger.detach()
        await pool.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.oban_worker")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--ident", required=True)
    args = parser.parse_args(argv)

    import orjson
    from psycopg.types.json import set_json_dumps, set_json_loads

    # Quiet, as every arm's workers are: warnings only (oban's telemetry logs each job at INFO).
    logging.basicConfig(level=logging.WARNING)
    set_json_dumps(orjson.dumps)  # as `oban start` does
    set_json_loads(orjson.loads)
    if os.environ.get("BENCH_SQL_COUNT_FILE"):
        install_counter()
    import uvloop  # oban depends on it; `oban start` runs on it

    uvloop.run(run(args.concurrency, args.ident))


if __name__ == "__main__":
    main()
