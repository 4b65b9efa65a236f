"""Read-only queries for operators: queue depth, throughput, leases, workers, one task's history.

Every function costs a fixed, small number of queries, each on an index: READY counts read the
partial claim index (index-only, and stopping at ox.paging.COUNT_CAP per queue: see
ox.health.backlog), RUNNING rows the partial lease index, and recent outcomes a range of the
(status, finished_at) index. Nothing here scans the finished history or the whole backlog,
however long they grow.
"""

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Q, QuerySet
from django.db.models.functions import TruncMinute
from django.tasks import task_backends

from ox import archive, clock
from ox.backend import OxBackend
from ox.health import backlog, running_counts
from ox.models import FINISHED, ArchivedTask, Attempt, Status, Step, Task, TaskBase, Worker
from ox.results import attempts_to_load

WINDOW = timedelta(hours=1)  # throughput, failure rate and the per-minute chart
FAILED_WINDOW = timedelta(hours=24)
STALE_HEARTBEATS = 3  # a worker this many heartbeat intervals silent is stale

# "Any status", spelled so that each arm matches one partial index's predicate: finished rows
# (ox_task_done_path, ox_task_done_queue, ox_task_status_finished), READY rows (the claim index)
# and RUNNING rows (the lease index). AND-ed with a filter on a column those indexes cover, the
# planner ORs three index scans instead of reading the whole table; the clause is always true,
# so no row is lost. (`status IN ('READY', 'RUNNING')` would imply neither partial predicate.)
ANY_STATUS = Q(status__in=FINISHED) | Q(status=Status.READY) | Q(status=Status.RUNNING)


def each_status(statuses: Iterable[str]) -> Q:
    """`status IN statuses` as one equality per status. For every finished status at once this
    matters: ox_task_status_finished's predicate already says `status IN (all finished)`, so
    PostgreSQL drops that IN list from the index condition, and a range on finished_at (the
    second column) then walks the whole index. One equality per status keeps the status in the
    condition: three short range scans."""
    q = Q()
    for status in statuses:
        q |= Q(status=status)
    return q


@dataclass
class QueueStats:
    queue: str
    ready: int = 0  # due now
    scheduled: int = 0  # READY with a future run_after
    running: int = 0
    failed_24h: int = 0
    oldest_ready_at: datetime | None = None  # the earliest run_after among due READY tasks
    succeeded_1h: int = 0
    failed_1h: int = 0
    # The READY counts stopped at ox.paging.COUNT_CAP: there are more than `ready` (`scheduled`).
    ready_capped: bool = False
    scheduled_capped: bool = False

    @property
    def finished_1h(self) -> int:
        return self.succeeded_1h + self.failed_1h

    @property
    def throughput(self) -> float:
        """Tasks finished per minute over the last hour."""
        return self.finished_1h / (WINDOW.total_seconds() / 60)

    @property
    def failure_rate(self) -> float | None:
        return self.failed_1h / self.finished_1h if self.finished_1h else None

    def add(self, other: "QueueStats") -> None:
        for name in ("ready", "scheduled", "running", "failed_24h", "succeeded_1h", "failed_1h"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        # A sum with a capped part is a lower bound too.
        self.ready_capped = self.ready_capped or other.ready_capped
        self.scheduled_capped = self.scheduled_capped or other.scheduled_capped
        if other.oldest_ready_at and (self.oldest_ready_at is None or other.oldest_ready_at < self.oldest_ready_at):
            self.oldest_ready_at = other.oldest_ready_at


@dataclass
class Overview:
    now: datetime
    queues: list[QueueStats]
    total: QueueStats
    minutes: list[datetime] = field(default_factory=list)  # the chart's buckets, oldest first
    succeeded_per_minute: list[int] = field(default_factory=list)
    failed_per_minute: list[int] = field(default_factory=list)


def configured_queues() -> list[str]:
    """Queues named by the ox backends in TASKS, in settings order."""
    seen: dict[str, None] = {}
    for backend in task_backends.all():
        if isinstance(backend, OxBackend):
            seen.update(dict.fromkeys(backend.queues or ()))
    return list(seen)


def overview(now: datetime | None = None, using: str | None = None) -> Overview:
    """Per-queue depth and recent outcomes, and the last hour per minute: four queries."""
    now = now or clock.now_on(using)
    tasks = Task.objects.using(using)
    per_queue: dict[str, QueueStats] = {q: QueueStats(q) for q in configured_queues()}

    def stats(queue: str) -> QueueStats:
        return per_queue.setdefault(queue, QueueStats(queue))

    # The backlog's counts stop at COUNT_CAP per queue (a backlog of millions is not counted in
    # 100 ms; "more than 10000" is what an operator acts on); the oldest due task is exact.
    for queue, b in backlog(now, using).items():
        s = stats(queue)
        s.ready, s.scheduled, s.oldest_ready_at = b.ready, b.scheduled, b.oldest_ready_at
        s.ready_capped, s.scheduled_capped = b.ready_capped, b.scheduled_capped
    for queue, n in running_counts(using).items():
        stats(queue).running = n
    # Finished tasks are in ox_task for ARCHIVE_AFTER, then in the archive: windows of history
    # read both in one statement (UNION ALL), each table through its (status, finished_at) index.
    archived = ArchivedTask.objects.using(using)

    def both(build: Callable[[QuerySet[Any]], QuerySet[Any]]) -> QuerySet[Any]:
        return build(tasks).union(build(archived), all=True)

    failed = both(
        lambda t: (
            t.filter(status=Status.FAILED, finished_at__gte=now - FAILED_WINDOW)
            .values("queue")
            .annotate(n=Count("pk"))
            .order_by()
        )
    )
    for row in failed:
        stats(row["queue"]).failed_24h += row["n"]

    # One grouped read serves both the per-queue hour and the chart: at most
    # queues x 2 statuses x 60 minutes rows come back.
    start = (now - WINDOW).replace(second=0, microsecond=0) + timedelta(minutes=1)
    minutes = [start + timedelta(minutes=i) for i in range(int(WINDOW.total_seconds() // 60))]
    index = {m: i for i, m in enumerate(minutes)}
    succeeded, failed_pm = [0] * len(minutes), [0] * len(minutes)
    recent = both(
        lambda t: (
            t.filter(status__in=(Status.SUCCESSFUL, Status.FAILED), finished_at__gte=start)
            .annotate(minute=TruncMinute("finished_at"))
            .values("queue", "status", "minute")
            .annotate(n=Count("pk"))
            .order_by()
        )
    )
    for row in recent:
        s = stats(row["queue"])
        i = index.get(row["minute"])
        if row["status"] == Status.SUCCESSFUL:
            s.succeeded_1h += row["n"]
            if i is not None:
                succeeded[i] += row["n"]
        else:
            s.failed_1h += row["n"]
            if i is not None:
                failed_pm[i] += row["n"]

    total = QueueStats("all")
    for s in per_queue.values():
        total.add(s)
    queues = sorted(per_queue.values(), key=lambda s: s.queue)
    return Overview(now, queues, total, minutes, succeeded, failed_pm)


def leases(limit: int = 200, using: str | None = None) -> tuple[list[Task], int]:
    """RUNNING tasks, soonest lease expiry first, and how many there are."""
    running = Task.objects.using(using).running()
    rows = list(
        running.order_by("lease_expires_at").only(
            "id",
            "task_path",
            "queue",
            "status",
            "worker_id",
            "attempts",
            "max_attempts",
            "last_attempted_at",
            "lease_expires_at",
            "cancel_requested",
            "metadata",  # the progress column (ox.metadata)
        )[:limit]
    )
    return rows, (len(rows) if len(rows) < limit else running.count())


@dataclass
class WorkerState:
    worker: Worker
    in_flight: int
    heartbeat_age: float  # seconds
    stale: bool

    @property
    def state(self) -> str:
        if self.worker.stopped_at:
            return "stopped"
        return "stale" if self.stale else "live"


def heartbeat_interval() -> float:
    intervals = [b.config.heartbeat for b in task_backends.all() if isinstance(b, OxBackend)]
    return max(intervals, default=3.0)


def workers(
    now: datetime | None = None, recent: timedelta = timedelta(hours=1), limit: int = 100, using: str | None = None
) -> list[WorkerState]:
    """Workers that have not stopped, plus those seen within `recent`; live ones first."""
    now = now or clock.now_on(using)
    rows = list(
        Worker.objects.using(using)
        .filter(Q(stopped_at__isnull=True) | Q(heartbeat_at__gte=now - recent))
        .order_by("-heartbeat_at")[:limit]
    )
    tasks = Task.objects.using(using)
    in_flight = dict(
        tasks.running()
        .filter(worker_id__in=[w.id for w in rows])
        .values("worker_id")
        .annotate(n=Count("pk"))
        .order_by()
        .values_list("worker_id", "n")
    )
    stale_after = STALE_HEARTBEATS * heartbeat_interval()
    states = []
    for w in rows:
        age = (now - w.heartbeat_at).total_seconds()
        states.append(WorkerState(w, in_flight.get(w.id, 0), age, w.stopped_at is not None or age > stale_after))
    states.sort(key=lambda s: (s.state != "live", -s.worker.heartbeat_at.timestamp()))
    return states


def find_task(pk: str | uuid.UUID, using: str | None = None) -> TaskBase | None:
    """The task from ox_task or, once archived, from ox_task_archive (ox.archive.find_row)."""
    try:
        pk = uuid.UUID(str(pk))
    except ValueError:
        return None
    return archive.find_row(pk, using)


def attempts_of(task: TaskBase) -> list[Attempt]:
    """The attempts that did not succeed, in order. The final successful or current attempt
    has no row: its facts live on the task (worker_id, last_attempted_at, finished_at)."""
    if not attempts_to_load(task):
        return []
    return archive.attempts_of(task)


def reporting(limit: int = 5, using: str | None = None) -> list[Task]:
    """Running tasks that report something about themselves (ox.metadata: a progress, a
    stage), longest running first. Read through the RUNNING index: as many rows as run."""
    running = Task.objects.using(using).running().filter(metadata__isnull=False)
    return list(running.order_by("last_attempted_at").only("id", "task_path", "queue", "metadata")[:limit])


def steps_of(task: TaskBase) -> list[Step]:
    """The task's recorded durable steps (ox.steps), in the order they ran: one index range
    (ox_step_task_name leads with the task id)."""
    return list(Step.objects.using(task._state.db).filter(task_id=task.pk).order_by("started_at", "id"))


# How far an id's embedded timestamp may sit from enqueued_at (both are taken at enqueue, a few
# statements apart): an enqueue-time range on the primary key is widened by this, and the exact
# enqueued_at condition applied as well.
ID_CLOCK_SLACK = timedelta(minutes=1)


def id_floor(moment: datetime) -> uuid.UUID:
    """The smallest task id minted at `moment`: ids are UUIDv7, so their leading 48 bits are the
    enqueue time in milliseconds and an id range is an enqueue-time range on the primary key."""
    ms = max(0, int(moment.timestamp() * 1000))
    return uuid.UUID(int=(ms & 0xFFFF_FFFF_FFFF) << 80)
