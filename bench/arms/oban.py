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
from collections.abc import Coroutine, Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.tasks import Task

from bench.arms.base import Arm, Calls

JOBS, LEADERS, PRODUCERS = "oban_jobs", "oban_leaders", "oban_producers"
FINAL = ("completed", "discarded", "cancelled")


def run_client(work: Any) -> Any:
    """Run `work(oban)` on a fresh event loop with an oban client (an `Oban` without queues: it
    only enqueues, leadership off) over its own psycopg pool, closed afterwards."""
    import os

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
    job_overrides = {
        "setup": "bench.oban_jobs:setup",
        "enqueue_seq": "bench.oban_jobs:enqueue_seq",
        "dispatch": "bench.oban_jobs:dispatch",
    }

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
        from bench.oban_workers import BY_NAME, as_args

        name = task.func.__name__
        worker = BY_NAME[name]
        jobs = [worker.new(as_args(name, a, dict(k))) for a, k in calls]

        async def work(oban: Any) -> None:
            await oban.enqueue_many(jobs)

        run_client(work)

    def fill(self, task: Task, calls: Calls) -> None:
        """oban's enqueue_many on the client's own connection: one transaction (the pool's
        connection commits when it is returned), so the backlog appears to the workers at once.
        It commits before the caller's transaction does: oban's async connection is not Django's."""
        self.bulk_enqueue(task, calls)

    def fill_fast(self, task: Task, total: int) -> None:
        raise NotImplementedError("no fast fill for oban yet (bench.plan_peers: the backlog cells)")

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
        raise NotImplementedError("the backlog cells do not run oban yet")

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
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {', '.join(self.tables())}")


ARM = ObanArm()
