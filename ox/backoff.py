"""When a failed attempt runs again: the task's own backoff, else exponential with jitter."""

import math
import random
from datetime import timedelta
from typing import Any

from django.tasks import Task as DjangoTask
from django.tasks import TaskResult

from ox.conf import OxOptions
from ox.exceptions import TaskInterrupt

MAX_DELAY = 10 * 365 * 86400.0  # seconds; a datetime cannot go much further anyway


def _short(value: object) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001  (an int too long to print, a broken __repr__)
        return f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


def default_delay(attempt: int, options: OxOptions) -> float:
    """Exponential in the attempt number, capped, with "equal jitter" so that tasks failing
    together (a dependency down) do not all come back at the same instant."""
    # The exponent is capped: 2.0 ** 1025 overflows a float.
    ceiling = min(options.backoff_max, options.backoff_base * 2.0 ** min(max(attempt - 1, 0), 60))
    return ceiling / 2 + random.uniform(0, ceiling / 2)  # noqa: S311 (not crypto)


def retry_delay(
    task: DjangoTask | None, exc: BaseException, result: TaskResult | None, attempt: int, options: OxOptions
) -> tuple[float | None, str]:
    """Seconds until the next attempt, or None to give up; with a note when the policy
    itself misbehaved (it must not kill the worker)."""
    custom: Any = getattr(task, "backoff", None)
    if custom is None:
        return default_delay(attempt, options), ""
    try:
        value = custom(exc, result)
    except TaskInterrupt:
        raise
    except BaseException as policy_exc:  # noqa: BLE001  (SystemExit from a policy is its bug, not a shutdown)
        return default_delay(attempt, options), f"backoff raised {_short(policy_exc)}; used the default delay"
    if value is None:
        return None, ""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        return default_delay(attempt, options), f"backoff returned {_short(value)}; used the default delay"
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        return default_delay(attempt, options), f"backoff returned {_short(value)}; used the default delay"
    if seconds > MAX_DELAY:
        return MAX_DELAY, f"backoff returned {_short(value)} s; capped at {MAX_DELAY:.0f} s (ten years)"
    return seconds, ""
