"""Outcomes waiting to be written. Successes go in batches (one statement for many tasks,
usually riding on the next claim); failures one transaction each. Nothing is dropped when
the database is away: a batch leaves the buffer only once written. A batch is never
hostage to one row: when the database refuses a batch for what is in it, the batch is
split until the refused row is found; that task fails with the database's reason and the
rest are written."""

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import DataError, IntegrityError, OperationalError
from django.tasks import TaskResultStatus

from ox import sql
from ox.conf import OxOptions
from ox.exceptions import class_path
from ox.execution import Finished
from ox.logs import event, task_fields
from ox.models import Outcome
from ox.signals_out import FinishedSignals
from ox.storable import NotStorable, storable_text

logger = logging.getLogger("ox.worker")

# What a statement fails with when a row's content is the problem (not the connection).
REFUSED = (DataError, IntegrityError, ValueError, TypeError, OverflowError)
# A --batch worker waits for the retries it scheduled only if they are due this soon.
BATCH_RETRY_HORIZON = 60.0
CLASS_PATH_MAX = 255  # ox_attempt.exception_class_path


def refused(exc: BaseException) -> bool:
    """Did the database refuse a statement for what was in it (rather than lose the
    connection)? PostgreSQL's "program limit exceeded" (SQLSTATE class 54: a value or a
    statement too big) arrives as an OperationalError but is about the content."""
    if isinstance(exc, REFUSED):
        return True
    sqlstate = getattr(exc.__cause__, "sqlstate", None) or ""
    return isinstance(exc, OperationalError) and sqlstate.startswith("54")


class Completer:
    def __init__(self, worker_id: str, options: OxOptions, sender: type) -> None:
        self.worker_id = worker_id
        self.options = options
        self.signals = FinishedSignals(sender, worker_id)
        self.successes: list[Finished] = []
        self.failures: list[Finished] = []
        self.flush_due: float | None = None  # monotonic
        self.fenced_out = 0
        self.retry_due: float = 0.0  # monotonic: the latest retry this worker scheduled
        # A workflow task's end was written: its followers may be READY (ox.workflow.join).
        self.followed = False

    def __bool__(self) -> bool:
        return bool(self.successes or self.failures)

    def pending(self) -> list[Finished]:
        return [*self.successes, *self.failures]

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
        return _completions(self.successes)

    def take_followed(self) -> bool:
        followed, self.followed = self.followed, False
        return followed

    def written(self, keys: set[Any]) -> None:
        """The current success batch went through (keys: the claims not fenced out)."""
        batch, self.successes, self.flush_due = self.successes, [], None
        for f in batch:
            if f.key in keys:
                self.followed = self.followed or f.claimed.workflow_id is not None
                self.signals.send(f, TaskResultStatus.SUCCESSFUL)
            else:
                self._fenced(f)

    def flush_failures(self, conn: Any) -> None:
        while self.failures:
            self._write_failure(conn, self.failures[0])
            self.failures.pop(0)

    def flush(self, conn: Any) -> None:
        self.flush_failures(conn)
        if self.successes:
            self.isolate(conn, lambda batch: sql.complete(conn, batch))

    def isolate(self, conn: Any, write: Callable[[list[sql.Completion]], set[Any]]) -> None:
        """Write the success batch; if the database refuses it for its content, split it
        until the refused rows are found, fail those tasks, write the rest."""
        batch = self.successes
        written: set[Any] = set()
        poison: list[tuple[Finished, Exception]] = []

        def attempt(part: list[Finished]) -> None:
            try:
                written.update(write(_completions(part)))
            except Exception as exc:
                if not refused(exc):
                    raise
                if len(part) == 1:
                    poison.append((part[0], exc))
                    return
                middle = len(part) // 2
                attempt(part[:middle])
                attempt(part[middle:])

        attempt(batch)
        self.written(written)
        for finished, exc in poison:
            # Queued first: whatever the metadata write below meets, the failure is kept.
            self.failures.append(_refused(finished, exc))
            if finished.metadata_json is not None:
                # It rode on the refused statement: written on its own, before the failure.
                try:
                    sql.save_metadata(conn, finished.claimed, finished.metadata_json, finished.started_at)
                except Exception:  # noqa: BLE001  (the failure stands; a lost connection shows below)
                    logger.exception("ox: task %s: its metadata could not be saved at its end", finished.claimed.id)
        self.flush_failures(conn)

    def _write_failure(self, conn: Any, finished: Finished) -> None:
        claimed = finished.claimed
        retry_at = None
        if finished.retry_in is not None and finished.kind != Outcome.CANCELLED:
            retry_at = finished.finished_at + timedelta(seconds=finished.retry_in)
        note = f"\n[ox] {finished.note}\n" if finished.note else ""
        path = storable_text(finished.exception_class_path)
        failure = sql.Failure(
            id=claimed.id,
            fence=claimed.fence,
            attempt=claimed.attempts,
            worker_id=self.worker_id,
            started_at=finished.started_at,
            finished_at=finished.finished_at,
            outcome=finished.kind,
            exception_class_path=path if len(path) <= CLASS_PATH_MAX else path[: CLASS_PATH_MAX - 3] + "...",
            traceback=storable_text(finished.traceback + note),
            retry_at=retry_at,
            workflow=claimed.workflow_id is not None,
        )
        try:
            status = sql.fail(conn, failure)
        except Exception as exc:
            if not refused(exc):
                raise
            # The error text itself was refused: keep what can be stored of it.
            failure.traceback = f"[ox] the database refused this attempt's traceback: {storable_text(repr(exc))[:2000]}"
            failure.exception_class_path = failure.exception_class_path.encode("ascii", "replace").decode()[:100]
            try:
                status = sql.fail(conn, failure)
            except Exception as again:
                if not refused(again):
                    raise
                # Nothing of it can be stored: the lease runs out and the rescuer records the
                # attempt as lost. Better than a worker that writes nothing else, ever.
                message = f"could not record this attempt's failure at all: {again!r}; left to the rescuer"
                event(logger, logging.ERROR, message, **task_fields(claimed), worker=self.worker_id)
                return
        if status is None:
            self._fenced(finished)
            return
        self.followed = self.followed or (status != "READY" and claimed.workflow_id is not None)
        if status == "READY" and retry_at is not None and (finished.retry_in or 0) <= BATCH_RETRY_HORIZON:
            self.retry_due = max(self.retry_due, time.monotonic() + (finished.retry_in or 0))
        text = finished.traceback.strip()
        last_line = storable_text(text.splitlines()[-1] if text else finished.kind)
        then = f"retry at {retry_at.isoformat()}" if status == "READY" and retry_at else f"now {status}"
        event(
            logger,
            logging.WARNING if status == "READY" else logging.ERROR,
            f"attempt {finished.kind}, {then}: {last_line}",
            **task_fields(claimed),
            worker=self.worker_id,
            outcome=finished.kind,
        )
        if status != "READY":
            self.signals.send(finished, TaskResultStatus.FAILED)

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


def _completions(part: list[Finished]) -> list[sql.Completion]:
    return [
        sql.Completion(
            f.claimed.id,
            f.claimed.fence,
            f.return_json,
            f.started_at,
            f.finished_at,
            f.claimed.workflow_id is not None,
            f.metadata_json,
        )
        for f in part
    ]


def _refused(finished: Finished, exc: Exception) -> Finished:
    """A success whose result the database refused: the task fails, without retry (the body
    would return the same value again)."""
    reason = NotStorable(f"the database refused the task's return value: {storable_text(str(exc)).strip()}")
    event(
        logger,
        logging.ERROR,
        f"result refused by the database: {reason}",
        **task_fields(finished.claimed),
        outcome=Outcome.FAILED,
    )
    return Finished(
        claimed=finished.claimed,
        kind=Outcome.FAILED,
        started_at=finished.started_at,
        finished_at=finished.finished_at,
        exception_class_path=class_path(NotStorable),
        traceback=f"{class_path(NotStorable)}: {reason}\n",
        exception=reason,
        task=finished.task,
        result=finished.result,
        retryable=False,
    )
