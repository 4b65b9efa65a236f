"""Arm "ox": this repository. Worker: `manage.py runworker --concurrency N` (threads);
bulk: ox.enqueue_many (multi-row INSERTs)."""

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from django.tasks import Task

from bench.arms.base import Arm, Calls


class OxArm(Arm):
    name = "ox"
    bulk_path = "ox.enqueue_many(task, calls): multi-row INSERTs of 1,000 rows"
    terminal_statuses = ("SUCCESSFUL", "FAILED", "CANCELLED")

    def __init__(self) -> None:
        from ox.models import Task as TaskRow

        self.model = TaskRow

    def worker_argv(self, concurrency: int, ident: str, interval: float | None, queue: str = "default") -> list[str]:
        # Concurrency 0: ox's own defaults (the cell drain_defaults).
        argv = [
            "runworker",
            *(["--concurrency", str(concurrency)] if concurrency > 0 else []),
            "--queues",
            queue,
            "-v",
            "0",
        ]
        return argv + (["--interval", str(interval)] if interval else [])

    def running_on(self, ident: str, pid: int) -> list[int]:
        # ox worker ids are "<host>:<pid>:<random>"
        rows = self.model.objects.filter(status="RUNNING", worker_id__contains=f":{pid}:").values_list("args")
        return [args[0] for (args,) in rows if args]

    def ready(self, pids: Sequence[int]) -> bool | None:
        from ox.models import Worker

        return Worker.objects.filter(pid__in=list(pids), stopped_at__isnull=True).count() >= len(pids)

    def bulk_enqueue(self, task: Task, calls: Calls) -> None:
        import ox

        ox.enqueue_many(task, calls)

    def tables(self) -> list[str]:
        from ox.models import ArchivedTask, Attempt, Step, Worker
        from ox.workflow.models import Edge, Workflow

        # The counts read ox_task only: ox's default ARCHIVE_AFTER moves a finished task to
        # ox_task_archive 5 minutes after it finished, and cells count their tasks within
        # seconds of the drain (the caps are 60-300 s; only a failing drain waits its 600 s
        # timeout), so every finished task is still there. Reset clears the archive too, and
        # the workflows' tables: left out, every chain round added its 8,000 edges to the
        # next one's, never analyzed (this server runs without autovacuum), and a claim's
        # read of its tasks' inputs became a scan of all of them (20261204T090753Z's c4 chain).
        models = (self.model, ArchivedTask, Attempt, Worker, Step, Workflow, Edge)
        return [m._meta.db_table for m in models]

    def options(self) -> dict[str, Any]:
        from django.tasks import task_backends

        backend = task_backends["default"]
        return {"backend": "ox.backend.OxBackend", "OPTIONS": backend.options, "in_force": asdict(backend.config)}


ARM = OxArm()
