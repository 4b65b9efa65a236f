"""When a failed attempt runs again: the task's own backoff, else exponential with jitter."""

import random
from datetime import timedelta
from typing import Any

from django.tasks import Task as DjangoTask
from django.tasks import TaskResult

from ox.conf import OxOptions


def default_delay(attempt: int, options: OxOptions) -> float:
    """Exponential in the attempt number, capped, with "equal jitter" so that tasks failing
    together (a dependency down) do not all come back at the same instant."""
    ceiling = min(options.backoff_max, options.backoff_base * 2 ** max(attempt - 1, 0))
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
    except Exception as policy_exc:  # noqa: BLE001
        return default_delay(attempt, options), f"backoff raised {policy_exc!r}; used the default delay"
    if value is None:
        return None, ""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return default_delay(attempt, options), f"backoff returned {value!r}; used the default delay"
    return float(value), ""
