"""Queue health: backlog and waiting time per queue, workers alive and stale, compared with
thresholds. `manage.py ox_health` and the metrics view read these; so can the dashboard.

A worker is alive while it heartbeats; stale when it has not stopped but has not
heartbeated for `stale_after` seconds (hung, or killed without a chance to say so). After
STALE_FORGET a silent worker counts as gone rather than stale, so one crash does not keep
the health check failing forever; the rescuer has taken its tasks back long before.
"""

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Count, Min, Q

from ox import clock
from ox.conf import OxOptions
from ox.db import driver
from ox.models import Status, Task, Worker
from ox.paging import COUNT_CAP
from ox.tablehealth import InnoDBTableHealth, TableHealth, table_health

STALE_FORGET = timedelta(hours=1)


@dataclass(frozen=True)
class Thresholds:
    max_backlog: int = 10000
    max_ready_age: float = 300.0
    max_stale_workers: int = 0
    min_workers: int = 0
    stale_after: float = 60.0
    max_xact_age: float = 3600.0

    @classmethod
    def from_options(cls, options: OxOptions) -> "Thresholds":
        return cls(
            max_backlog=options.health_max_backlog,
            max_ready_age=options.health_max_ready_age,
            max_stale_workers=options.health_max_stale_workers,
            min_workers=options.health_min_workers,
            stale_after=options.worker_stale_after,
            max_xact_age=options.health_max_xact_age,
        )


@dataclass(frozen=True)
class QueueCounts:
    queue: str
    ready: int = 0  # READY and due now: the backlog (at most the cap; see ready_capped)
    scheduled: int = 0  # READY with a run_after in the future (at most the cap)
    running: int = 0
    oldest_ready_age: float = 0.0  # seconds the oldest due READY task has waited
    # True: the count stopped at the cap, and there are more than `ready` (`scheduled`).
    ready_capped: bool = False
    scheduled_capped: bool = False


@dataclass(frozen=True)
class WorkerCounts:
    alive: int = 0
    stale: int = 0


def _tasks(using: str | None) -> Any:
    return Task.objects.using(using) if using else Task.objects.all()


@dataclass(frozen=True)
class Backlog:
    """A queue's READY tasks: counts that stop at a cap, and the oldest due one."""

    queue: str
    ready: int  # min(due, cap)
    scheduled: int  # min(scheduled, cap)
    ready_capped: bool  # more than `ready` are due
    scheduled_capped: bool
    oldest_ready_at: datetime | None  # the earliest run_after among due tasks


def backlog(now: datetime, using: str | None = None, cap: int | None = None) -> dict[str, Backlog]:
    """READY tasks per queue that has any: due and scheduled counted up to `cap` (default
    COUNT_CAP; past it, the count says "more than cap"), and the oldest due. Index-only and
    bounded where the driver has a statement for it (PostgreSQL: ox.db.postgresql.health);
    other databases count exactly with the ORM, then cap, so both show the same."""
    cap = COUNT_CAP if cap is None else cap  # read at call time: tests lower it
    tasks = _tasks(using)
    conn = connections[tasks.db]
    rows = driver(conn).backlog_rows(conn, now, cap + 1)
    if rows is None:
        rows = (
            tasks.filter(status=Status.READY)
            .values("queue")
            .annotate(
                due=Count("pk", filter=Q(run_after__lte=now)),
                later=Count("pk", filter=Q(run_after__gt=now)),
                oldest=Min("run_after", filter=Q(run_after__lte=now)),
            )
            .order_by("queue")
            .values_list("queue", "due", "later", "oldest")
        )
    return {
        queue: Backlog(queue, min(due, cap), min(later, cap), due > cap, later > cap, oldest)
        for queue, due, later, oldest in rows
    }


def running_counts(using: str | None = None) -> dict[str, int]:
    """RUNNING tasks per queue, from the lease index (a worker holds at most its concurrency)."""
    rows = _tasks(using).filter(status=Status.RUNNING).values("queue").annotate(n=Count("pk")).order_by()
    return {r["queue"]: r["n"] for r in rows}


def queue_counts(
    now: datetime, using: str | None = None, queues: Any = (), cap: int | None = None
) -> list[QueueCounts]:
    """Live tasks per queue: the backlog (counts capped at `cap`) and what runs. Every queue in
    `queues` is listed, with zeros when empty."""
    ready = backlog(now, using, cap)
    running = running_counts(using)
    found = []
    for queue in sorted(set(queues) | set(ready) | set(running)):
        b = ready.get(queue)
        if b is None:
            found.append(QueueCounts(queue, running=running.get(queue, 0)))
            continue
        age = max((now - b.oldest_ready_at).total_seconds(), 0.0) if b.oldest_ready_at else 0.0
        found.append(
            QueueCounts(queue, b.ready, b.scheduled, running.get(queue, 0), age, b.ready_capped, b.scheduled_capped)
        )
    return found


def worker_counts(now: datetime, stale_after: float, using: str | None = None) -> WorkerCounts:
    fresh = now - timedelta(seconds=stale_after)
    workers = Worker.objects.using(using) if using else Worker.objects.all()
    counts = workers.filter(stopped_at=None).aggregate(
        alive=Count("pk", filter=Q(heartbeat_at__gte=fresh)),
        stale=Count("pk", filter=Q(heartbeat_at__lt=fresh, heartbeat_at__gte=now - STALE_FORGET)),
    )
    return WorkerCounts(alive=counts["alive"], stale=counts["stale"])


@dataclass(frozen=True)
class Health:
    checked_at: datetime
    thresholds: Thresholds
    queues: list[QueueCounts]
    workers: WorkerCounts
    table: TableHealth | InnoDBTableHealth | None  # PostgreSQL's or InnoDB's; None on SQLite
    problems: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems

    @property
    def backlog(self) -> int:
        """Due tasks over all queues; at least this many when backlog_capped."""
        return sum(q.ready for q in self.queues)

    @property
    def backlog_capped(self) -> bool:
        return any(q.ready_capped for q in self.queues)

    @property
    def oldest_ready_age(self) -> float:
        return max((q.oldest_ready_age for q in self.queues), default=0.0)

    def as_dict(self) -> dict[str, Any]:
        table = None
        if isinstance(self.table, InnoDBTableHealth):  # no dead ratio: InnoDB has no dead tuples
            table = {**asdict(self.table), "total_bytes": self.table.total_bytes, "warning": self.table.warning}
        elif self.table is not None:
            table = {**asdict(self.table), "dead_ratio": self.table.dead_ratio, "warning": self.table.warning}
        return {
            "healthy": self.healthy,
            "problems": self.problems,
            "checked_at": self.checked_at.isoformat(),
            "backlog": self.backlog,
            "backlog_capped": self.backlog_capped,
            "oldest_ready_age": round(self.oldest_ready_age, 3),
            "queues": [asdict(q) for q in self.queues],
            "workers": asdict(self.workers),
            "thresholds": asdict(self.thresholds),
            "table": table,
        }


def check_health(
    thresholds: Thresholds, using: str | None = None, now: datetime | None = None, queues: Any = ()
) -> Health:
    """Read the queue's state and list every threshold it crosses."""
    now = now or clock.now_on(using)
    # Counted up to the threshold at least, so that a capped count still says "over it".
    counts = queue_counts(now, using, queues, cap=max(COUNT_CAP, thresholds.max_backlog))
    workers = worker_counts(now, thresholds.stale_after, using)
    table = table_health(using, thresholds.max_xact_age)
    health = Health(now, thresholds, counts, workers, table)
    t, problems = thresholds, health.problems
    if health.backlog > t.max_backlog or health.backlog_capped:
        more = "more than " if health.backlog_capped else ""
        problems.append(f"backlog: {more}{health.backlog} due tasks waiting (max {t.max_backlog})")
    if health.oldest_ready_age > t.max_ready_age:
        problems.append(f"oldest ready task has waited {health.oldest_ready_age:.0f}s (max {t.max_ready_age:.0f}s)")
    if workers.stale > t.max_stale_workers:
        problems.append(f"{workers.stale} stale workers (max {t.max_stale_workers})")
    if workers.alive < t.min_workers:
        problems.append(f"{workers.alive} workers alive (min {t.min_workers})")
    if isinstance(table, InnoDBTableHealth):
        if table.warning and table.oldest_transaction is not None:
            trx = table.oldest_transaction
            problems.append(
                f"a transaction open for {trx.age_seconds:.0f}s (thread {trx.thread_id}, {trx.state}) holds back"
                f" InnoDB purge (history list {table.history_list_length}, max {t.max_xact_age:.0f}s)"
            )
    elif table is not None and table.warning and table.oldest_transaction is not None:
        oldest = table.oldest_transaction
        problems.append(
            f"a transaction open for {oldest.age_seconds:.0f}s (pid {oldest.pid}, {oldest.state}) holds back"
            f" VACUUM on {table.table} (max {t.max_xact_age:.0f}s)"
        )
    return health
