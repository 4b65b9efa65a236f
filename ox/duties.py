"""Periodic duties a worker runs beside its tasks (periodic task ticks, pruning): each is
called on the worker's own connection every `interval` seconds, from the worker loop."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ox.worker import Worker

TICK_INTERVAL = 1.0  # seconds between looks for due ticks: a tick fires within about this
PRUNE_POLL = 5.0  # the pruner decides itself whether a round is due (see ox.prune.Pruner)


@dataclass
class Duty:
    name: str
    interval: float  # seconds between runs
    run: Callable[[Any, datetime], None]  # (worker connection, now)


def worker_duties(worker: "Worker") -> list[Duty]:
    """The duties this worker takes on, from the backend's OPTIONS: SCHEDULES fire ticks,
    PRUNE deletes finished tasks past their retention."""
    from ox.periodic import Ticker
    from ox.prune import Pruner
    from ox.schedules import parse_schedules

    options = worker.options
    duties = []
    if options.schedules:
        duties.append(Duty("periodic", TICK_INTERVAL, Ticker(worker.backend, parse_schedules(options.schedules)).run))
    if options.prune:
        pruner = Pruner(options.prune_rules(), options.prune_interval, options.prune_batch)
        duties.append(Duty("prune", min(PRUNE_POLL, options.prune_interval), pruner.run))
    return duties
