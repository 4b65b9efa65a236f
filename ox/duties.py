"""Periodic duties a worker runs beside its tasks (periodic task ticks, archiving, pruning,
vacuuming): each is called on the worker's own connection every `interval` seconds, from the
worker loop. A duty whose work may take long (VACUUM) starts it on a thread of its own and is
stopped with the worker."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ox.worker import Worker

TICK_INTERVAL = 1.0  # seconds between looks for due ticks: a tick fires within about this
PRUNE_POLL = 5.0  # the pruner decides itself whether a round is due (see ox.prune.Pruner)
KEY_RATE_PRUNE = 60.0  # seconds between drops of spent per-key rate rows (ox.flow.gate)


@dataclass
class Duty:
    name: str
    interval: float  # seconds between runs
    run: Callable[[Any, datetime], None]  # (worker connection, now)
    on_stop: Callable[[], None] | None = None  # called once as the worker stops

    def stop(self) -> None:
        if self.on_stop is not None:
            self.on_stop()


def worker_duties(worker: "Worker") -> list[Duty]:
    """The duties this worker takes on, from the backend's OPTIONS: SCHEDULES fire ticks,
    ARCHIVE_AFTER moves finished tasks to the archive, PRUNE deletes finished tasks past their
    retention (and PRUNE_WORKERS old worker rows), VACUUM (PostgreSQL) reclaims dead rows."""
    from ox.archive import Archiver
    from ox.db import driver
    from ox.periodic import Ticker
    from ox.prune import Pruner
    from ox.schedules import parse_schedules
    from ox.vacuum import Vacuumer
    from ox.workflow.repair import repair_duty

    options = worker.options
    # Workflows' PENDING tasks whose predecessors ended where no join saw it (ox.workflow.repair).
    duties = [repair_duty()]
    if options.schedules:
        duties.append(Duty("periodic", TICK_INTERVAL, Ticker(worker.backend, parse_schedules(options.schedules)).run))
    rules, workers = options.prune_rules(), options.worker_retention()
    if rules or workers is not None:
        pruner = Pruner(rules, options.prune_interval, options.prune_batch, workers)
        duties.append(Duty("prune", min(PRUNE_POLL, options.prune_interval), pruner.run))
    age = options.archive_age()
    if age is not None:
        archiver = Archiver(age, options.archive_batch)
        duties.append(Duty("archive", archiver.poll, archiver.run))
    if any(lim.key_rate is not None for lim in options.queue_limits().values()):
        # Rows of keys that have not started a task for a while: without this, one row per key
        # ever seen. (A key rate set only at run time leaves its rows to a worker that has one
        # in its settings, or to the next such worker: a spent row allows a start all the same.)
        duties.append(Duty("key rates", KEY_RATE_PRUNE, _prune_key_rates))
    if options.vacuum and driver(worker.conn).vacuums:
        vacuumer = Vacuumer(worker.alias, options.vacuum_interval, options.vacuum_min_dead, options.pooled)
        # The vacuumer paces its own looks (it backs off while VACUUM cannot keep up).
        duties.append(Duty("vacuum", min(1.0, options.vacuum_interval), vacuumer.run, vacuumer.stop))
    return duties


def _prune_key_rates(conn: Any, now: datetime) -> None:
    from ox.flow.gate import prune_key_rates

    prune_key_rates(conn, now.timestamp())
