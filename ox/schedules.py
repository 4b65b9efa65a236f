"""Periodic schedules as declared in a backend's OPTIONS["SCHEDULES"], and their ticks.

    "SCHEDULES": {
        "nightly-report": {"task": "demo.tasks.add", "cron": "0 3 * * *", "args": [1, 2]},
        "heartbeat": {"task": "demo.tasks.add", "every": 60, "kwargs": {"a": 1, "b": 1}},
    }

Keys: `task` (dotted path of a Django Task), exactly one of `cron` (5-field expression) or
`every` (whole seconds, or a timedelta), then optional `args`, `kwargs`, `queue`,
`priority`, `timezone` (IANA name the cron is read in; default UTC) and `missed`
("latest": a tick found late still runs, once; "skip": it is recorded and not run).

A tick is a due time every worker computes alike: cron minutes in the schedule's time
zone, or multiples of `every` seconds since the Unix epoch. Workers agree on tick times
without talking to each other; the database's unique (schedule, tick_at) row does the rest.
"""

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.core.exceptions import ImproperlyConfigured

from ox.cron import Cron, CronError

KEYS = {"task", "cron", "every", "args", "kwargs", "queue", "priority", "timezone", "missed"}
MISSED_POLICIES = ("latest", "skip")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
COUNT_LIMIT = 100_000  # counting skipped cron ticks stops here


class ScheduleError(ImproperlyConfigured):
    """A schedule that cannot work; `check_id` is the system check that reports it."""

    def __init__(self, message: str, check_id: str = "ox.E002") -> None:
        super().__init__(message)
        self.check_id = check_id


@dataclass(frozen=True)
class Schedule:
    name: str
    task_path: str
    cron: Cron | None = None
    every: timedelta | None = None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None  # None: the task's own queue
    priority: int | None = None
    tz: tzinfo = UTC
    missed: str = "latest"

    @property
    def description(self) -> str:
        if self.cron is not None:
            zone = "" if self.tz is UTC else f" ({self.tz})"
            return f"cron {self.cron.expression}{zone}"
        assert self.every is not None
        return f"every {int(self.every.total_seconds())}s"

    def latest_tick(self, now: datetime) -> datetime | None:
        """The latest tick at or before `now` (aware, UTC)."""
        if self.every is not None:
            return EPOCH + ((now - EPOCH) // self.every) * self.every
        assert self.cron is not None
        local = now.astimezone(self.tz).replace(tzinfo=None)
        for _ in range(3):  # a wall time in a DST gap can land after `now`: look further back
            found = self.cron.previous(local)
            if found is None:
                return None
            tick = found.replace(tzinfo=self.tz).astimezone(UTC)
            if tick <= now:
                return tick
            local = found - timedelta(minutes=1)
        return None

    def next_tick(self, now: datetime) -> datetime | None:
        """The first tick strictly after `now` (aware, UTC)."""
        if self.every is not None:
            return EPOCH + ((now - EPOCH) // self.every + 1) * self.every
        assert self.cron is not None
        local = now.astimezone(self.tz).replace(tzinfo=None)
        for _ in range(3):
            found = self.cron.next(local)
            if found is None:
                return None
            tick = found.replace(tzinfo=self.tz).astimezone(UTC)
            if tick > now:
                return tick
            local = found
        return None

    def ticks_between(self, after: datetime, before: datetime) -> int:
        """How many ticks fall strictly between two ticks of this schedule."""
        if before <= after:
            return 0
        if self.every is not None:
            return max(0, (before - after) // self.every - 1)
        count = 0
        tick = self.next_tick(after)
        while tick is not None and tick < before and count < COUNT_LIMIT:
            count += 1
            tick = self.next_tick(tick)
        return count


def parse_schedule(name: str, spec: Any) -> Schedule:
    """Raise ScheduleError (ox.E002, or ox.E003 for a bad cron expression)."""
    where = f"SCHEDULES[{name!r}]"
    if not isinstance(name, str) or not name or len(name) > 100:
        raise ScheduleError(f"{where}: a schedule name must be a string of 1 to 100 characters")
    if not isinstance(spec, dict):
        raise ScheduleError(f"{where} must be a dict, got {type(spec).__name__}")
    unknown = sorted(set(spec) - KEYS)
    if unknown:
        raise ScheduleError(f"{where}: unknown keys {', '.join(map(str, unknown))} (known: {', '.join(sorted(KEYS))})")
    task_path = spec.get("task")
    if not isinstance(task_path, str) or "." not in task_path:
        raise ScheduleError(f"{where}: 'task' must be the dotted path of a task, got {task_path!r}")
    if ("cron" in spec) == ("every" in spec):
        raise ScheduleError(f"{where}: give exactly one of 'cron' or 'every'")
    cron = every = None
    if "cron" in spec:
        try:
            cron = Cron.parse(spec["cron"])
        except CronError as exc:
            raise ScheduleError(f"{where}: invalid cron expression: {exc}", "ox.E003") from exc
    else:
        every = _every(where, spec["every"])
    args, kwargs = spec.get("args", []), spec.get("kwargs", {})
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
        raise ScheduleError(f"{where}: 'args' must be a list and 'kwargs' a dict")
    queue, priority = spec.get("queue"), spec.get("priority")
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise ScheduleError(f"{where}: 'queue' must be a queue name, got {queue!r}")
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
        raise ScheduleError(f"{where}: 'priority' must be an integer, got {priority!r}")
    missed = spec.get("missed", "latest")
    if missed not in MISSED_POLICIES:
        raise ScheduleError(f"{where}: 'missed' must be one of {', '.join(MISSED_POLICIES)}, got {missed!r}")
    return Schedule(name, task_path, cron, every, list(args), dict(kwargs), queue, priority, _zone(where, spec), missed)


def _every(where: str, value: Any) -> timedelta:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int) and not isinstance(value, bool):
        seconds = value
    else:
        raise ScheduleError(f"{where}: 'every' must be whole seconds or a timedelta, got {value!r}")
    if seconds < 1 or seconds != int(seconds):
        raise ScheduleError(f"{where}: 'every' must be at least 1 whole second, got {value!r}")
    return timedelta(seconds=int(seconds))


def _zone(where: str, spec: dict[str, Any]) -> tzinfo:
    name = spec.get("timezone")
    if name is None or name == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise ScheduleError(f"{where}: unknown timezone {name!r}") from exc


def parse_schedules(raw: Any) -> list[Schedule]:
    if not isinstance(raw, dict):
        raise ScheduleError(f"SCHEDULES must be a dict of name -> schedule, got {type(raw).__name__}")
    return [parse_schedule(name, spec) for name, spec in raw.items()]
