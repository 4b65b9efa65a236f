"""Arm "pgqueuer" (PyPI pgqueuer, pinned in bench/requirements.txt). Not a Django backend: the
workers are `python -m bench.pgq_worker` processes (pgqueuer's QueueManager on asyncpg, run
with pgqueuer.run()'s defaults but for the cell's concurrency: bench.pgq_worker.limits), the
enqueue cells use pgqueuer's SyncQueries (bench.pgq_jobs), and this class reads progress from
pgqueuer's own tables through the agent's Django connection.

Where the counts come from (never from inside a task):
- a job waiting or running is a row of `pgqueuer` (status queued / picked);
- a finished job's row is deleted and a row with its final status is written to
  `pgqueuer_log` (successful, exception, canceled, ...), batched by the worker (flushed every
  batch_size completions, 10 by default, or 0.1 s);
- every pick also writes a `picked` log row, with the database's clock at the claim.
So done = distinct job ids with a `successful` log row; the drain's span runs from the first
`picked` to the last `successful` log row (the database's clock, where the Django arms' rows
carry the workers'; the same machine).
"""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.tasks import Task

from bench.arms.base import Arm, Calls

QUEUE, LOG, STATISTICS = "pgqueuer", "pgqueuer_log", "pgqueuer_statistics"
FINAL = ("successful", "exception", "canceled", "deleted", "failed")


class InTransactionDriver:
    """pgqueuer's SyncDriver protocol over the agent's Django connection, so a backlog is
    written by pgqueuer's own enqueue statement inside the caller's atomic() block (its
    SyncPsycopgDriver is the same RawCursor call, but insists on an autocommit connection)."""

    def fetch(self, query: str, *args: object) -> list[dict[str, object]]:
        from psycopg import RawCursor
        from psycopg.rows import dict_row

        connection.ensure_connection()
        with RawCursor(connection.connection, row_factory=dict_row) as cursor:
            cursor.execute(query, args or None)
            return cursor.fetchall()


class PgqueuerArm(Arm):
    name = "pgqueuer"
    launcher = "bench.pgq_worker"
    bulk_path = "SyncQueries.enqueue(entrypoints, payloads, priorities): one statement"
    status_field = "status"
    done_status = "successful"
    terminal_statuses = FINAL
    job_overrides = {
        "setup": "bench.pgq_jobs:setup",
        "enqueue_seq": "bench.pgq_jobs:enqueue_seq",
        "dispatch": "bench.pgq_jobs:dispatch",
        "drain": "bench.pgq_jobs:drain",
        "kill": "bench.pgq_jobs:kill",
        "enqueue_atomic": "bench.pgq_jobs:enqueue_atomic",
        "bulk": "bench.pgq_jobs:bulk",
        "backlog": "bench.pgq_jobs:backlog",
    }
    producer_hook = "bench.pgq_jobs:producer"  # the enqueue_p* cells' producers (bench.producer)

    def __init__(self) -> None:
        # How many workers the cell runs (a replacement in the kill cell takes a dead one's
        # place): bench.pgq_worker.limits() needs it for C = 1, where pgqueuer has no
        # per-process setting and its fleet-wide one is exact only for a fleet of one. The jobs
        # set it before they start workers.
        self.processes = 1
        # The workload cell's entrypoint, when the drain runs one (bench.pgq_workloads): its
        # workers register it besides noop / stamp / ledger. Set by the drain job.
        self.workload: str | None = None

    # ---- workers
    def worker_argv(self, concurrency: int, ident: str, interval: float | None, queue: str = "default") -> list[str]:
        # interval: no cell sets one for pgqueuer (its idle wake-up is LISTEN/NOTIFY, with
        # dequeue_timeout 30 s as the fallback poll). queue: pgqueuer routes by entrypoint.
        from bench.pgq_worker import limit_argv, limits

        argv = ["--ident", ident, *limit_argv(limits(concurrency, self.processes))]
        return argv + (["--workload", self.workload] if self.workload else [])

    def running_on(self, ident: str, pid: int) -> list[int]:
        from bench.pgq_worker import decode, manager_id

        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT payload FROM {QUEUE} WHERE status = 'picked' AND queue_manager_id = %s",  # noqa: S608
                [manager_id(ident)],
            )
            rows = cursor.fetchall()
        keys = []
        for (payload,) in rows:
            args, _ = decode(bytes(payload) if payload is not None else None)
            if args:
                keys.append(args[0])
        return keys

    def ready(self, pids: Sequence[int]) -> bool | None:
        return None  # a pgqueuer worker keeps no registry row: the harness waits for it to go idle

    # ---- enqueue
    @staticmethod
    def entrypoint(task: Task) -> str:
        return task.func.__name__  # bench.pgq_worker registers the same names

    def bulk_enqueue(self, task: Task, calls: Calls) -> None:
        from pgqueuer.queries import SyncQueries

        from bench.pgq_worker import encode

        name = self.entrypoint(task)
        SyncQueries(InTransactionDriver()).enqueue(
            [name] * len(calls), [encode(list(a), dict(k)) for a, k in calls], [0] * len(calls)
        )

    def fill(self, task: Task, calls: Calls) -> None:
        """pgqueuer's own enqueue statement (one for the whole backlog: queue rows and their
        `queued` log rows), in the caller's transaction."""
        self.bulk_enqueue(task, calls)

    def fill_fast(self, task: Task, total: int) -> None:
        """The backlog cells' fill, as the Django arms' (Arm.fill_fast): one job enqueued by
        pgqueuer's own statement (`fill`: the queue row and its `queued` log row), then copied
        total - 1 times by one statement: every column of the queue row but `id`, which the
        copies take from the table's sequence (its default, what pgqueuer's enqueue draws from
        too), so they are ordinary queued jobs in id order, the order the worker picks
        (priority DESC, id ASC); and for each copy the `queued` log row pgqueuer's enqueue
        writes with it (left unaggregated, as its enqueue leaves them: a worker folds them into
        pgqueuer_statistics on its 30 s aggregation timer, during the drain). The caller holds
        the transaction (one NOTIFY at its commit, from pgqueuer's statement trigger)."""
        if self._scalar(f"SELECT count(*) FROM {QUEUE}"):  # noqa: S608
            raise RuntimeError("fill_fast needs an empty table (reset first)")
        self.fill(task, [((), {})])
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT status::text, dedupe_key, execute_after <= now() FROM {QUEUE}"  # noqa: S608
            )
            template = cursor.fetchall()
        # One queued job with no dedupe key (a copied key would break its unique index), due now.
        if len(template) != 1 or template[0] != ("queued", None, True):
            raise RuntimeError(f"unexpected template job {template}")
        if total <= 1:
            return
        columns = [c for c in self._columns(QUEUE) if c != "id"]
        listed = ", ".join(columns)
        picked = ", ".join(f"src.{c}" for c in columns)
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH copies AS (INSERT INTO {QUEUE} ({listed})"  # noqa: S608
                f" SELECT {picked} FROM {QUEUE} AS src CROSS JOIN generate_series(1, %s)"
                " RETURNING id, entrypoint, priority)"
                f" INSERT INTO {LOG} (job_id, status, entrypoint, priority)"
                " SELECT id, 'queued'::pgqueuer_status, entrypoint, priority FROM copies",
                [total - 1],
            )
            # Not timed: what the workers will see, checked before the commit shows it to them.
            cursor.execute(
                f"SELECT (SELECT count(*) FROM {QUEUE} WHERE status = 'queued' AND entrypoint = %s),"  # noqa: S608
                f" (SELECT count(DISTINCT job_id) FROM {LOG} WHERE status = 'queued')",
                [self.entrypoint(task)],
            )
            queued, logged = cursor.fetchone()
        if queued != total or logged != total:
            raise RuntimeError(f"fill_fast wrote {queued} queued jobs and {logged} queued log rows, not {total}")

    def _columns(self, table: str) -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
                " AND NOT attisdropped ORDER BY attnum",
                [table],
            )
            return [name for (name,) in cursor.fetchall()]

    # ---- reading progress
    def tables(self) -> list[str]:
        return [QUEUE, LOG, STATISTICS]

    def _scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        with connection.cursor() as cursor:
            cursor.execute(sql, list(params))
            return cursor.fetchone()[0]

    def counts(self) -> dict[str, int]:
        """Waiting and running jobs from the queue table, finished ones from the log (a held
        `failed` job is in both: counted once, from the log)."""
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT status::text, count(*) FROM {QUEUE} WHERE status <> 'failed' GROUP BY 1")  # noqa: S608
            rows = list(cursor.fetchall())
            cursor.execute(
                f"SELECT status::text, count(DISTINCT job_id) FROM {LOG} WHERE status::text = ANY(%s) GROUP BY 1",  # noqa: S608
                [list(FINAL)],
            )
            rows += list(cursor.fetchall())
        return {status: n for status, n in rows}

    def done(self) -> int:
        return self._scalar(f"SELECT count(DISTINCT job_id) FROM {LOG} WHERE status = 'successful'")  # noqa: S608

    def span(self) -> tuple[datetime | None, datetime | None]:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT min(created) FILTER (WHERE status = 'picked'),"  # noqa: S608
                f" max(created) FILTER (WHERE status = 'successful') FROM {LOG}"
            )
            first, last = cursor.fetchone()
        return first, last

    def first_n(self, n: int) -> tuple[datetime | None, datetime | None, int]:
        """The first `picked` log row, the n-th earliest completion (a job's first `successful`
        log row: the database's clock at the flush that logged it), and how many that spans
        (fewer than n when fewer finished: then the last completion)."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH done AS (SELECT job_id, min(created) AS at FROM {LOG}"  # noqa: S608
                " WHERE status = 'successful' GROUP BY job_id)"
                f" SELECT (SELECT min(created) FROM {LOG} WHERE status = 'picked'),"
                " (SELECT at FROM done ORDER BY at OFFSET %s LIMIT 1),"
                " (SELECT max(at) FROM done), (SELECT count(*) FROM done)",
                [max(n - 1, 0)],
            )
            first, nth, last, count = cursor.fetchone()
        if nth is not None:
            return first, nth, n
        return first, last, count

    def options(self) -> dict[str, Any]:
        import inspect

        import pgqueuer
        from pgqueuer.adapters.persistence import qb

        run_defaults = {
            name: str(p.default)
            for name, p in inspect.signature(pgqueuer.run).parameters.items()
            if p.default is not inspect.Parameter.empty and name != "shutdown"
        }
        return {
            "package": f"pgqueuer {pgqueuer.__version__}",
            "driver": "asyncpg in the workers (pgqueuer's preferred driver); SyncQueries over psycopg for enqueues",
            "worker": "bench.pgq_worker: QueueManager via pgqueuer.run(), defaults",
            "run_defaults": run_defaults,
            "concurrency": (
                "C >= 2: run(max_concurrent_tasks=C, batch_size=C // 2), per process; C = 1 alone:"
                " entrypoint concurrency_limit=1 with batch_size=1; C = 1 x several processes:"
                " max_concurrent_tasks=2, batch_size=1 each (bench.pgq_worker.limits)"
            ),
            "durability": qb.DBSettings().durability.value,
            "schema": "pgq install (defaults: durable, prefix '')",
        }

    def analyze(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {', '.join(self.tables())}")


ARM = PgqueuerArm()
