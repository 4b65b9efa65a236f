"""Periodic duties a worker runs beside its tasks (periodic task ticks, pruning): each is
called on the worker's own connection every `interval` seconds, from the worker loop."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ox.worker import Worker


@dataclass
class Duty:
    name: str
    interval: float  # seconds between runs
    run: Callable[[Any, datetime], None]  # (worker connection, now)


def worker_duties(worker: "Worker") -> list[Duty]:
    """The duties this worker takes on, from the backend's OPTIONS."""
    return []
