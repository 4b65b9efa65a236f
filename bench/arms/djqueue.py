"""Arm "dj-queue" (PyPI dj-queue, a Django Tasks backend after Rails' Solid Queue; pinned in
bench/requirements.txt). Enqueues are Django's `task.enqueue()` (dj-queue writes the job at once,
inside the caller's transaction), the worker is `manage.py dj_queue` (its supervisor, which forks
one worker process, 1 dispatcher, and a scheduler when there is recurring or cleanup work), and
this class reads progress from dj-queue's tables.

Where the counts come from (never from inside a task): a job is a row of `dj_queue_jobs`, with one
row of an execution table for its state: `dj_queue_ready_executions`, `_claimed_executions` (with
the claiming process), `_failed_executions`, `_scheduled_executions`, `_blocked_executions`. A
finished job's claimed row is deleted and `finished_at` is set (the worker's clock); a successful
job keeps its row (`preserve_finished_jobs`, for a day). So done = jobs with `finished_at` and no
failed execution. dj-queue keeps no start time once a job finished (the claimed row held it), so
the drain's span runs from the backlog's commit (bench.jobs.drain: never before it) to the last
`finished_at`: it includes the first wake-up, which ox's span (first start -> last finish) does not.
"""

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.db.models import Max, Min
from django.tasks import Task

from bench.arms.base import Arm, Calls

VAR = Path(__file__).resolve().parent.parent / "var" / "djqueue"
JOBS, READY, CLAIMED, FAILED, PROCESSES = (
    "dj_queue_jobs",
    "dj_queue_ready_executions",
    "dj_queue_claimed_executions",
    "dj_queue_failed_executions",
    "dj_queue_processes",
)


def overlay(threads: int) -> Path:
    """The TOML overlay (dj-queue's `--config`) that sets the one worker entry's threads; its
    other keys keep their defaults (queues "*", 1 process, 0.1 s polling, prefetch multiplier 2)."""
    VAR.mkdir(parents=True, exist_ok=True)
    path = VAR / f"workers-threads{threads}.toml"
    if not path.exists():
        tmp = path.with_suffix(f".{id(path)}.tmp")
        tmp.write_text(f"# written by bench.arms.djqueue\n[[workers]]\nthreads = {threads}\n")
        tmp.replace(path)
    return path


class DjQueueArm(Arm):
    name = "dj-queue"
    launcher = "bench.djqueue_launch"
    bulk_path = "backend.enqueue_all([(task, args, kwargs), ...]): dj-queue's bulk enqueue"
    done_status = "successful"
    terminal_statuses = ("successful", "failed")

    def __init__(self) -> None:
        from dj_queue.models import Job

        self.model = Job
        # ident -> job ids seen claimed by that worker's process tree: a process row pruned after
        # its heartbeat expired leaves its claimed rows with process NULL; they are still the dead one's.
        self.seen: dict[str, set[Any]] = {}
        self.committed_at: datetime | None = None  # when the last fill's transaction had committed

    # ---- workers
    def worker_argv(self, concurrency: int, ident: str, interval: float | None, queue: str = "default") -> list[str]:
        # interval: no cell sets one (dj-queue polls every 0.1 s and LISTENs on PostgreSQL).
        # queue: the default worker entry takes every queue ("*").
        # concurrency 0 (drain_defaults): no overlay, dj-queue's own worker entry (3 threads).
        return ["dj_queue", "--config", str(overlay(concurrency))] if concurrency else ["dj_queue"]

    def running_on(self, ident: str, pid: int) -> list[int]:
        """Keys of the jobs claimed by the supervisor started as `pid` or by a process it forked.
        Through the ORM, so the same on PostgreSQL, SQLite and MariaDB."""
        from dj_queue.models import ClaimedExecution
        from django.db.models import Q

        seen = self.seen.setdefault(ident, set())
        rows = ClaimedExecution.objects.filter(
            Q(process__pid=pid) | Q(process__supervisor__pid=pid) | Q(process__isnull=True, job_id__in=list(seen))
        ).values_list("job_id", "job__payload")
        keys = []
        for job_id, payload in rows:
            seen.add(job_id)
            data = json.loads(payload) if isinstance(payload, str) else payload
            args, kwargs = data.get("args") or [], data.get("kwargs") or {}
            key = args[0] if args else kwargs.get("key")
            if key is not None:
                keys.append(key)
        return keys

    def ready(self, pids: Sequence[int]) -> bool | None:
        return None  # the harness waits for the supervisor and its children to go idle

    # ---- enqueue
    def fill(self, task: Task, calls: Calls) -> None:
        super().fill(task, calls)
        self.stamp_commit()

    def stamp_commit(self) -> None:
        """Note when the caller's transaction has committed (transaction.on_commit runs after
        COMMIT returns): dj-queue keeps no start time, so the spans start there (span, first_n).
        The drain and backlog jobs take their own clock before COMMIT, which would count the
        commit itself (4.4 s for a 1M-job backlog and its 1M ready executions, run
        20261204T225454Z) against dj-queue. No job can start before the commit (its rows are invisible
        until then), and the stamp follows it by the commit's reply."""
        self.committed_at = None
        transaction.on_commit(lambda: setattr(self, "committed_at", datetime.now(UTC)))

    def bulk_enqueue(self, task: Task, calls: Calls) -> None:
        task.get_backend().enqueue_all([(task, list(a), dict(k)) for a, k in calls])

    def fill_fast(self, task: Task, total: int) -> None:
        """Arm.fill_fast (one job written by enqueue_all, then copied by INSERT ... SELECT), plus
        what dj-queue's enqueue writes beside a job: its ready execution. The template's ready row
        is copied for every other job, in job id order (claims go by ready id, so the copies are
        claimed in that order); these two tables are all a plain enqueue writes (checked: one
        `noop` enqueue leaves rows in dj_queue_jobs and dj_queue_ready_executions only)."""
        super().fill_fast(task, total)
        if total <= 1:
            return
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {READY} (job_id, backend_alias, queue_name, priority, created_at,"  # noqa: S608
                " latency_started_at)"
                " SELECT j.id, r.backend_alias, r.queue_name, r.priority, r.created_at, r.latency_started_at"
                f" FROM {JOBS} j CROSS JOIN {READY} r WHERE j.id <> r.job_id ORDER BY j.id"
            )
            cursor.execute(f"SELECT (SELECT count(*) FROM {JOBS}), (SELECT count(*) FROM {READY})")  # noqa: S608
            jobs, ready = cursor.fetchone()
        if jobs != total or ready != total:
            raise RuntimeError(f"fill_fast wrote {jobs} jobs and {ready} ready executions, {total} asked")
        self.stamp_commit()

    # ---- reading progress
    def tables(self) -> list[str]:
        from django.apps import apps

        return [m._meta.db_table for m in apps.get_app_config("dj_queue").get_models() if m._meta.managed]

    def counts(self) -> dict[str, int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT (SELECT count(*) FROM dj_queue_ready_executions),"
                " (SELECT count(*) FROM dj_queue_claimed_executions),"
                " (SELECT count(*) FROM dj_queue_failed_executions),"
                " (SELECT count(*) FROM dj_queue_scheduled_executions),"
                " (SELECT count(*) FROM dj_queue_blocked_executions)"
            )
            ready, claimed, failed, scheduled, blocked = cursor.fetchone()
        counts = {"ready": ready, "claimed": claimed, "failed": failed, "scheduled": scheduled, "blocked": blocked}
        counts["successful"] = self.done()
        return {k: v for k, v in counts.items() if v}

    def _successful(self) -> Any:
        return self.model.objects.filter(finished_at__isnull=False, failed_execution__isnull=True)

    def done(self) -> int:
        return self._successful().count()

    def span(self) -> tuple[datetime | None, datetime | None]:
        """(the first job's enqueue time, the last finish): the drain takes the later of the first
        value and its commit, so the span starts at the commit (see the module docstring)."""
        agg = self._successful().aggregate(first=Min("created_at"), last=Max("finished_at"))
        return self._start(agg["first"]), agg["last"]

    def _start(self, first: datetime | None) -> datetime | None:
        # The later of the first enqueue and the commit's return (stamp_commit), when known.
        if first is None or self.committed_at is None:
            return first
        return max(first, self.committed_at)

    def first_n(self, n: int) -> tuple[datetime | None, datetime | None, int]:
        """(the first job's enqueue time, the n-th earliest finish, how many that spans): as span(),
        the backlog job starts the span at its commit at the latest of the two (dj-queue keeps no
        start time). Fewer than n finished: the last finish and their number."""
        done = self._successful()
        first = done.aggregate(first=Min("created_at"))["first"]
        nth = list(done.order_by("finished_at").values_list("finished_at", flat=True)[n - 1 : n])
        if nth:
            return self._start(first), nth[0], n
        return self._start(first), done.aggregate(last=Max("finished_at"))["last"], done.count()

    def reset(self, extra_tables: Sequence[str]) -> None:
        """Arm.reset; on MariaDB with foreign key checks off for the deletes (its checks are
        immediate, and the jobs table comes before the execution tables that point at it;
        PostgreSQL truncates with CASCADE, SQLite checks Django's deferred keys at the commit)."""
        if connection.vendor != "mysql":
            super().reset(extra_tables)
            return
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION foreign_key_checks = 0")
        try:
            super().reset(extra_tables)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET SESSION foreign_key_checks = 1")

    def options(self) -> dict[str, Any]:
        from dataclasses import asdict, is_dataclass
        from importlib import metadata

        from dj_queue.config import load_backend_config

        config = load_backend_config("default")
        return {
            "package": f"dj-queue {metadata.version('dj-queue')}",
            "backend": "dj_queue.backend.DjQueueBackend",
            "OPTIONS": {},
            "resolved": json.loads(json.dumps(asdict(config) if is_dataclass(config) else vars(config), default=str)),
            "worker": "manage.py dj_queue --config <overlay: [[workers]] threads = C> (mode fork, the default)",
        }


ARM = DjQueueArm()
