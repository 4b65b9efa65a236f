"""Arm "oban" (PyPI oban, the Python port of Oban; pinned in bench/requirements.txt). Not a Django
backend: the workers are `python -m bench.oban_worker` processes (what `oban start` runs), the
enqueue cells use oban's own `Worker.enqueue()` / `Oban.enqueue_many()` on an asyncio loop in the
agent (bench.oban_jobs), and this class reads progress from `oban_jobs` through the agent's Django
connection.

Where the counts come from (never from inside a task): every job is a row of `oban_jobs` and stays
there when finished (the pruner deletes completed rows after a day). A fetch sets `state =
'executing'`, `attempted_at` (the database's clock) and `attempted_by = [node, producer uuid]`; the
acknowledgement, batched by the producer (sent at its next fetch, after a 5 ms debounce), sets
`state = 'completed'` and `completed_at` (the database's clock). So done = completed rows; the
drain's span runs from the first `attempted_at` to the last `completed_at` (the database's clock,
as for pgqueuer and procrastinate).
"""

import asyncio
import os
from collections.abc import Coroutine, Sequence
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.tasks import Task

from bench.arms.base import Arm, Calls

JOBS, LEADERS, PRODUCERS = "oban_jobs", "oban_leaders", "oban_producers"
# oban_jobs' columns a queued job has (fill_fast copies them; the id is an identity column).
COPIED = (
    "state", "queue", "worker", "attempt", "max_attempts", "priority", "args", "meta", "tags", "errors",
    "attempted_by", "inserted_at", "scheduled_at",
)  # fmt: skip
FINAL = ("completed", "discarded", "cancelled")


def run_client(work: Any) -> Any:
    """Run `work(oban)` on a fresh event loop with an oban client (an `Oban` without queues: it
    only enqueues, leadership off) over its own psycopg pool, closed afterwards."""
    from oban import Oban
    from psycopg_pool import AsyncConnectionPool

    async def main() -> Any:
        pool = AsyncConnectionPool(os.environ["BENCH_DB_URL"], min_size=1, max_size=1, open=False)
        await pool.open()
        try:
            return await work(Oban(pool=pool))
        finally:
            await pool.close()

    coro: Coroutine[Any, Any, Any] = main()
    return asyncio.run(coro)


class ObanArm(Arm):
    name = "oban"
    launcher = "bench.oban_worker"
    bulk_path = "Oban.enqueue_many(jobs): one INSERT per job on one connection, one transaction"
    status_field = "state"
    done_status = "completed"
    terminal_statuses = FINAL
    # (run, connection) of a fill whose transaction waits for the caller's commit (held_write).
    held: tuple[Any, Any] | None = None
    job_overrides = {
        "setup": "bench.oban_jobs:setup",
        "enqueue_seq": "bench.oban_jobs:enqueue_seq",
        "dispatch": "bench.oban_jobs:dispatch",
        "enqueue_atomic": "bench.oban_jobs:enqueue_atomic",
        "bulk": "bench.oban_jobs:bulk",
    }
    producer_hook = "bench.oban_jobs:producer"  # the enqueue_p* cells' producers (bench.producer)

    # ---- workers
    def worker_argv(self, concurrency: int, ident: str, interval: float | None, queue: str = "default") -> list[str]:
        # interval: no cell sets one (oban wakes on its insert NOTIFY; its stager checks every 1 s).
        return ["--concurrency", str(concurrency), "--ident", ident]

    def running_on(self, ident: str, pid: int) -> list[int]:
        # The worker's node name is its ident (bench.oban_worker), the first of attempted_by.
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT (args->>'key')::int FROM {JOBS}"  # noqa: S608
                " WHERE state = 'executing' AND attempted_by[1] = %s AND args ? 'key'",
                [ident],
            )
            return [key for (key,) in cursor.fetchall()]

    def ready(self, pids: Sequence[int]) -> bool | None:
        return None  # the harness waits for the workers to go idle

    # ---- enqueue
    def bulk_enqueue(self, task: Task, calls: Calls) -> None:
        """Arm's bulk path, on a fresh client (the bulk_enqueue cell runs bench.oban_jobs.bulk,
        which opens the client before its clock starts)."""
        from bench.oban_workers import BY_NAME, as_args

        name = task.func.__name__
        worker = BY_NAME[name]
        jobs = [worker.new(as_args(name, a, dict(k))) for a, k in calls]

        async def work(oban: Any) -> None:
            await oban.enqueue_many(jobs)

        run_client(work)

    def fill(self, task: Task, calls: Calls) -> None:
        """A backlog (drain and kill cells, not timed): `oban.enqueue_many(jobs, conn=conn)` on a
        connection of the arm's whose transaction commits when the caller's Django transaction
        does (held_write), so the backlog appears to the workers all at once, at that commit."""
        from bench.oban_workers import BY_NAME, as_args

        name = task.func.__name__
        jobs = [BY_NAME[name].new(as_args(name, a, dict(k))) for a, k in calls]

        async def work(oban: Any, conn: Any) -> None:
            await oban.enqueue_many(jobs, conn=conn)

        self.held_write(work, len(jobs))

    def fill_fast(self, task: Task, total: int) -> None:
        """The backlog cells' fill, as Arm.fill_fast does it for the Django arms: one job written
        oban's way (`enqueue_many`, its insert statement), then copied total-1 times by one INSERT
        ... SELECT over generate_series, every column but the identity id (so the copies are
        claimed in id order after the template: same priority and scheduled_at); both in the
        transaction held_write commits with the caller's. The insert's pg_notify fires once (the
        copy sends none): the workers, idle on LISTEN, wake on it and fetch until the queue is empty."""
        from bench.oban_workers import BY_NAME

        if self.counts():
            raise RuntimeError("fill_fast needs an empty oban_jobs (reset first)")
        template = BY_NAME[task.func.__name__].new({})
        copied = ", ".join(COPIED)

        async def work(oban: Any, conn: Any) -> None:
            await oban.enqueue_many([template], conn=conn)
            if total > 1:
                await conn.execute(
                    f"INSERT INTO {JOBS} ({copied}) SELECT {copied} FROM {JOBS}"  # noqa: S608
                    " CROSS JOIN generate_series(1, %s)",
                    [total - 1],
                )

        self.held_write(work, total)

    def held_write(self, work: Any, expected: int) -> None:
        """Run `work(oban, conn)` on an async psycopg connection (autocommit off: one open
        transaction) on an event loop in a thread of its own, check that `expected` jobs are
        written, and commit that transaction when the caller's Django transaction commits
        (transaction.on_commit; at once outside atomic()). oban's connection is not Django's, so
        this is how its backlog becomes visible at the caller's commit, as the Django arms' does:
        committed on its own before the caller's, the workers ran jobs during the caller's ANALYZE
        and commit, which the drain's span (from the commit at the earliest) cut off while
        counting them. While it is held, analyze() runs on this connection (it sees its own rows)."""
        import threading

        import psycopg
        from oban import Oban
        from psycopg_pool import AsyncConnectionPool

        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()

        def run(coro: Coroutine[Any, Any, Any]) -> Any:
            return asyncio.run_coroutine_threadsafe(coro, loop).result(600)

        async def start() -> tuple[Any, Any, Any]:
            pool = AsyncConnectionPool(os.environ["BENCH_DB_URL"], min_size=1, max_size=1, open=False)
            await pool.open()
            # The client (no queues, only enqueues) and the connection its jobs are written on.
            return pool, Oban(pool=pool), await psycopg.AsyncConnection.connect(os.environ["BENCH_DB_URL"])

        async def count(conn: Any) -> dict[str, int]:
            cursor = await conn.execute(f"SELECT state::text, count(*) FROM {JOBS} GROUP BY 1")  # noqa: S608
            return {state: n for state, n in await cursor.fetchall()}

        async def finish(pool: Any, conn: Any, commit: bool) -> None:
            await (conn.commit() if commit else conn.rollback())
            await conn.close()
            await pool.close()

        def end(commit: bool) -> None:
            self.held = None
            try:
                run(finish(pool, conn, commit))
            finally:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(10)

        pool, oban, conn = run(start())
        try:
            run(work(oban, conn))
            written = run(count(conn))
            if written != {"available": expected}:
                raise RuntimeError(f"a fill of {expected} jobs left {written}")
        except BaseException:
            end(commit=False)
            raise
        self.held = (run, conn)
        transaction.on_commit(lambda: end(commit=True))

    # ---- reading progress
    def tables(self) -> list[str]:
        return [JOBS, LEADERS, PRODUCERS]

    def counts(self) -> dict[str, int]:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT state::text, count(*) FROM {JOBS} GROUP BY 1")  # noqa: S608
            return {state: n for state, n in cursor.fetchall()}

    def done(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {JOBS} WHERE state = 'completed'")  # noqa: S608
            return cursor.fetchone()[0]

    def span(self) -> tuple[datetime | None, datetime | None]:
        # oban's timestamps are UTC without a time zone: made aware for the drain's arithmetic.
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT min(attempted_at) AT TIME ZONE 'UTC', max(completed_at) AT TIME ZONE 'UTC'"  # noqa: S608
                f" FROM {JOBS} WHERE state = 'completed'"
            )
            first, last = cursor.fetchone()
        return first, last

    def first_n(self, n: int) -> tuple[datetime | None, datetime | None, int]:
        """The first attempted_at, the n-th earliest completed_at (or the last, with their number,
        when fewer completed), the database's clock as UTC."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT min(attempted_at) AT TIME ZONE 'UTC', count(*) FROM {JOBS}"  # noqa: S608
                " WHERE state = 'completed'"
            )
            first, done = cursor.fetchone()
            cursor.execute(
                f"SELECT completed_at AT TIME ZONE 'UTC' FROM {JOBS} WHERE state = 'completed'"  # noqa: S608
                " ORDER BY completed_at OFFSET %s LIMIT 1",
                [min(n, max(done, 1)) - 1],
            )
            row = cursor.fetchone()
        return first, row[0] if row else None, min(n, done)

    def options(self) -> dict[str, Any]:
        import inspect
        from importlib import metadata

        from oban import Oban
        from oban._lifeline import Lifeline
        from oban._producer import Producer

        def defaults(func: Any, skip: tuple[str, ...] = ()) -> dict[str, str]:
            return {
                k: repr(p.default)
                for k, p in inspect.signature(func).parameters.items()
                if p.default is not inspect.Parameter.empty and k not in skip
            }

        return {
            "package": f"oban {metadata.version('oban')}",
            "schema": "oban install (python -m oban install --dsn ...), prefix public; oban_jobs LOGGED",
            "worker": "bench.oban_worker: what `oban start --queues default:C --node ID` runs",
            "oban_defaults": defaults(Oban.__init__, ("pool", "dispatcher")),
            "producer_defaults": defaults(Producer.__init__, ("dispatcher", "name", "node", "notifier", "query")),
            "lifeline_defaults": defaults(Lifeline.__init__, ("query", "leader")),
            "pool": "Config.create_pool() defaults: min 1, max 10, timeout 30 s",
            "enqueue": "Worker.enqueue(args) on an Oban client (no queues) over its own psycopg pool",
        }

    def analyze(self) -> None:
        """ANALYZE oban's tables; while a fill's transaction is held (held_write), on its connection,
        where the backlog is visible (ANALYZE counts its own transaction's rows)."""
        statement = f"ANALYZE {', '.join(self.tables())}"
        if self.held is not None:
            run, conn = self.held
            run(conn.execute(statement))
            return
        with connection.cursor() as cursor:
            cursor.execute(statement)


ARM = ObanArm()
