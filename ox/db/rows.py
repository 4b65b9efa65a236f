"""The rows ox's statements write and read, the same on every database (ox.db drivers)."""

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

CLAIM_COLUMNS = (
    "id, task_path, queue, priority, args, kwargs, scheduled_for, enqueued_at, started_at,"
    " attempts, max_attempts, fence, is_async, run_after, metadata, workflow_id"
)


@dataclass(slots=True)
class Claimed:
    id: uuid.UUID
    task_path: str
    queue: str
    priority: int
    args_json: str
    kwargs_json: str
    scheduled_for: datetime | None  # the run_after it was enqueued with
    enqueued_at: datetime
    started_at: datetime | None  # when its first attempt's body started
    attempts: int
    max_attempts: int
    fence: int
    is_async: bool  # as recorded at enqueue
    run_after: datetime  # when it became due (claim order)
    metadata_json: str | None = None  # None: none given (ox.metadata)
    workflow_id: uuid.UUID | None = None  # ox.workflow: its end is joined in the same transaction
    # A workflow task's inputs (gather, result JSON) in position order, read by the claim
    # itself where it can (PostgreSQL); None: not read with the claim (ox.workflow.join.inputs).
    inputs: list[tuple[bool, str | None]] | None = None

    @property
    def key(self) -> tuple[uuid.UUID, int]:
        """This claim: a worker can hold an old and a new run of one task after a rescue,
        so everything in flight is keyed by (id, fence), never by the id alone."""
        return (self.id, self.fence)


@dataclass(slots=True)
class NewTask:
    """A task row about to be inserted."""

    id: uuid.UUID
    task_path: str
    queue: str
    priority: int
    args: list[Any]
    kwargs: dict[str, Any]
    run_after: datetime
    enqueued_at: datetime
    max_attempts: int
    is_async: bool = False
    scheduled_for: datetime | None = None
    unique_key: str | None = None  # ox.flow.unique
    unique_states: int = 0
    unique_until: datetime | None = None
    limit_key: str | None = None  # ox.flow.limits
    metadata: dict[str, Any] | None = None  # ox.metadata; None: none given


@dataclass(slots=True)
class Completion:
    id: uuid.UUID
    fence: int
    return_json: str
    started_at: datetime
    finished_at: datetime
    workflow: bool = False  # a workflow's task: its followers are counted down with it
    # The attempt's metadata as it ended (JSON text), written by the same statement; None:
    # nothing new to write (ox.metadata.end_text).
    metadata_json: str | None = None


@dataclass(slots=True)
class Failure:
    id: uuid.UUID
    fence: int
    attempt: int
    worker_id: str
    started_at: datetime | None  # None: its body never started
    finished_at: datetime
    outcome: str  # an ox.models.Outcome value
    exception_class_path: str
    traceback: str
    retry_at: datetime | None  # None: no retry, the task is finished
    workflow: bool = False  # a workflow's task: a final failure applies its policy with it


@dataclass(slots=True)
class WorkerRow:
    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    lock_key: int
    now: datetime


def read_id(value: object) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def read_opt_ts(value: object) -> datetime | None:
    return None if value is None else read_ts(value)


def read_ts(value: object) -> datetime:
    if isinstance(value, datetime):
        return value if timezone.is_aware(value) else value.replace(tzinfo=timezone.UTC)
    parsed = parse_datetime(str(value))
    assert parsed is not None, f"unparseable timestamp {value!r}"
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=timezone.UTC)


def read_json_text(value: object) -> str:
    # Django's psycopg setup loads jsonb as text, SQLite stores text: decoding (and its
    # failure) stays with the worker, per task.
    return value if isinstance(value, str) else json.dumps(value)


def read_claimed(rows: Iterable[Sequence[Any]]) -> list[Claimed]:
    claimed = [
        Claimed(
            id=read_id(r[0]),
            task_path=r[1],
            queue=r[2],
            priority=r[3],
            args_json=read_json_text(r[4]),
            kwargs_json=read_json_text(r[5]),
            scheduled_for=read_opt_ts(r[6]),
            enqueued_at=read_ts(r[7]),
            started_at=read_opt_ts(r[8]),
            attempts=r[9],
            max_attempts=r[10],
            fence=r[11],
            is_async=bool(r[12]),
            run_after=read_ts(r[13]),
            metadata_json=None if r[14] is None else read_json_text(r[14]),
            workflow_id=None if r[15] is None else read_id(r[15]),
            inputs=None if len(r) < 17 or r[16] is None else [(g == "true", res) for g, res in r[16]],
        )
        for r in rows
    ]
    # RETURNING order is unspecified on both databases: restore claim order.
    claimed.sort(key=lambda c: (-c.priority, c.run_after, c.id))
    return claimed
