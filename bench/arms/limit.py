"""Arm "limit": not a system under test but the bound every system's figure is read against, the
least a durable task queue on this PostgreSQL can do (bench.limit_sql: one INSERT per enqueue
commit; a drain that claims a batch in one UPDATE ... FOR UPDATE SKIP LOCKED and marks it done in
one more). Its workers are `python -m bench.limit_worker` processes (psycopg, no framework); the
enqueue cells have their own jobs (bench.limit_jobs); the drain and backlog cells run the shared
jobs (bench.jobs.drain, bench.scale.backlog) through this class's fill / fill_fast / counts / span
/ first_n, the drain behind bench.limit_jobs.drain, which sets the claim's batch for the task.

Where the counts come from (never from inside a task): every task is a row of `limit_task`, and
stays there when done. done = rows with status 'done'; the drain's span runs from the first
`started_at` (set by the claim) to the last `finished_at` (set by the completion), both the
database's clock, as for pgqueuer, procrastinate and oban.
"""

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.tasks import Task

from bench.arms.base import Arm, Calls
from bench.limit_sql import BATCH, CLAIM, COMPLETE, COPY, IDLE_POLL_S, INSERT, INSERT_SERIES, TABLE, copy_payloads

FINAL = ("done",)


class LimitArm(Arm):
    name = "limit"
    launcher = "bench.limit_worker"
    bulk_path = f"{COPY}: one statement, a row per call (bench.limit_sql.copy_payloads)"
    status_field = "status"
    done_status = "done"
    terminal_statuses = FINAL
    job_overrides = {
        "setup": "bench.limit_jobs:setup",
        "enqueue_seq": "bench.limit_jobs:enqueue_seq",
        "enqueue_atomic": "bench.limit_jobs:enqueue_atomic",
        "bulk": "bench.limit_jobs:bulk",
        "drain": "bench.limit_jobs:drain",
    }
    producer_hook = "bench.limit_jobs:producer"  # the enqueue_p* cells' producers (bench.producer)

    def __init__(self) -> None:
        # Rows per claim for the workers started next: bench.limit_jobs.drain sets it from the
        # cell's task before it starts them (1 for tasks that take time).
        self.batch = BATCH

    # ---- workers
    def worker_argv(self, concurrency: int, ident: str, interval: float | None, queue: str = "default") -> list[str]:
        # interval: the bare loop's idle poll is fixed (bench.limit_sql.IDLE_POLL_S); queue: one
        # table. Concurrency 0 (a cell's "no setting") is one loop: the worker's floor.
        return ["--concurrency", str(concurrency), "--ident", ident, "--batch", str(self.batch)]

    def running_on(self, ident: str, pid: int) -> list[int]:
        raise NotImplementedError("the limit arm runs no kill cell: it keeps no worker on its rows")

    def ready(self, pids: Sequence[int]) -> bool | None:
        return None  # no registry row: the harness waits for the workers to go idle

    # ---- enqueue
    @staticmethod
    def payload(task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"task": task.func.__name__, "args": list(args), "kwargs": dict(kwargs)}

    def bulk_enqueue(self, task: Task, calls: Calls) -> None:
        """The bulk path (COPY) on Django's connection, in the caller's transaction if it holds
        one. The bulk cell times the same COPY on a bare connection (bench.limit_jobs.bulk)."""
        with connection.cursor() as cursor:
            copy_payloads(cursor, (self.payload(task, a, k) for a, k in calls))

    def fill(self, task: Task, calls: Calls) -> None:
        """One statement for the whole backlog, in the caller's transaction (Django's connection)."""
        self.bulk_enqueue(task, calls)

    def fill_fast(self, task: Task, total: int) -> None:
        """The backlog cells' fill: the row an enqueue of `task` writes, `total` times, by one
        INSERT ... SELECT over generate_series, in the caller's transaction."""
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT EXISTS (SELECT FROM {TABLE})")  # noqa: S608
            if cursor.fetchone()[0]:
                raise RuntimeError("fill_fast needs an empty table (reset first)")
            cursor.execute(INSERT_SERIES, [json.dumps(self.payload(task, (), {})), total])

    # ---- reading progress
    def tables(self) -> list[str]:
        return [TABLE]

    def counts(self) -> dict[str, int]:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT status, count(*) FROM {TABLE} GROUP BY 1")  # noqa: S608
            return {status: n for status, n in cursor.fetchall()}

    def done(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {TABLE} WHERE status = 'done'")  # noqa: S608
            return cursor.fetchone()[0]

    def span(self) -> tuple[datetime | None, datetime | None]:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT min(started_at), max(finished_at) FROM {TABLE} WHERE status = 'done'")  # noqa: S608
            first, last = cursor.fetchone()
        return first, last

    def first_n(self, n: int) -> tuple[datetime | None, datetime | None, int]:
        """The first claim over the done rows, the n-th earliest completion among them (a batch's
        rows share theirs), and how many that spans (fewer than n done: the last completion)."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT min(started_at), max(finished_at), count(*) FROM {TABLE} WHERE status = 'done'"  # noqa: S608
            )
            first, last, done = cursor.fetchone()
            if done < n:
                return first, last, done
            cursor.execute(
                f"SELECT finished_at FROM {TABLE} WHERE status = 'done' ORDER BY finished_at OFFSET %s LIMIT 1",  # noqa: S608
                [n - 1],
            )
            return first, cursor.fetchone()[0], n

    def options(self) -> dict[str, Any]:
        import psycopg

        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            sync = cursor.fetchone()[0]
        return {
            "package": f"none: bare SQL on psycopg {psycopg.__version__} (bench/limit_sql.py)",
            "enqueue": INSERT + " on one persistent autocommit connection (one commit per row)",
            "enqueue_atomic": "BEGIN; " + INSERT + "; COMMIT (psycopg conn.transaction() on that connection)",
            "bulk": COPY + " in autocommit (one statement, one commit per call)",
            "backlog_fill": " ".join(INSERT_SERIES.split()),
            "claim": " ".join(CLAIM.split()),
            "complete": " ".join(COMPLETE.split()),
            "batch": BATCH,
            "batch_workloads": (
                "1 for sync tasks that take time; async ones 100 // C per loop, run at once (limit_jobs.batch_for)"
            ),
            "idle_poll_s": IDLE_POLL_S,
            "worker": "bench.limit_worker: C threads, each a loop on its own persistent autocommit connection",
            "synchronous_commit": sync,
        }

    def analyze(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {TABLE}")


ARM = LimitArm()
