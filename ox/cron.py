"""A small cron parser: five fields (minute hour day-of-month month day-of-week) with `*`,
ranges, steps, lists, month and weekday names, and the @hourly/@daily/... shorthands.

Times are naive wall-clock minutes; ox.periodic converts them to and from the schedule's
time zone. Day-of-month and day-of-week follow cron's rule: when both are restricted, a day
matches if either does.
"""

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from functools import cached_property

MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
SHORTHANDS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# Feb 29 on a Monday can be 28 years away; a field set that matches nothing in that span
# never matches (e.g. "0 0 30 2 *").
SEARCH_DAYS = 366 * 29


class CronError(ValueError):
    pass


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: list[str] | None = None
    name_base: int = 0


FIELDS = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day of month", 1, 31),
    _Field("month", 1, 12, MONTHS, 1),
    _Field("day of week", 0, 7, DAYS, 0),  # 0 and 7 are both Sunday
)


def _number(text: str, spec: _Field) -> int:
    upper = text.upper()
    if spec.names and upper in spec.names:
        return spec.names.index(upper) + spec.name_base
    if not text.isdigit():
        raise CronError(f"{spec.name}: {text!r} is not a number{' or a name' if spec.names else ''}")
    value = int(text)
    if not spec.low <= value <= spec.high:
        raise CronError(f"{spec.name}: {value} is outside {spec.low}-{spec.high}")
    return value


def _parse_field(text: str, spec: _Field) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{spec.name}: empty list item in {text!r}")
        body, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) < 1:
                raise CronError(f"{spec.name}: bad step {step_text!r}")
            step = int(step_text)
        if body == "*":
            low, high = spec.low, spec.high
        elif "-" in body:
            first, _, last = body.partition("-")
            low, high = _number(first, spec), _number(last, spec)
            if low > high:
                raise CronError(f"{spec.name}: range {body!r} runs backwards")
        else:
            low = _number(body, spec)
            # "5/15" means from 5 to the end in steps of 15, as in Vixie cron.
            high = spec.high if step_text else low
        values.update(range(low, high + 1, step))
    if spec.name == "day of week" and 7 in values:
        values = (values - {7}) | {0}
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day-of-month field is "*"
    any_weekday: bool

    @classmethod
    def parse(cls, expression: str) -> "Cron":
        if not isinstance(expression, str):
            raise CronError(f"a cron expression must be a string, got {expression!r}")
        parts = SHORTHANDS.get(expression.strip().lower(), expression).split()
        if len(parts) != 5:
            raise CronError(f"{expression!r} has {len(parts)} fields, cron needs 5 (minute hour day month weekday)")
        minutes, hours, days, months, weekdays = (_parse_field(p, f) for p, f in zip(parts, FIELDS, strict=True))
        cron = cls(
            expression, minutes, hours, days, months, weekdays, parts[2].startswith("*"), parts[4].startswith("*")
        )
        if cron.previous(datetime(2100, 1, 1)) is None:
            raise CronError(f"{expression!r} never matches a real date")
        return cron

    def _day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week

    @cached_property
    def _times(self) -> list[time]:
        return sorted(time(h, m) for h in self.hours for m in self.minutes)

    def previous(self, at: datetime) -> datetime | None:
        """The latest matching minute at or before `at` (naive wall-clock time)."""
        limit = at.replace(second=0, microsecond=0).time()
        day = at.date()
        for offset in range(SEARCH_DAYS):
            if self._day_matches(day):
                for t in reversed(self._times):
                    if offset or t <= limit:
                        return datetime.combine(day, t)
            day -= timedelta(days=1)
        return None

    def next(self, after: datetime) -> datetime | None:
        """The earliest matching minute strictly after `after` (naive wall-clock time)."""
        day = after.date()
        for offset in range(SEARCH_DAYS):
            if self._day_matches(day):
                for t in self._times:
                    candidate = datetime.combine(day, t)
                    if offset or candidate > after:
                        return candidate
            day += timedelta(days=1)
        return None
