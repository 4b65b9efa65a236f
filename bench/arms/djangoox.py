"""Arm "django-ox" 1.9.1 (import name django_ox). Worker: `manage.py ox_worker
--concurrency N` (threads); bulk: django_ox.bulk.enqueue_many."""

from typing import Any

from django.tasks import Task

from bench.arms.base import Arm, Calls


class DjangoOxArm(Arm):
    name = "django-ox"
    bulk_path = "django_ox.bulk.enqueue_many(task, calls): bulk_create in one transaction"
    terminal_statuses = ("SUCCESSFUL", "FAILED", "LOST", "DISCARDED")

    def __init__(self) -> None:
        from django_ox.models import OxTask

        self.model = OxTask

    def worker_argv(self, concurrency: int, ident: str, interval: float | None, queue: str = "default") -> list[str]:
        argv = ["ox_worker", "--concurrency", str(concurrency), "--queues", queue, "-v", "0"]
        return argv + (["--interval", str(interval)] if interval else [])

    def running_on(self, ident: str, pid: int) -> list[int]:
        # django-ox worker ids are "<host>-<pid>-<random>"
        rows = self.model.objects.filter(status="RUNNING", locked_by__contains=f"-{pid}-").values_list("args")
        return [args[0] for (args,) in rows if args]

    def bulk_enqueue(self, task: Task, calls: Calls) -> None:
        from django_ox.bulk import enqueue_many

        enqueue_many(task, calls)

    def options(self) -> dict[str, Any]:
        return {**super().options(), "LOCK_TIMEOUT_default_s": 300}


ARM = DjangoOxArm()
