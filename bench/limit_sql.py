"""The "limit" arm's SQL and its bare worker loop: the least a durable PostgreSQL task queue can
do, written from first principles on psycopg 3 with no framework, so every other arm's figure
also reads as a fraction of what this server allows (bench/README.md, "The limit").

No Django here: the worker process (bench.limit_worker) and tests/test_bench_limit.py import it
as it is; the agent side (bench.arms.limit, bench.limit_jobs) uses the same statements.

The table holds what a queue cannot do without: an id to claim by, a status, the task's payload,
a time it may run after, and the one index a claim needs (ready rows in run order). The two
timestamps are set by the database's clock at claim and at completion; the measurement reads the
drain's span from them, and a queue that rescues lost work needs the first anyway.
"""

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bench.limit_tasks import TASKS

TABLE = "limit_task"
# How many rows one claim takes. ox claims up to its PREFETCH ceiling (100) beyond the free slot
# for short tasks, so a bound that claimed fewer would not be a bound on ox's drain; a larger
# batch still would make it faster (bench/README.md gives figures for 10 and 1,000). Tasks that
# take time (the workload cells) are claimed one per loop instead, async ones up to ASYNC_SLOTS
# per process (bench.limit_jobs.batch_for).
BATCH = 100
# Async tasks one worker process runs at a time: ox's runworker default (--async-concurrency 100,
# whatever --concurrency), so the limit bounds ox's async path as ox runs it.
ASYNC_SLOTS = 100
# An idle loop polls this often. It never sleeps while rows are waiting, and the drain's span
# starts at the first claim, so this only decides how soon an idle worker notices a backlog.
IDLE_POLL_S = 0.1
# The task a row names, and the payload every enqueue writes (the same shape for every row).
PAYLOAD = json.dumps({"task": "noop", "args": [], "kwargs": {}})

DDL = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} ("
    " id bigserial PRIMARY KEY,"
    " status text NOT NULL DEFAULT 'ready',"  # ready -> running -> done
    " payload jsonb NOT NULL,"
    " run_after timestamptz NOT NULL DEFAULT now(),"
    " started_at timestamptz,"
    " finished_at timestamptz)",
    # Partial: only ready rows are ever looked for, so the index stays as small as the backlog.
    f"CREATE INDEX IF NOT EXISTS {TABLE}_ready ON {TABLE} (run_after, id) WHERE status = 'ready'",
)
# One row per statement, every other column at its default (status ready, run_after now()).
INSERT = f"INSERT INTO {TABLE} (payload) VALUES (%s::jsonb)"  # noqa: S608
# A backlog in one statement: one row per element of a JSON array of payloads.
INSERT_MANY = f"INSERT INTO {TABLE} (payload) SELECT value FROM jsonb_array_elements(%s::jsonb)"  # noqa: S608
# The bulk enqueue: the rows streamed by COPY, one payload per line (copy_payloads). Measured here
# (10,000 rows, one transaction, 12 rounds each, interleaved): COPY 315,000 rows/s against 243,000
# for INSERT_MANY; unnest(%s::jsonb[]) and a 10,000-tuple VALUES list were slower still (~90,000).
COPY = f"COPY {TABLE} (payload) FROM STDIN"
# The backlog cells' fill: the row one enqueue writes, total times, in one statement (every row's
# run_after is the transaction's now(), so the claim takes them in id order).
INSERT_SERIES = f"INSERT INTO {TABLE} (payload) SELECT %s::jsonb FROM generate_series(1, %s)"  # noqa: S608
# Claim: the oldest ready rows no other worker holds, marked running, in one statement (its own
# transaction in autocommit: the row locks last only as long as the statement). `id = ANY(ARRAY(
# subquery))` rather than `id IN (subquery)`: PostgreSQL 15 plans the IN form as a hash semi-join
# over a sequential scan of the whole table (measured here: 2.5 ms for 100 rows of a 10,000-row
# backlog, growing with the backlog), the ARRAY form as one primary-key probe per claimed row.
CLAIM = (
    f"UPDATE {TABLE} SET status = 'running', started_at = now()"  # noqa: S608
    f" WHERE id = ANY(ARRAY(SELECT id FROM {TABLE} WHERE status = 'ready' AND run_after <= now()"
    "  ORDER BY run_after, id LIMIT %s FOR UPDATE SKIP LOCKED))"
    " RETURNING id, payload"
)
# Completion: the whole batch in one statement.
COMPLETE = f"UPDATE {TABLE} SET status = 'done', finished_at = now() WHERE id = ANY(%s)"  # noqa: S608


async def _gather(coroutines: list[Any]) -> None:
    await asyncio.gather(*coroutines)


def create_schema(conn: Any) -> None:
    """The table and its index on a psycopg connection (committed by the caller)."""
    for statement in DDL:
        conn.execute(statement)


def copy_payloads(cursor: Any, payloads: Iterable[dict[str, Any]]) -> None:
    """COPY the rows (bench.limit_sql.COPY) through a psycopg cursor, or Django's cursor wrapper
    over one; each payload serialised here, as an application's call would be."""
    with cursor.copy(COPY) as copy:
        for payload in payloads:
            copy.write_row((json.dumps(payload),))


@dataclass
class Loop:
    """One bare worker loop on its own autocommit psycopg connection: claim a batch, run each
    task, mark the batch done; poll while the queue is empty. Stops between batches once `stop`
    is set or `deadline` (time.monotonic()) has passed, so a batch it claimed is always finished
    and marked before it returns."""

    url: str
    batch: int = BATCH
    stop: threading.Event = field(default_factory=threading.Event)
    deadline: float = float("inf")
    statements: int = 0  # every statement sent (each an autocommit transaction of its own)
    ran: list[int] = field(default_factory=list)  # ids run, when keep_ids (the tests read them)
    keep_ids: bool = False
    idle_poll: float = IDLE_POLL_S
    # Async tasks (io_bound_async) run on this loop thread's own event loop, made at the first:
    # a claimed batch's async tasks all at once (asyncio.gather), as an async worker runs the
    # coroutines it holds; its sync tasks one after another before them.
    _events: asyncio.AbstractEventLoop | None = field(default=None, repr=False)

    def run_batch(self, payloads: list[dict[str, Any]]) -> None:
        coroutines = []
        for payload in payloads:
            function = TASKS[payload["task"]]
            if inspect.iscoroutinefunction(function):
                coroutines.append(function(*payload["args"], **payload["kwargs"]))
            else:
                function(*payload["args"], **payload["kwargs"])
        if coroutines:
            if self._events is None:
                self._events = asyncio.new_event_loop()
            self._events.run_until_complete(_gather(coroutines))

    def run(self, until_empty: bool = False) -> None:
        """until_empty: return at the first empty claim (the tests' drain) instead of polling."""
        import psycopg

        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                self._drain(conn, until_empty)
        finally:
            if self._events is not None:
                self._events.close()

    def _drain(self, conn: Any, until_empty: bool) -> None:
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            rows = conn.execute(CLAIM, (self.batch,)).fetchall()
            self.statements += 1
            if not rows:
                if until_empty:
                    return
                self.stop.wait(self.idle_poll)
                continue
            self.run_batch([payload for _, payload in rows])
            ids = [task_id for task_id, _ in rows]
            conn.execute(COMPLETE, (ids,))
            self.statements += 1
            if self.keep_ids:
                self.ran.extend(ids)
