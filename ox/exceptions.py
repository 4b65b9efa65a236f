"""Exceptions ox raises or records as an attempt's cause."""

from django.tasks.exceptions import InvalidTask


class ArgumentsNotJSON(InvalidTask, TypeError):
    """Task arguments (or a return value) that would not survive a JSON round trip."""


class TaskInterrupt(BaseException):
    """Raised inside a running task to stop it; BaseException so `except Exception` in a
    task body does not swallow it."""


class TaskTimeout(TaskInterrupt):
    """The attempt outlived its timeout."""


class TaskCancelled(TaskInterrupt):
    """The task was cancelled while it ran (or before it started)."""


class WorkerLost(Exception):
    """The worker running the attempt died or lost its lease; recorded by the rescuer."""


class TaskUnrunnable(Exception):
    """The row cannot be run as stored: its path no longer imports, its arguments no longer
    decode or no longer fit the function."""


def class_path(exc_type: type[BaseException]) -> str:
    return f"{exc_type.__module__}.{exc_type.__qualname__}"
