"""One procrastinate worker process for the benchmark: `python -m bench.procrastinate_worker
--concurrency C --ident ID`, started by bench.fleet like the other arms' workers.

It does what procrastinate's Django management command (`manage.py procrastinate worker`) does,
and nothing else: django.setup() with the arm's settings (bench.settings_procrastinate); swap
the contrib's DjangoConnector for the worker connector it documents
(`DjangoConnector.get_worker_connector()`: a PsycopgConnector, an async psycopg pool at its
defaults, built from Django's connection parameters); open the app; `app.run_worker_async()`.
Worker options: `--concurrency C` and `--queues default`, every other at procrastinate's
defaults (listen_notify on, fetch_job_polling_interval 5 s, abort polling 5 s, heartbeat every
10 s, stalled_worker_timeout 30 s, delete_jobs never, no shutdown timeout).

Why not the management command itself (through bench.launch, as the Django arms run theirs):
- the harness must know which worker holds which job (the kill cell), and procrastinate keeps
  only a numeric id per worker (procrastinate_workers.id): this process writes the id it was
  given at registration to `<log dir>/<ident>.procrastinate.json`;
- statements: procrastinate's queue statements go through its psycopg pool, not Django's
  cursor, so bench.launch's counter would see only the task bodies' writes. This process
  counts both: each call of the connector's execute methods (one statement each; procrastinate
  runs them in autocommit) and the task bodies' writes through Django (bench.launch's counter).
  Not counted: the pool's connection check at every checkout (psycopg_pool's check_connection,
  an empty statement), the LISTEN at boot.
"""

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings_procrastinate")


def id_file(count_file: str | Path, ident: str) -> Path:
    """Where the worker with this ident writes its procrastinate worker id: next to its
    statement counts (BENCH_SQL_COUNT_FILE, set by bench.fleet), i.e. in the run's log dir."""
    return Path(count_file).with_name(f"{ident}.procrastinate.json")


def counting_connector(base: Any) -> Any:
    """The worker connector procrastinate builds (a PsycopgConnector), its statements counted."""
    from procrastinate import psycopg_connector

    from bench.launch import COUNTS

    class CountingConnector(psycopg_connector.PsycopgConnector):
        async def execute_query_async(self, query: Any, **arguments: Any) -> None:
            COUNTS["executes"] += 1
            return await super().execute_query_async(query, **arguments)

        async def execute_query_one_async(self, query: Any, **arguments: Any) -> dict[str, Any]:
            COUNTS["executes"] += 1
            return await super().execute_query_one_async(query, **arguments)

        async def execute_query_all_async(self, query: Any, **arguments: Any) -> list[dict[str, Any]]:
            COUNTS["executes"] += 1
            return await super().execute_query_all_async(query, **arguments)

    # Same constructor arguments as the one procrastinate made (its pool arguments).
    return CountingConnector(**base._pool_args)


def record_worker_id(app: Any, path: Path | None) -> None:
    """Write the id procrastinate registers this worker under, once it has one."""
    manager = app.job_manager
    register = manager.register_worker

    async def register_and_record() -> int:
        worker_id = await register()
        if path is not None:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"worker_id": worker_id, "pid": os.getpid()}))
            tmp.replace(path)
        return worker_id

    manager.register_worker = register_and_record


async def run(app: Any, concurrency: int | None) -> None:
    # What procrastinate's CLI does for `worker` (cli.execute_command, cli.worker_). No
    # --concurrency (drain_defaults): procrastinate's own default.
    options: dict[str, Any] = {} if concurrency is None else {"concurrency": concurrency}
    async with app.open_async() as opened:
        await opened.run_worker_async(queues=["default"], **options)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.procrastinate_worker")
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--ident", required=True)
    args = parser.parse_args(argv)

    import django

    from bench import launch

    count_file = os.environ.get("BENCH_SQL_COUNT_FILE")
    if count_file:
        launch.install_counter()  # the task bodies' statements through Django; dumps at exit
    django.setup()
    from procrastinate.contrib.django import app

    app.perform_import_paths()  # the benchmark's tasks (PROCRASTINATE_IMPORT_PATHS)
    record_worker_id(app, id_file(count_file, args.ident) if count_file else None)
    connector = app.connector.get_worker_connector()
    if count_file:
        connector = counting_connector(connector)
    with app.replace_connector(connector):
        asyncio.run(run(app, args.concurrency))


if __name__ == "__main__":
    main()
