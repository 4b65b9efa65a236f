"""Arm "django-tasks-db" 0.13.0. Worker: `manage.py db_worker`, one task at a time per
process, so concurrency N is N processes. It has no bulk enqueue: the bulk cell runs N
sequential task.enqueue() calls inside one atomic() block."""

from typing import Any

from django.db import transaction
from django.tasks import Task
from django.utils import timezone

from bench.arms.base import Arm, Calls


class TasksDbArm(Arm):
    name = "django-tasks-db"
    native_concurrency = False
    bulk_path = "no bulk API: sequential task.enqueue() calls inside one atomic()"

    def __init__(self) -> None:
        from django_tasks_db.models import DBTaskResult

        self.model = DBTaskResult

    def worker_argv(self, concurrency: int, ident: str, interval: float | None, queue: str = "default") -> list[str]:
        assert concurrency == 1, "db_worker has no concurrency option"
        argv = ["db_worker", "--queue-name", queue, "--no-reload", "--no-startup-delay", "-v", "0"]
        argv += ["--worker-id", ident]
        return argv + (["--interval", str(interval)] if interval else [])

    def running_on(self, ident: str, pid: int) -> list[int]:
        rows = self.model.objects.filter(status="RUNNING").values_list("worker_ids", "args_kwargs")
        return [ak["args"][0] for wids, ak in rows if wids and wids[-1] == ident and ak["args"]]

    def bulk_enqueue(self, task: Task, calls: Calls) -> None:
        with transaction.atomic():
            for args, kwargs in calls:
                task.enqueue(*args, **kwargs)

    def fill(self, task: Task, calls: Calls) -> None:
        # The rows backend.enqueue() would write (see DatabaseBackend._task_to_db_task and the
        # pre_save handler that turns a missing run_after into "9999-01-01"), in bulk.
        from django.utils.json import normalize_json
        from django_tasks_db.models import get_date_max

        now = timezone.now()
        rows = [
            self.model(
                args_kwargs=normalize_json({"args": list(args), "kwargs": dict(kwargs)}),
                priority=task.priority,
                task_path=task.module_path,
                queue_name=task.queue_name,
                run_after=get_date_max(),
                backend_name="default",
                enqueued_at=now,
            )
            for args, kwargs in calls
        ]
        self.model.objects.bulk_create(rows, batch_size=1000)

    def options(self) -> dict[str, Any]:
        return {**super().options(), "worker": "db_worker, one task at a time per process"}


ARM = TasksDbArm()
