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
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import connection
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
        self.seen: dict[str, set[str]] = {}

    # ---- workers
    def worker_argv(self, concurrency: int, ident: str, interval: float | None, queue: str = "default") -> list[str]:
        # interval: no cell sets one (dj-queue polls every 0.1 s and LISTENs on PostgreSQL).
        # queue: the default worker entry takes every queue ("*").
        return ["dj_queue", "--config", str(overlay(concurrency))]

    def running_on(self, ident: str, pid: int) -> list[int]:
        """Keys of the jobs claimed by the supervisor started as `pid` or by a process it forked."""
        seen = self.seen.setdefault(ident, set())
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT c.job_id::text, j.payload FROM {CLAIMED} c JOIN {JOBS} j ON j.id = c.job_id"  # noqa: S608
                f" LEFT JOIN {PROCESSES} p ON p.id = c.process_id"
                f" LEFT JOIN {PROCESSES} s ON s.id = p.supervisor_id"
                " WHERE p.pid = %s OR s.pid = %s OR (c.process_id IS NULL AND c.job_id::text = ANY(%s))",
                [pid, pid, list(seen)],
            )
            rows = cursor.fetchall()
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
    def bulk_enqueue(self, task: Task, calls: Calls) -> None:
        task.get_backend().enqueue_all([(task, list(a), dict(k)) for a, k in calls])

    def fill_fast(self, task: Task, total: int) -> None:
        raise NotImplementedError("no fast fill for dj-queue yet (bench.plan_peers: the backlog cells)")

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
        return agg["first"], agg["last"]

    def first_n(self, n: int) -> tuple[datetime | None, datetime | None, int]:
        raise NotImplementedError("the backlog cells do not run dj-queue yet")

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
