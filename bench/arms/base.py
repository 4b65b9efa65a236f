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
    # The module a worker process runs: a manage.py for the Django arms (bench.launch).
    launcher = "bench.launch"
    # Jobs of this arm that replace the shared ones of the same name (bench.jobs, bench.scale):
    # job name -> "module:function". Empty for the Django arms.
    job_overrides: dict[str, str] = {}
    # The enqueue_p* cells' producer processes (bench.producer) build the arm's single enqueue,
    # the call its enqueue_seq times, from this "module:function". The Django Tasks backends
    # share the default, `noop.enqueue()`; the other arms name a function of their jobs module.
    producer_hook = "bench.producer:django_tasks"

    # ---- workers
    def worker_argv(self, concurrency: int, ident: str, interval: float | None, queue: str = "default") -> list[str]:
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

    def fill_fast(self, task: Task, total: int) -> None:
        """A backlog of `total` no-argument calls in two statements, for the backlog cells (1M
        rows through the ORM would take longer than the measurement): one row written the
        arm's own way (`fill`), then copied total-1 times by one INSERT ... SELECT over
        generate_series (SQLite, MariaDB: a recursive CTE). Copies differ only in the primary key: the
        template's UUID with its last 48 bits replaced by the copy's number, so ids stay unique
        and the time-ordered prefix of a UUIDv7 is kept. The caller holds the transaction."""
        if self.model.objects.exists():
            raise RuntimeError("fill_fast needs an empty table (reset first)")
        self.fill(task, [((), {})])
        if total <= 1:
            return
        qn = connection.ops.quote_name
        pk = self.model._meta.pk.column
        columns = [f.column for f in self.model._meta.concrete_fields]
        table = qn(self.model._meta.db_table)
        if connection.vendor == "postgresql":
            new_id = "overlay(src.{pk}::text placing lpad(to_hex(g), 12, '0') from 25)::uuid"
            source = "generate_series(1, %s) AS s(g)"
            prefix = ""
        elif connection.vendor == "mysql":  # MariaDB's own UUID type (its text has the dashes)
            new_id = "CAST(CONCAT(SUBSTR(CAST(src.{pk} AS CHAR), 1, 24), LOWER(LPAD(HEX(g), 12, '0'))) AS UUID)"
            source = "s"
            prefix = ""
        else:  # Django keeps a UUID on SQLite as 32 hex digits
            new_id = "substr(src.{pk}, 1, 20) || printf('%%012x', g)"
            source = "s"
            prefix = "WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < %s) "
        exprs = [new_id.format(pk=qn(pk)) if c == pk else f"src.{qn(c)}" for c in columns]
        statement = (
            f"{prefix}INSERT INTO {table} ({', '.join(qn(c) for c in columns)})"
            f" SELECT {', '.join(exprs)} FROM {table} AS src CROSS JOIN {source}"
        )
        if connection.vendor == "mysql":
            statement = (
                f"INSERT INTO {table} ({', '.join(qn(c) for c in columns)})"
                " WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < %s)"
                f" SELECT {', '.join(exprs)} FROM {table} AS src CROSS JOIN {source}"
            )
        with connection.cursor() as cursor:
            if connection.vendor == "mysql":  # the server's default stops a CTE at 1,000 rows
                cursor.execute("SET SESSION max_recursive_iterations = %s", [total])
            cursor.execute(statement, [total - 1])

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

    def first_n(self, n: int) -> tuple[datetime | None, datetime | None, int]:
        """First start over the successful rows, the n-th earliest finish among them, and how
        many of them that spans (fewer than n when fewer finished: then the last finish)."""
        done = self.model.objects.filter(**{self.status_field: self.done_status})
        first = done.aggregate(first=Min("started_at"))["first"]
        finishes = list(done.order_by("-finished_at").values_list("finished_at", flat=True)[:1])
        nth = list(done.order_by("finished_at").values_list("finished_at", flat=True)[n - 1 : n])
        if nth:
            return first, nth[0], n
        return first, finishes[0] if finishes else None, done.count()

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
