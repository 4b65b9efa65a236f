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

from django.db.models import Count, Min, Q
from django.utils import timezone

from ox.conf import OxOptions
from ox.models import Status, Task, Worker
from ox.tablehealth import TableHealth, table_health

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
    ready: int = 0  # READY and due now: the backlog
    scheduled: int = 0  # READY with a run_after in the future
    running: int = 0
    oldest_ready_age: float = 0.0  # seconds the oldest due READY task has waited


@dataclass(frozen=True)
class WorkerCounts:
    alive: int = 0
    stale: int = 0


def _tasks(using: str | None) -> Any:
    return Task.objects.using(using) if using else Task.objects.all()


def queue_counts(now: datetime, using: str | None = None, queues: Any = ()) -> list[QueueCounts]:
    """Live tasks per queue in one query over the READY and RUNNING partial indexes; every
    queue in `queues` is listed, with zeros when empty."""
    due = Q(status=Status.READY, run_after__lte=now)
    rows = (
        _tasks(using)
        # Two equalities, not `status IN (...)`: each arm implies one partial index's predicate
        # (the claim index, the lease index), so the planner ORs two small index scans; an IN
        # list implies neither and reads the whole table, finished history included.
        .filter(Q(status=Status.READY) | Q(status=Status.RUNNING))
        .values("queue")
        .annotate(
            ready=Count("pk", filter=due),
            scheduled=Count("pk", filter=Q(status=Status.READY, run_after__gt=now)),
            running=Count("pk", filter=Q(status=Status.RUNNING)),
            oldest=Min("run_after", filter=due),
        )
        .order_by("queue")
    )
    found = {
        r["queue"]: QueueCounts(
            r["queue"],
            r["ready"],
            r["scheduled"],
            r["running"],
            max((now - r["oldest"]).total_seconds(), 0.0) if r["oldest"] else 0.0,
        )
        for r in rows
    }
    return [found.get(q, QueueCounts(q)) for q in sorted(set(queues) | set(found))]


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
    table: TableHealth | None  # PostgreSQL only
    problems: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems

    @property
    def backlog(self) -> int:
        return sum(q.ready for q in self.queues)

    @property
    def oldest_ready_age(self) -> float:
        return max((q.oldest_ready_age for q in self.queues), default=0.0)

    def as_dict(self) -> dict[str, Any]:
        table = None
        if self.table is not None:
            table = {**asdict(self.table), "dead_ratio": self.table.dead_ratio, "warning": self.table.warning}
        return {
            "healthy": self.healthy,
            "problems": self.problems,
            "checked_at": self.checked_at.isoformat(),
            "backlog": self.backlog,
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
    now = now or timezone.now()
    counts = queue_counts(now, using, queues)
    workers = worker_counts(now, thresholds.stale_after, using)
    table = table_health(using, thresholds.max_xact_age)
    health = Health(now, thresholds, counts, workers, table)
    t, problems = thresholds, health.problems
    if health.backlog > t.max_backlog:
        problems.append(f"backlog: {health.backlog} due tasks waiting (max {t.max_backlog})")
    if health.oldest_ready_age > t.max_ready_age:
        problems.append(f"oldest ready task has waited {health.oldest_ready_age:.0f}s (max {t.max_ready_age:.0f}s)")
    if workers.stale > t.max_stale_workers:
        problems.append(f"{workers.stale} stale workers (max {t.max_stale_workers})")
    if workers.alive < t.min_workers:
        problems.append(f"{workers.alive} workers alive (min {t.min_workers})")
    if table is not None and table.warning and table.oldest_transaction is not None:
        oldest = table.oldest_transaction
        problems.append(
            f"a transaction open for {oldest.age_seconds:.0f}s (pid {oldest.pid}, {oldest.state}) holds back"
            f" VACUUM on {table.table} (max {t.max_xact_age:.0f}s)"
        )
    return health
