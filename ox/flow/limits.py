"""A queue's limits as settings and the dashboard write them: TASKS[...]["OPTIONS"]["LIMITS"]
= {"sms": {"concurrency": 4, "key_concurrency": 1, "rate": "50/s", "key_rate": "10/s"}}.

concurrency: at most N tasks of the queue RUNNING across all workers; key_concurrency: at
most N RUNNING per limit key (a task's key comes from its arguments, @task(limit_by=...));
rate: at most N starts per period for the queue, spread evenly (a start every period/N;
`burst` B lets B start at once after a quiet spell, on top of the rate: at most N + B - 1 in
any period); key_rate: the same per limit key.
"""

import math
import re
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

from ox.durations import UNITS

# "50/s", "5/10s", and the text Rate prints back: "5/s (burst 2)".
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smhd])\s*(?:\(\s*burst\s+(\d+)\s*\))?\s*$")


@dataclass(frozen=True, slots=True)
class Rate:
    count: int
    period: float  # seconds
    burst: int = 1

    @property
    def interval(self) -> float:
        """Seconds between starts at the steady rate."""
        return self.period / self.count

    @property
    def tolerance(self) -> float:
        """How far ahead of now the schedule may run: burst - 1 starts' worth."""
        return (self.burst - 1) * self.interval

    def __str__(self) -> str:
        unit = next((u for u, s in UNITS.items() if s == self.period), None)
        per = unit if unit else f"{self.period:.15g}s"
        return f"{self.count}/{per}" + (f" (burst {self.burst})" if self.burst > 1 else "")

    def as_json(self) -> dict[str, Any]:
        """The exact form stored in ox_queue.overrides (text is for people)."""
        return {"count": self.count, "period": self.period, "burst": self.burst}


def parse_rate(value: Any) -> Rate | None:
    """ "50/s", "10/m", "100/h", "5/10s", {"count": 50, "period": 1, "burst": 5}, or None."""
    if value is None:
        return None
    if isinstance(value, Rate):
        return value
    if isinstance(value, str) and (m := _RATE.match(value.lower())):
        count, multiple, unit = int(m.group(1)), float(m.group(2) or 1), m.group(3)
        return _checked(Rate(count, multiple * UNITS[unit], int(m.group(4) or 1)))
    if isinstance(value, dict) and set(value) <= {"count", "period", "burst"} and {"count", "period"} <= set(value):
        count, period, burst = value["count"], value["period"], value.get("burst", 1)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (count, period, burst)):
            if count == int(count) and burst == int(burst):
                return _checked(Rate(int(count), float(period), int(burst)))
    raise ValueError(
        f"not a rate: {value!r} (use e.g. '50/s', '10/m', '100/h', '5/10s', or"
        " {'count': 50, 'period': 1, 'burst': 5})"
    )


MIN_PERIOD = 0.001  # seconds
MAX_PERIOD = 86400 * 7
MAX_PER_SECOND = 1_000_000


def _checked(rate: Rate) -> Rate:
    if (
        rate.count < 1
        or not math.isfinite(rate.period)
        or not MIN_PERIOD <= rate.period <= MAX_PERIOD
        or rate.count / rate.period > MAX_PER_SECOND
    ):
        raise ValueError(
            f"a rate needs a count >= 1, a period from 1 ms to 7 days and at most {MAX_PER_SECOND:,} a second,"
            f" got {rate.count}/{rate.period}s"
        )
    if rate.burst < 1 or rate.burst > rate.count:
        raise ValueError(f"a rate's burst must be between 1 and its count ({rate.count}), got {rate.burst}")
    return rate


@dataclass(frozen=True, slots=True)
class QueueLimits:
    concurrency: int | None = None
    key_concurrency: int | None = None
    rate: Rate | None = None
    key_rate: Rate | None = None

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))

    @property
    def slotted(self) -> bool:
        """Concurrency is the only limit: claimed under leased slots (ox.flow.slots)."""
        return self.concurrency is not None and self == QueueLimits(concurrency=self.concurrency)

    @property
    def one_per_key(self) -> bool:
        """Key concurrency 1 is the only limit: a task claimed ahead of a free thread
        (prefetch) holds only its own key, which no other task could start then anyway, so
        order within the key holds. (With N > 1 a task claimed ahead would take one of the
        key's N places and a later task of the key, claimed elsewhere, would start first.)"""
        return self == QueueLimits(key_concurrency=1)

    @property
    def keyed(self) -> bool:
        return self.key_concurrency is not None or self.key_rate is not None

    def as_dict(self) -> dict[str, Any]:
        """The settings' shape (rates as text), for JSON and the dashboard."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = str(value) if isinstance(value, Rate) else value
        return out

    def describe(self) -> str:
        parts = []
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} at a time")
        if self.key_concurrency is not None:
            parts.append(f"{self.key_concurrency} per key at a time")
        if self.rate is not None:
            parts.append(f"{self.rate}")
        if self.key_rate is not None:
            parts.append(f"{self.key_rate} per key")
        return ", ".join(parts) or "no limits"


LIMIT_FIELDS = ("concurrency", "key_concurrency", "rate", "key_rate")


def parse_limits(raw: Any, where: str = "LIMITS") -> QueueLimits:
    """One queue's limits; ValueError with the field at fault for anything else."""
    if isinstance(raw, QueueLimits):
        return raw
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a dict of {', '.join(LIMIT_FIELDS)}, got {raw!r}")
    unknown = sorted(str(k) for k in raw if k not in LIMIT_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown limit {', '.join(unknown)} (known: {', '.join(LIMIT_FIELDS)})")
    values: dict[str, Any] = {}
    for name in ("concurrency", "key_concurrency"):
        value = raw.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 100_000):
            raise ValueError(f"{where}[{name!r}] must be an integer from 1 to 100000 (or None), got {value!r}")
        values[name] = value
    for name in ("rate", "key_rate"):
        try:
            values[name] = parse_rate(raw.get(name))
        except ValueError as exc:
            raise ValueError(f"{where}[{name!r}]: {exc}") from None
    return QueueLimits(**values)


def merged(settings: QueueLimits, overrides: dict[str, Any] | None) -> QueueLimits:
    """Settings with the run-time overrides (ox_queue.overrides) on top: a field present in
    the overrides wins, None included (None there lifts that limit). A field that does not
    parse (written by hand into the table) is left out, field by field: the settings hold
    for it, the other overrides stay in force."""
    if not overrides:
        return settings
    values = {f.name: getattr(settings, f.name) for f in fields(settings)}
    for name, value in overrides.items():
        if name not in LIMIT_FIELDS:
            continue
        try:
            values[name] = getattr(parse_limits({name: value}), name)
        except ValueError:
            continue
    return QueueLimits(**values)


def stored(limits: QueueLimits, names: Any) -> dict[str, Any]:
    """The overrides to store for these fields: rates in their exact JSON form."""
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(limits, name)
        out[name] = value.as_json() if isinstance(value, Rate) else value
    return out


def _clamped(tat: float | None, now: float, rate: Rate) -> float | None:
    # Under one rate a schedule is never more than interval + tolerance ahead of now; one
    # further ahead was made by a slower rate since raised: the new rate holds from now,
    # without waiting out the old schedule.
    return None if tat is None else min(tat, now + rate.interval + rate.tolerance)


def next_start(tat: float | None, now: float, rate: Rate) -> float:
    """GCRA: when the next start is allowed, given the theoretical arrival time `tat`
    stored for the queue or key (epoch seconds; None: never used)."""
    tat = _clamped(tat, now, rate)
    return now if tat is None else max(now, tat - rate.tolerance)


def take(tat: float | None, now: float, rate: Rate) -> float | None:
    """The new tat after one start now, or None if a start now would exceed the rate."""
    tat = _clamped(tat, now, rate)
    base = now if tat is None else max(tat, now)
    if base - rate.tolerance > now + 1e-9:
        return None
    return base + rate.interval


def as_seconds(value: timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)
