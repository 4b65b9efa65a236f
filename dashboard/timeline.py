"""A task's history as the detail page shows it: events in time order and one row per attempt.

Failed attempts are Attempt rows; the successful or current attempt has no row, so it is
read off the task itself (worker_id, last_attempted_at, finished_at)."""

from dataclasses import dataclass
from datetime import datetime

from ox.models import Attempt, Status
from ox.models import TaskBase as Task  # a row of ox_task or of the archive


@dataclass
class Event:
    at: datetime
    what: str
    detail: str = ""


@dataclass
class AttemptRow:
    number: int
    outcome: str
    worker_id: str
    started_at: datetime | None
    finished_at: datetime | None
    exception_class_path: str = ""
    traceback: str = ""

    @property
    def exception_name(self) -> str:
        return self.exception_class_path.rsplit(".", 1)[-1]


def attempt_rows(task: Task, attempts: list[Attempt]) -> list[AttemptRow]:
    rows = [
        AttemptRow(a.number, a.outcome, a.worker_id, a.started_at, a.finished_at, a.exception_class_path, a.traceback)
        for a in attempts
    ]
    recorded = {a.number for a in attempts}
    if task.status in (Status.RUNNING, Status.SUCCESSFUL) and task.attempts not in recorded:
        outcome = "running" if task.status == Status.RUNNING else "succeeded"
        finished = task.finished_at if task.status == Status.SUCCESSFUL else None
        rows.append(AttemptRow(task.attempts, outcome, task.worker_id, task.last_attempted_at, finished))
    return rows


def events(task: Task, attempts: list[AttemptRow]) -> list[Event]:
    found = [Event(task.enqueued_at, "enqueued", f"queue {task.queue}, priority {task.priority}")]
    if task.run_after > task.enqueued_at and task.status == Status.READY:
        found.append(Event(task.run_after, "due", "run_after"))
    if task.started_at:
        found.append(Event(task.started_at, "started", "first attempt claimed"))
    for a in attempts:
        if a.started_at:
            found.append(Event(a.started_at, f"attempt {a.number} started", a.worker_id))
        if a.finished_at:
            found.append(Event(a.finished_at, f"attempt {a.number} {a.outcome.replace('_', ' ')}", a.exception_name))
    if task.finished_at:
        found.append(Event(task.finished_at, f"finished {task.get_status_display().lower()}"))
    found.sort(key=lambda e: e.at)
    return found
