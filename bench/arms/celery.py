"""Arm "celery" (PyPI celery 5.7.0 on Redis; pinned in bench/requirements-celery.txt, its agent and
workers run in bench/.venv-celery). The queue is a Redis list (kombu's Redis transport), enqueues
are `task.delay()` (a Redis publish: **not** part of any database transaction), the workers are
`celery -A bench.celery_app worker --pool prefork --concurrency C` (Celery's default pool: a main
process and C forked pool processes, one task at a time each), and this class reads progress from
Celery's result backend (Redis too) and the ledger.

Where the counts come from (never from inside a task): the worker writes a task's result record
(`celery-task-meta-<id>`: status SUCCESS / FAILURE, date_done on the worker's clock) after the
task returns, and acknowledges the message after that (acks_late). Done = SUCCESS records; the
drain's span runs from the first pool process's first task start (bench.celery_tasks) to the last
date_done. Waiting messages are the list `celery`; delivered but unacknowledged ones sit in the
hash `unacked` until acknowledged, or until kombu restores them once they are older than the
transport's visibility_timeout (3,600 s by default), or when their worker shuts down warm.
"""

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.tasks import Task

from bench import procs
from bench.arms.base import Arm, Calls

META = "celery-task-meta-"
QUEUE, UNACKED = "celery", "unacked"


def redis_client() -> Any:
    """The arm's Redis database (settings.REDIS_URL: db 5 unless BENCH_CELERY_REDIS_DB says otherwise)."""
    import redis
    from django.conf import settings

    return redis.Redis.from_url(settings.REDIS_URL)


class CeleryArm(Arm):
    name = "celery"
    launcher = "celery"  # `python -m celery ...` on the celery venv's interpreter
    bulk_path = "none: task.apply_async() per task"
    done_status = "SUCCESS"
    terminal_statuses = ("SUCCESS", "FAILURE")
    job_overrides = {
        "enqueue_seq": "bench.celery_jobs:enqueue_seq",
        "dispatch": "bench.celery_jobs:dispatch",
    }

    def __init__(self) -> None:
        self.redis = redis_client()
        self.ids: dict[int, str] = {}  # ledger key -> Celery task id (the fills of this agent)
        self.trees: dict[str, set[int]] = {}  # ident -> the worker's main pid and pool pids seen

    # ---- workers
    def worker_argv(self, concurrency: int, ident: str, interval: float | None, queue: str = "default") -> list[str]:
        # queue: Celery's default queue ("celery"). --pool prefork is the default, named for the record.
        return [
            "-A",
            "bench.celery_app",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(concurrency),
            "--hostname",
            f"{ident}@%h",
            "--loglevel",
            "WARNING",
        ]

    def running_on(self, ident: str, pid: int) -> list[int]:
        """Keys whose latest execution started in this worker's process tree and has no result
        yet. Celery keeps no "running on" record in Redis, so the ledger (which pool process
        started each task) stands in for it; the tree is remembered for after the kill."""
        tree = self.trees.setdefault(ident, set())
        if os.path.exists(f"/proc/{pid}"):
            tree |= {pid} | procs.descendants(pid)
        with connection.cursor() as cursor:
            cursor.execute("SELECT task_key, pid, t FROM bench_ledger ORDER BY t")
            latest: dict[int, int] = {}
            for key, run_pid, _t in cursor.fetchall():
                latest[key] = run_pid
        keys = [key for key, run_pid in latest.items() if run_pid in tree]
        if not keys:
            return []
        metas = self.redis.mget([META + self.ids.get(key, "?") for key in keys])
        return [key for key, meta in zip(keys, metas, strict=True) if meta is None]

    def ready(self, pids: Sequence[int]) -> bool | None:
        return None  # the harness waits for the workers to go idle (after mingle's boot exchange)

    # ---- enqueue
    def bulk_enqueue(self, task: Task, calls: Calls) -> None:
        from bench.celery_tasks import BY_NAME

        celery_task = BY_NAME[task.func.__name__]
        for args, kwargs in calls:
            sent = celery_task.apply_async(args=list(args), kwargs=dict(kwargs))
            if args:
                self.ids[args[0]] = sent.id

    def fill(self, task: Task, calls: Calls) -> None:
        """One publish per task (Celery has no bulk send), before the caller's transaction commits
        and outside it: the workers may start on the first messages while the rest are sent. The
        drain's span starts at the first task start, so it includes that overlap."""
        self.bulk_enqueue(task, calls)

    def fill_fast(self, task: Task, total: int) -> None:
        raise NotImplementedError("no fast fill for celery yet (bench.plan_peers: the backlog cells)")

    # ---- reading progress
    def _metas(self) -> list[dict[str, Any]]:
        keys = list(self.redis.scan_iter(match=META + "*", count=1000))
        out = []
        for start in range(0, len(keys), 1000):
            out += [json.loads(raw) for raw in self.redis.mget(keys[start : start + 1000]) if raw]
        return out

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for meta in self._metas():
            counts[meta["status"]] = counts.get(meta["status"], 0) + 1
        counts["queued"] = int(self.redis.llen(QUEUE))
        counts["unacked"] = int(self.redis.hlen(UNACKED))
        return {k: v for k, v in counts.items() if v}

    def done(self) -> int:
        return sum(1 for meta in self._metas() if meta["status"] == "SUCCESS")

    def span(self) -> tuple[datetime | None, datetime | None]:
        from bench.celery_tasks import FIRST_START_KEY

        starts = [float(v) for v in self.redis.hvals(FIRST_START_KEY)]
        ends = [datetime.fromisoformat(m["date_done"]) for m in self._metas() if m["status"] == "SUCCESS"]
        first = datetime.fromtimestamp(min(starts), UTC) if starts else None
        last = max(ends) if ends else None
        if last is not None and last.tzinfo is None:
            last = last.replace(tzinfo=UTC)
        return first, last

    def first_n(self, n: int) -> tuple[datetime | None, datetime | None, int]:
        raise NotImplementedError("the backlog cells do not run celery yet")

    def options(self) -> dict[str, Any]:
        from importlib import metadata

        from bench.celery_app import app

        conf = app.conf
        names = (
            "broker_url",
            "result_backend",
            "task_acks_late",
            "task_reject_on_worker_lost",
            "worker_prefetch_multiplier",
            "task_serializer",
            "result_expires",
            "broker_transport_options",
            "task_default_queue",
            "worker_pool",
        )
        server = self.redis.info("server")
        persistence = self.redis.info("persistence")
        return {
            "package": f"celery {metadata.version('celery')}, kombu {metadata.version('kombu')},"
            f" redis-py {metadata.version('redis')}",
            "conf": {name: str(conf.get(name)) for name in names},
            "visibility_timeout_s": 3600,
            "redis": {
                "version": server.get("redis_version"),
                "aof_enabled": persistence.get("aof_enabled"),
                "rdb_save": str(self.redis.config_get("save").get("save")),
            },
            "worker": "python -m celery -A bench.celery_app worker --pool prefork --concurrency C --hostname ID@%h",
        }

    # ---- housekeeping
    def reset(self, extra_tables: Sequence[str]) -> None:
        """Flush the arm's Redis database (only that one) and truncate the ledger."""
        self.redis.flushdb()
        self.ids.clear()
        self.trees.clear()
        if extra_tables:
            with connection.cursor() as cursor:
                cursor.execute(f"TRUNCATE {', '.join(extra_tables)} RESTART IDENTITY")

    def analyze(self) -> None:
        return None  # nothing of Celery's is in the database


ARM = CeleryArm()
