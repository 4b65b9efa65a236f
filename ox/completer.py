"""Outcomes waiting to be written. Successes go in batches (one statement for many tasks,
usually riding on the next claim); failures one transaction each. Nothing is dropped when
the database is away: a batch leaves the buffer only once written."""

import json
import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.tasks import TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished

from ox import sql
from ox.backoff import retry_delay
from ox.conf import OxOptions
from ox.execution import Finished
from ox.logs import event, task_fields
from ox.models import Outcome

logger = logging.getLogger("ox.worker")


class Completer:
    def __init__(self, worker_id: str, options: OxOptions, sender: type) -> None:
        self.worker_id = worker_id
        self.options = options
        self.sender = sender
        self.successes: list[Finished] = []
        self.failures: list[Finished] = []
        self.flush_due: float | None = None  # monotonic
        self.fenced_out = 0
        self.retry_due: float = 0.0  # monotonic: the latest retry this worker scheduled

    def __bool__(self) -> bool:
        return bool(self.successes or self.failures)

    def add(self, finished: Finished) -> None:
        if finished.kind == "successful":
            self.successes.append(finished)
            if self.flush_due is None:
                self.flush_due = time.monotonic() + self.options.completion_flush_ms / 1000
        else:
            self.failures.append(finished)

    def due(self, idle: bool) -> bool:
        """Flush now? Failures at once; successes when the batch is full, the flush delay is
        up, or nothing else is running (no later claim to ride on)."""
        if self.failures:
            return True
        if not self.successes:
            return False
        full = len(self.successes) >= self.options.completion_batch
        return full or idle or time.monotonic() >= (self.flush_due or 0)

    def take_successes(self) -> list[sql.Completion]:
        return [sql.Completion(f.claimed.id, f.claimed.fence, f.return_json, f.finished_at) for f in self.successes]

    def written(self, ids: set[Any]) -> None:
        """The current success batch went through (ids: those not fenced out)."""
        batch, self.successes, self.flush_due = self.successes, [], None
        for f in batch:
            if f.claimed.id in ids:
                self._signal(f, TaskResultStatus.SUCCESSFUL)
            else:
                self._fenced(f)

    def flush_failures(self, conn: Any) -> None:
        while self.failures:
            self._write_failure(conn, self.failures[0])
            self.failures.pop(0)

    def flush(self, conn: Any) -> None:
        self.flush_failures(conn)
        if self.successes:
            self.written(sql.complete(conn, self.take_successes()))

    def _write_failure(self, conn: Any, finished: Finished) -> None:
        claimed = finished.claimed
        retry_at: datetime | None = None
        note = ""
        if finished.kind != Outcome.CANCELLED and finished.retryable and claimed.attempts < claimed.max_attempts:
            exc = finished.exception or Exception(finished.kind)
            delay, note = retry_delay(finished.task, exc, finished.result, claimed.attempts, self.options)
            if delay is not None:
                retry_at = finished.finished_at + timedelta(seconds=delay)
                self.retry_due = max(self.retry_due, time.monotonic() + delay)
        failure = sql.Failure(
            id=claimed.id,
            fence=claimed.fence,
            attempt=claimed.attempts,
            worker_id=self.worker_id,
            started_at=finished.started_at,
            finished_at=finished.finished_at,
            outcome=finished.kind,
            exception_class_path=finished.exception_class_path,
            traceback=finished.traceback + (f"\n[ox] {note}\n" if note else ""),
            retry_at=retry_at,
        )
        if not sql.fail(conn, failure):
            self._fenced(finished)
            return
        text = finished.traceback.strip()
        last_line = text.splitlines()[-1] if text else finished.kind
        then = f"retry at {retry_at.isoformat()}" if retry_at else "no retry"
        event(
            logger,
            logging.WARNING if retry_at else logging.ERROR,
            f"attempt {finished.kind}, {then}: {last_line}",
            **task_fields(claimed),
            worker=self.worker_id,
            outcome=finished.kind,
        )
        if retry_at is None:
            self._signal(finished, TaskResultStatus.FAILED)

    def _fenced(self, finished: Finished) -> None:
        self.fenced_out += 1
        event(
            logger,
            logging.WARNING,
            "fenced out: the lease was taken back, this outcome is not written",
            **task_fields(finished.claimed),
            worker=self.worker_id,
            outcome=finished.kind,
        )

    def _signal(self, finished: Finished, status: TaskResultStatus) -> None:
        """task_finished, sent once the outcome is durable."""
        result = finished.result
        if result is None:
            return
        object.__setattr__(result, "status", status)
        object.__setattr__(result, "finished_at", finished.finished_at)
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", json.loads(finished.return_json))
        else:
            error = TaskError(exception_class_path=finished.exception_class_path, traceback=finished.traceback)
            result.errors.append(error)
        try:
            task_finished.send(self.sender, task_result=result)
        except Exception as exc:  # noqa: BLE001
            event(
                logger,
                logging.ERROR,
                f"a task_finished receiver raised {exc!r}",
                **task_fields(finished.claimed),
                worker=self.worker_id,
            )
