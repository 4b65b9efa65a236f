"""What every arm provides. Subclasses hold only facts about their system."""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection, models, transaction
from django.db.models import Max, Min
from django.tasks import Task

Calls = Sequence[tuple[Sequence[Any], dict[str, Any]]]


class Arm:
    name: str = ""
    # False: the worker runs one task at a time, and "concurrency N" means N processes.
    native_concurrency: bool = True
    model: type[models.Model]
    status_field = "status"
    done_status = "SUCCESSFUL"
    terminal_statuses: tuple[str, ...] = ("SUCCESSFUL", "FAILED")
    bulk_path = ""  # how bulk_enqueue works, reported with the bulk cell

    # ---- workers
    def worker_argv(self, concurrency: int, ident: str, interval: float | None) -> list[str]:
        """Management command and arguments for one worker process (run by bench.launch)."""
        raise NotImplementedError

    def running_on(self, ident: str, pid: int) -> list[int]:
        """Ledger keys of the RUNNING tasks held by the worker (ident, pid)."""
        raise NotImplementedError

    def ready(self, pids: Sequence[int]) -> bool | None:
        """Whether these worker processes have registered with the database (None: the
        system keeps no such record; the harness then relies on the workers going idle)."""
        return None

    # ---- enqueue
    def bulk_enqueue(self, task: Task, calls: Calls) -> None:
        raise NotImplementedError

    def fill(self, task: Task, calls: Calls) -> None:
        """Write a backlog as fast as the arm allows (not measured). The caller holds the
        transaction, so the backlog appears to the workers all at once."""
        self.bulk_enqueue(task, calls)

    # ---- reading progress (the queue's own table, never the task's say-so)
    def tables(self) -> list[str]:
        return [self.model._meta.db_table]

    def counts(self) -> dict[str, int]:
        rows = self.model.objects.values_list(self.status_field).annotate(n=models.Count("pk"))
        return {status: n for status, n in rows}

    def done(self) -> int:
        return self.model.objects.filter(**{self.status_field: self.done_status}).count()

    def span(self) -> tuple[datetime | None, datetime | None]:
        """First start and last finish over the successful rows (the workers' own clocks)."""
        agg = self.model.objects.filter(**{self.status_field: self.done_status}).aggregate(
            first=Min("started_at"), last=Max("finished_at")
        )
        return agg["first"], agg["last"]

    def options(self) -> dict[str, Any]:
        from django.tasks import task_backends

        return {"backend": type(task_backends["default"]).__module__, "OPTIONS": task_backends["default"].options}

    # ---- housekeeping
    def reset(self, extra_tables: Sequence[str]) -> None:
        tables = [*self.tables(), *extra_tables]
        with transaction.atomic(), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
            else:
                for table in tables:
                    cursor.execute(f"DELETE FROM {table}")

    def analyze(self) -> None:
        """Fresh planner statistics after a backlog is written (PostgreSQL), the same for
        every arm: otherwise autovacuum's timing decides which plan a run gets."""
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"ANALYZE {', '.join(self.tables())}")
