"""Durations as settings and flags write them: seconds, a timedelta, or "90s", "15m", "12h", "7d", "2w"."""

import re
from datetime import timedelta
from typing import Any

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration(value: Any) -> timedelta:
    """Raise ValueError for anything that is not a non-negative duration."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (match := _PATTERN.match(value.lower())):
        seconds = float(match.group(1)) * UNITS[match.group(2) or "s"]
    else:
        raise ValueError(f"not a duration: {value!r} (use seconds or e.g. '90s', '15m', '12h', '7d', '2w')")
    if seconds < 0:
        raise ValueError(f"a duration must not be negative, got {value!r}")
    return timedelta(seconds=seconds)
