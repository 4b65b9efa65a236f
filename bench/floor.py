"""The two lower rungs of the enqueue_bare_row cell (bench.bare_row): "limit", the limit arm's
thin INSERT (bench.limit_sql) run on bare psycopg, and "floor", that same INSERT behind Django's
Tasks API: `Task.enqueue()` through a backend that does only what the API itself asks of every
backend. So no django.tasks backend that writes one durable row per `Task.enqueue()` in
autocommit (as ox does) can enqueue faster than "floor" on this server; one that defers or
batches its writes (at on_commit, in a pipeline, with synchronous_commit off) is not bounded by it.

What Django asks, and FloorBackend does, per call: `Task.enqueue()` looks the backend up
(`task_backends[alias]`) and calls its `enqueue`; the backend writes its row, builds the
`TaskResult` it must return (a frozen dataclass whose `__post_init__` normalises the arguments
to JSON) and sends `task_enqueued` (django.tasks connects a receiver that logs at DEBUG). What it
leaves out, that Django's own backends and ox do: `validate_task` again on each call (Django
already validated the task once, when `using()` made it), an id that finds its row (a random
UUID string stands in), a row of its own (it writes the limit's constant payload, not the task's
path and arguments). So "floor" / "limit" is the most such a backend can reach of the limit,
and ox / "floor" what ox reaches of that.

The backend is put into `django.tasks.task_backends` under an alias of its own for the cell's
run only (`with floor_task(...)`), so no settings module has to name it; the two rungs write a
table of the cell's own (the limit's table and index under another name, made afresh for the
block and dropped after it), so a limit arm's table in the same database is never touched.
"""

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from django.tasks import Task, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskResult, TaskResultStatus
from django.tasks.signals import task_enqueued
from django.utils import timezone

from bench import limit_sql
from bench.limit_sql import PAYLOAD

ALIAS = "bench-floor"
# The limit's table, index and INSERT, under a name of the cell's own.
TABLE = "bench_floor_task"
DDL = tuple(statement.replace(limit_sql.TABLE, TABLE) for statement in limit_sql.DDL)
INSERT = limit_sql.INSERT.replace(limit_sql.TABLE, TABLE)


class FloorBackend(BaseTaskBackend):
    """A django.tasks backend that writes the limit's thin row on a bare psycopg connection and
    does nothing else the API does not require."""

    supports_defer = True
    supports_async_task = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any], conn: Any) -> None:
        super().__init__(alias, params)
        self.conn = conn

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.conn.execute(INSERT, (PAYLOAD,), prepare=True)
        result = TaskResult(
            task=task,
            id=str(uuid.uuid4()),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result


@contextmanager
def floor_task(task: Task, conn: Any) -> Iterator[Task]:
    """`task` bound to a FloorBackend on `conn` (a bare autocommit psycopg connection), for the
    block only, with the cell's table made afresh (one a killed run left is dropped first) and
    dropped after. Cleanup that fails (a broken connection) never hides the block's own error."""
    conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    for statement in DDL:
        conn.execute(statement)
    task_backends[ALIAS] = FloorBackend(ALIAS, {}, conn)
    failed = False
    try:
        yield task.using(backend=ALIAS)
    except BaseException:
        failed = True
        raise
    finally:
        # Settings changed inside the block (override_settings of TASKS) forget the alias.
        with suppress(AttributeError):
            del task_backends[ALIAS]
        try:
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        except Exception:
            if not failed:
                raise


def empty(conn: Any) -> None:
    conn.execute(f"TRUNCATE {TABLE}")


def rows(conn: Any) -> int:
    return int(conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0])  # noqa: S608


def limit_calls(conn: Any, count: int) -> float:
    """`count` of the limit's INSERTs, each its own autocommit transaction; seconds."""
    started = time.perf_counter()
    for _ in range(count):
        conn.execute(INSERT, (PAYLOAD,), prepare=True)
    return time.perf_counter() - started
