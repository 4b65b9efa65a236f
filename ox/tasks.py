"""OxTask: Django's Task with ox's per-task policy (Django 6.1 forwards @task kwargs here)."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.tasks import Task

# (exception, task_result) -> seconds | timedelta | None (None: give up, no more attempts)
Backoff = Callable[[BaseException, Any], float | int | timedelta | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class OxTask(Task):
    max_attempts: int | None = None
    backoff: Backoff | None = None
    timeout: float | None = None
