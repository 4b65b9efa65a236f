"""Arm "procrastinate" (PyPI procrastinate, pinned in bench/requirements.txt), through its
Django contrib app (`procrastinate.contrib.django`, which runs on Django 6.1: `manage.py check`
and its migrations pass). Not a Django Tasks backend: the workers are `python -m
bench.procrastinate_worker` processes (what `manage.py procrastinate worker` runs), enqueues are
procrastinate's `task.defer()` / `task.batch_defer()` on the contrib's DjangoConnector (Django's
connection, so inside the caller's atomic() block when there is one), and this class reads
progress from procrastinate's own tables.

Where the counts come from (never from inside a task):
- every job is a row of `procrastinate_jobs` (status todo / doing / succeeded / failed /
  cancelled / aborted); a finished job stays (delete_jobs defaults to never);
- a trigger writes `procrastinate_events` rows (deferred, started, succeeded, ...) with the
  database's clock; the jobs table has no timestamps of its own.
So done = jobs of the benchmark's tasks with status 'succeeded'; the drain's span runs from the
first `started` to the last `succeeded` event (the database's clock, where the Django arms' rows
carry the workers'; the same machine). The periodic retry_stalled_jobs task's own jobs
(bench.procrastinate_tasks) are left out of every count.
"""

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import connection
from django.tasks import Task

from bench.arms.base import Arm, Calls

JOBS, EVENTS, WORKERS, PERIODIC = (
    "procrastinate_jobs",
    "procrastinate_events",
    "procrastinate_workers",
    "procrastinate_periodic_defers",
)
FINAL = ("succeeded", "failed", "cancelled", "aborted")
# The benchmark's own task functions, by the harness's name, with their parameter names:
# procrastinate tasks take keyword arguments only.
PARAMS = {
    "noop": (),
    "stamp": ("key",),
    "ledger": ("key", "sleep_ms"),
    "cpu_bound": (),
    "io_bound": (),
    "io_bound_async": (),
    "mixed": (),
}
# The per-row NOTIFY trigger of procrastinate's schema (one pg_notify per inserted job): off for
# the backlog cells' copy statement only (fill_fast says why).
NOTIFY_TRIGGER = "procrastinate_jobs_notify_queue_job_inserted_v1"
# The columns procrastinate's own defer statement writes (procrastinate_defer_jobs_v1); the
# rest (id, status 'todo', attempts 0, ...) are the table's defaults, as for a deferred job.
DEFER_COLUMNS = ("queue_name", "task_name", "priority", "lock", "queueing_lock", "args", "scheduled_at")


def as_kwargs(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """A harness call (positional and keyword arguments) as procrastinate task keywords."""
    names = PARAMS[name]
    if len(args) > len(names):
        raise TypeError(f"{name} takes {len(names)} arguments, got {len(args)}")
    return {**dict(zip(names, args, strict=False)), **kwargs}


class ProcrastinateArm(Arm):
    name = "procrastinate"
    launcher = "bench.procrastinate_worker"
    bulk_path = "task.batch_defer(*kwargs): one statement (procrastinate_defer_jobs_v1)"
    status_field = "status"
    done_status = "succeeded"
    terminal_statuses = FINAL
    job_overrides = {
        "enqueue_seq": "bench.procrastinate_jobs:enqueue_seq",
        "dispatch": "bench.procrastinate_jobs:dispatch",
        "drain": "bench.procrastinate_jobs:drain",
        "kill": "bench.procrastinate_jobs:kill",
        "enqueue_atomic": "bench.procrastinate_jobs:enqueue_atomic",
        "bulk": "bench.procrastinate_jobs:bulk",
    }
    producer_hook = "bench.procrastinate_jobs:producer"  # the enqueue_p* cells' producers (bench.producer)

    def __init__(self) -> None:
        # The run's log dir (set by bench.procrastinate_jobs before workers start): each worker
        # writes its procrastinate worker id there (bench.procrastinate_worker.id_file).
        self.log_dir: Path | None = None
        # ident -> job ids seen `doing` under that worker: a worker pruned from
        # procrastinate_workers (by a worker booting 30 s after the other's last heartbeat)
        # leaves its jobs `doing` with worker_id NULL; they are still that dead worker's.
        self.seen: dict[str, set[int]] = {}

    # ---- workers
    def worker_argv(self, concurrency: int, ident: str, interval: float | None, queue: str = "default") -> list[str]:
        # interval: no cell sets one (procrastinate wakes on LISTEN/NOTIFY and polls every 5 s,
        # its default). queue: the worker runs on "default" (bench.procrastinate_worker).
        # concurrency 0 (drain_defaults): no flag, procrastinate's own default.
        return [*(["--concurrency", str(concurrency)] if concurrency else []), "--ident", ident]

    def worker_id(self, ident: str) -> int | None:
        from bench.procrastinate_worker import id_file

        if self.log_dir is None:
            return None
        try:
            return int(json.loads(id_file(self.log_dir / f"{ident}.sql.json", ident).read_text())["worker_id"])
        except (OSError, ValueError, KeyError):
            return None  # not registered yet

    def running_on(self, ident: str, pid: int) -> list[int]:
        worker_id = self.worker_id(ident)
        seen = self.seen.setdefault(ident, set())
        if worker_id is None and not seen:
            return []
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, args FROM {JOBS} WHERE status = 'doing'"  # noqa: S608
                " AND (worker_id = %s OR (worker_id IS NULL AND id = ANY(%s)))",
                [worker_id, list(seen)],
            )
            rows = cursor.fetchall()
        keys = []
        for job_id, args in rows:
            seen.add(job_id)
            args = json.loads(args) if isinstance(args, str) else args
            if "key" in args:
                keys.append(args["key"])
        return keys

    def ready(self, pids: Sequence[int]) -> bool | None:
        return None  # the harness waits for the workers to go idle, as for pgqueuer

    # ---- enqueue
    @staticmethod
    def task_for(task: Task) -> Any:
        from bench.procrastinate_tasks import BY_NAME

        return BY_NAME[task.func.__name__]

    def bulk_enqueue(self, task: Task, calls: Calls) -> None:
        name = task.func.__name__
        self.task_for(task).batch_defer(*(as_kwargs(name, a, dict(k)) for a, k in calls))

    def fill(self, task: Task, calls: Calls) -> None:
        """procrastinate's own bulk defer (one statement), on Django's connection: inside the
        caller's transaction."""
        self.bulk_enqueue(task, calls)

    def fill_fast(self, task: Task, total: int) -> None:
        """The backlog cells' fill (not timed), in the caller's transaction: one job deferred
        procrastinate's way (batch_defer, as `fill`), then copied total-1 times by one INSERT ...
        SELECT of the columns procrastinate's defer statement writes; ids come from the table's
        sequence, after the template's. Every copy goes through the table's row triggers as a
        deferred job does (its `deferred` event row), except the per-row NOTIFY, switched off for
        this one statement (ALTER TABLE ... DISABLE / ENABLE TRIGGER inside the transaction: no
        other session ever sees it off). A backlog that grew over time had each notification
        consumed as its job arrived; a million of them at one commit would measure the fill, not
        the claim. The template's NOTIFY stays: at commit the idle workers wake as for one more
        job on a big backlog (ox's trigger, per statement, likewise sends one)."""
        # The workers are up: the periodic retry task's own job may be there already (not ours).
        if self.counts():
            raise RuntimeError("fill_fast needs an empty table (reset first)")
        name = task.func.__name__
        (template,) = self.task_for(task).batch_defer(as_kwargs(name, (), {}))
        if total <= 1:
            return
        columns = ", ".join(DEFER_COLUMNS)
        copied = ", ".join(f"src.{c}" for c in DEFER_COLUMNS)
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {JOBS} DISABLE TRIGGER {NOTIFY_TRIGGER}")
            cursor.execute(
                f"INSERT INTO {JOBS} ({columns}) SELECT {copied}"  # noqa: S608
                f" FROM {JOBS} AS src CROSS JOIN generate_series(1, %s) WHERE src.id = %s",
                [total - 1, template],
            )
            cursor.execute(f"ALTER TABLE {JOBS} ENABLE TRIGGER {NOTIFY_TRIGGER}")

    # ---- reading progress
    def tables(self) -> list[str]:
        return [JOBS, EVENTS, PERIODIC, WORKERS]

    def _bench_tasks(self) -> list[str]:
        from bench.procrastinate_tasks import BENCH_TASK_NAMES

        return list(BENCH_TASK_NAMES)

    def counts(self) -> dict[str, int]:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT status::text, count(*) FROM {JOBS} WHERE task_name = ANY(%s) GROUP BY 1",  # noqa: S608
                [self._bench_tasks()],
            )
            return {status: n for status, n in cursor.fetchall()}

    def done(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT count(*) FROM {JOBS} WHERE status = 'succeeded' AND task_name = ANY(%s)",  # noqa: S608
                [self._bench_tasks()],
            )
            return cursor.fetchone()[0]

    def span(self) -> tuple[datetime | None, datetime | None]:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT min(e.at) FILTER (WHERE e.type = 'started'),"  # noqa: S608
                f" max(e.at) FILTER (WHERE e.type = 'succeeded')"
                f" FROM {EVENTS} e JOIN {JOBS} j ON j.id = e.job_id WHERE j.task_name = ANY(%s)",
                [self._bench_tasks()],
            )
            first, last = cursor.fetchone()
        return first, last

    def first_n(self, n: int) -> tuple[datetime | None, datetime | None, int]:
        """From the events (the database's clock): the first `started`, the n-th earliest
        `succeeded` of the benchmark's jobs, and how many that spans (fewer than n finished:
        the last `succeeded` and their number)."""
        tasks = self._bench_tasks()
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT e.type::text, e.at FROM {EVENTS} e JOIN {JOBS} j ON j.id = e.job_id"  # noqa: S608
                " WHERE e.type IN ('started', 'succeeded') AND j.task_name = ANY(%s)",
                [tasks],
            )
            rows = cursor.fetchall()
        starts = [at for kind, at in rows if kind == "started"]
        finishes = sorted(at for kind, at in rows if kind == "succeeded")
        first = min(starts) if starts else None
        if len(finishes) >= n:
            return first, finishes[n - 1], n
        return first, finishes[-1] if finishes else None, len(finishes)

    def options(self) -> dict[str, Any]:
        import inspect
        from importlib import metadata

        from procrastinate import worker
        from procrastinate.contrib.django import settings as contrib_settings

        defaults = {
            name: repr(p.default)
            for name, p in inspect.signature(worker.Worker.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty and name not in ("additional_context",)
        }
        from bench.procrastinate_tasks import RETRY_CRON

        return {
            "package": f"procrastinate {metadata.version('procrastinate')}",
            "integration": "procrastinate.contrib.django (INSTALLED_APPS), schema by manage.py migrate",
            "worker": "bench.procrastinate_worker: what `manage.py procrastinate worker --concurrency C"
            " --queues default` runs (app.run_worker_async on DjangoConnector.get_worker_connector())",
            "worker_defaults": defaults,
            "settings": {
                name: getattr(contrib_settings.settings, name)
                for name in ("DATABASE_ALIAS", "IMPORT_PATHS", "WORKER_DEFAULTS", "PERIODIC_DEFAULTS")
            },
            "enqueue": "task.defer() on the DjangoConnector (Django's connection)",
            "retry_stalled_jobs": f"periodic task from procrastinate's docs, cron {RETRY_CRON!r},"
            " get_stalled_jobs() default seconds_since_heartbeat=30",
        }

    def analyze(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {', '.join(self.tables())}")


ARM = ProcrastinateArm()
