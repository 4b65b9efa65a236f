"""Periodic tasks: every worker fires due ticks, the unique (schedule, tick_at) row in ox_tick
makes each tick fire once.

Firing a tick is one transaction on the worker's connection: INSERT the tick row unless it
exists (ON CONFLICT DO NOTHING; on MariaDB that one statement's duplicate-key error), and
only if that inserted a row, INSERT the task. The worker that loses the race inserts
nothing and enqueues nothing; a rolled-back enqueue leaves no tick.

Missed ticks (no worker ran at the time): when a worker finds the latest due tick was not
fired, it fires that one tick once, however late, and records on its row how many older
ticks were skipped (`missed`); older ticks never run. With `"missed": "skip"` a tick found
more than LATE_AFTER past its time is recorded (task_id NULL) and not run. A schedule with
no tick rows yet (just added, or never fired) starts with its next tick, however recent its
latest one: otherwise any `every` of 60 s or less, or `* * * * *`, would fire the moment it
is added, and a schedule's first run would depend on when a worker happened to look.

The dashboard reads `schedule_status()`.
"""

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.tasks import Task as DjangoTask
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.module_loading import import_string

from ox import clock, sql
from ox.db import driver
from ox.enqueue import new_task
from ox.models import Tick
from ox.results import ready_result
from ox.schedules import Schedule, parse_schedules
from ox.txn import atomic_on

logger = logging.getLogger("ox.periodic")

LATE_AFTER = timedelta(seconds=60)  # a tick fired later than this counts as late
KEEP_TICKS = 100  # tick rows kept per schedule


def resolve_task(path: str) -> DjangoTask:
    """The Task at a dotted path; ImportError or TypeError when there is none."""
    obj = import_string(path)
    if not isinstance(obj, DjangoTask):
        raise TypeError(f"{path} is a {type(obj).__name__}, not a Task (decorate it with @task)")
    return obj


class Ticker:
    """A worker's periodic duty: fire every schedule's due tick, once across all workers."""

    def __init__(self, backend: Any, schedules: list[Schedule]) -> None:
        self.backend = backend
        self.schedules = schedules
        self.known: dict[str, datetime] = {}  # newest tick this worker knows is handled

    def run(self, conn: BaseDatabaseWrapper, now: datetime) -> None:
        for schedule in self.schedules:
            due = schedule.latest_tick(now)
            if due is None or (schedule.name in self.known and self.known[schedule.name] >= due):
                continue
            if schedule.name not in self.known:
                last = last_tick_at(conn, schedule.name)
                if last is None or last >= due:
                    self.known[schedule.name] = max(due, last or due)
                    continue
            before = self.known.get(schedule.name)
            self.known[schedule.name] = due
            try:
                self.fire(conn, schedule, due, now)
            except DatabaseError:
                # Not fired: try this tick again once the worker has reconnected.
                if before is None:
                    del self.known[schedule.name]
                else:
                    self.known[schedule.name] = before
                raise
            except Exception as exc:  # noqa: BLE001  (a task that no longer imports: report once per tick)
                logger.error("schedule %s: tick %s not fired: %s", schedule.name, due.isoformat(), exc)

    def fire(self, conn: BaseDatabaseWrapper, schedule: Schedule, due: datetime, now: datetime) -> bool:
        """Fire one tick; False when another worker already had it."""
        skip = schedule.missed == "skip" and now - due > LATE_AFTER
        task = row = None
        if not skip:
            task = resolve_task(schedule.task_path).using(backend=self.backend.alias)
            if schedule.queue is not None:
                task = task.using(queue_name=schedule.queue)
            if schedule.priority is not None:
                task = task.using(priority=schedule.priority)
            self.backend.validate_task(task)
            row = new_task(self.backend, task, schedule.args, schedule.kwargs, now)
        with atomic_on(conn) as cursor:
            cursor.execute(
                "SELECT MAX(tick_at) FROM ox_tick WHERE schedule = %s AND tick_at < %s",
                [schedule.name, _ts(conn, due)],
            )
            previous = cursor.fetchone()[0]
            missed = schedule.ticks_between(_read_ts(previous), due) if previous is not None else 0
            if not driver(conn).insert_new(
                conn,
                cursor,
                "INSERT INTO ox_tick (schedule, tick_at, fired_at, task_id, missed) VALUES (%s, %s, %s, %s, %s)",
                [schedule.name, _ts(conn, due), _ts(conn, now), _id(conn, row.id if row else None), missed],
            ):
                return False
            if row is not None:
                sql.insert_tasks(conn, [row])
            _forget_old_ticks(conn, cursor, schedule.name)
        level = logging.WARNING if skip or missed else logging.INFO
        logger.log(
            level,
            "schedule %s: tick %s %s%s",
            schedule.name,
            due.isoformat(),
            "skipped (late)" if skip else f"fired task {row.id if row else ''}",
            f", {missed} earlier ticks missed" if missed else "",
        )
        if row is not None and task is not None:
            task_enqueued.send(type(self.backend), task_result=ready_result(row, task, self.backend.alias))
        return True


def _ts(conn: BaseDatabaseWrapper, value: datetime) -> object:
    return conn.ops.adapt_datetimefield_value(value)


def _id(conn: BaseDatabaseWrapper, value: uuid.UUID | None) -> object:
    return None if value is None else driver(conn).id(value)


def _read_ts(value: object) -> datetime:
    if isinstance(value, datetime):
        return value if timezone.is_aware(value) else value.replace(tzinfo=timezone.UTC)
    parsed = datetime.fromisoformat(str(value))
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=timezone.UTC)


def _forget_old_ticks(conn: BaseDatabaseWrapper, cursor: Any, name: str) -> None:
    # The oldest tick kept read first: a DELETE cannot read its own table on MariaDB.
    cursor.execute(
        "SELECT tick_at FROM ox_tick WHERE schedule = %s ORDER BY tick_at DESC LIMIT 1 OFFSET %s",
        [name, KEEP_TICKS - 1],
    )
    oldest = cursor.fetchone()
    if oldest is not None:
        cursor.execute("DELETE FROM ox_tick WHERE schedule = %s AND tick_at < %s", [name, oldest[0]])


def last_tick_at(conn: BaseDatabaseWrapper, name: str) -> datetime | None:
    with conn.cursor() as cursor:
        cursor.execute("SELECT MAX(tick_at) FROM ox_tick WHERE schedule = %s", [name])
        value = cursor.fetchone()[0]
    return _read_ts(value) if value is not None else None


# ---------------------------------------------------------------- for the dashboard


@dataclass(frozen=True)
class ScheduleStatus:
    name: str
    backend: str  # TASKS alias that declares it
    task_path: str
    description: str  # "cron 0 3 * * *" or "every 60s"
    last_tick_at: datetime | None  # the newest recorded tick, run or skipped
    last_run_at: datetime | None  # when the newest tick that enqueued a task fired
    last_task_id: uuid.UUID | None
    missed_count: int  # ticks skipped before the newest recorded one
    due_tick_at: datetime | None  # the latest tick at or before now
    next_tick_at: datetime | None
    missed: bool  # the due tick is overdue and unrecorded, or the newest tick was skipped


def declared_schedules() -> list[tuple[str, Schedule]]:
    """(backend alias, schedule) for every ox backend's SCHEDULES."""
    found = []
    for alias, params in getattr(settings, "TASKS", {}).items():
        if params.get("BACKEND") == "ox.backend.OxBackend":
            found += [(alias, s) for s in parse_schedules(params.get("OPTIONS", {}).get("SCHEDULES", {}))]
    return found


def schedule_status(now: datetime | None = None, using: str | None = None) -> list[ScheduleStatus]:
    """Each declared schedule with its last and next run, missed ticks flagged. Two small
    indexed queries per schedule; `using` picks a database alias (default: the router's
    read database for ox models, so a replica router applies)."""
    now = now or clock.now_on(using)
    ticks = Tick.objects.using(using) if using else Tick.objects.all()
    statuses = []
    for alias, schedule in declared_schedules():
        mine = ticks.filter(schedule=schedule.name).order_by("-tick_at")
        newest = mine.first()
        ran = newest if newest is not None and newest.task_id else mine.exclude(task_id=None).first()
        due = schedule.latest_tick(now)
        overdue = (
            newest is not None and due is not None and due > newest.tick_at and now - due > LATE_AFTER
        )  # a brand-new schedule (no rows) is not expected to have fired its past ticks
        statuses.append(
            ScheduleStatus(
                name=schedule.name,
                backend=alias,
                task_path=schedule.task_path,
                description=schedule.description,
                last_tick_at=newest.tick_at if newest else None,
                last_run_at=ran.fired_at if ran else None,
                last_task_id=ran.task_id if ran else None,
                missed_count=newest.missed if newest else 0,
                due_tick_at=due,
                next_tick_at=schedule.next_tick(now),
                missed=overdue or (newest is not None and newest.task_id is None),
            )
        )
    return statuses
