"""What the limits hold back, for operators (the dashboard, the admin, `ox_queue status`):
per queue its pause, its limits in force and how full they are, how many due tasks wait on
a limit (beside those waiting for their run_after), and per task why it waits.

A few indexed queries per call: RUNNING rows per (queue, key) from ox_task_running_queue,
due READY counts capped like ox.health.backlog, the queues' rows, and the per-key rate rows
of the keys asked about.
"""

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import router
from django.db.models import Count
from django.tasks import task_backends

from ox import clock
from ox.flow.limits import QueueLimits, next_start
from ox.flow.queues import QueueView, views
from ox.health import backlog
from ox.models import KeyRate, Slot, Status, Task, TaskBase
from ox.paging import COUNT_CAP


def settings_limits() -> dict[str, QueueLimits]:
    """LIMITS of every ox backend in TASKS (the first backend naming a queue wins)."""
    from ox.backend import OxBackend

    out: dict[str, QueueLimits] = {}
    for backend in task_backends.all():
        if isinstance(backend, OxBackend) and backend.config_error is None:
            for queue, lim in backend.config.queue_limits().items():
                out.setdefault(queue, lim)
    return out


@dataclass
class QueueFlow:
    view: QueueView
    running: int = 0
    due: int = 0  # due READY tasks (capped at COUNT_CAP)
    due_capped: bool = False
    scheduled: int = 0  # READY tasks waiting for their run_after
    waiting_on_limit: int = 0  # due tasks the pause or a limit holds back now (capped)
    full: bool = False  # concurrency reached
    # a slotted queue (ox.flow.slots): its slots leased now, plus its tasks running without one
    slots_held: int | None = None
    full_keys: dict[str, int] = field(default_factory=dict)  # key -> running, keys at key_concurrency
    next_start_at: datetime | None = None  # a rate allows the next start then (None: now)
    reasons: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def limits(self) -> QueueLimits:
        return self.view.limits


def _epoch(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def queue_flows(queues: list[str] | None = None, using: str | None = None) -> list[QueueFlow]:
    from ox.stats import configured_queues

    db = using or router.db_for_read(Task)
    now = clock.now_on(db)
    names = list(queues) if queues is not None else configured_queues()
    found = views(settings_limits(), names, db)
    per_key: Counter[tuple[str, str | None]] = Counter()
    running = (
        Task.objects.using(db)
        .filter(status=Status.RUNNING)
        .values_list("queue", "limit_key")
        .annotate(n=Count("pk"))
        .order_by()
    )
    for queue, key, n in running:
        per_key[(queue, key)] += n
    ready = backlog(now, db)
    slotted = [v.name for v in found if v.limits.slotted]
    held: Counter[str] = Counter()
    if slotted:
        # In use: the slots held, and the tasks running without one (started by the gate),
        # as ox.flow.slots.take counts them; a holder's RUNNING rows past its slots are parked.
        rows = Slot.objects.using(db).filter(queue__in=slotted, expires_at__gte=now).exclude(worker_id="")
        holders = set(rows.values_list("queue", "worker_id"))
        held.update(rows.values_list("queue", flat=True))
        by_worker = (
            Task.objects.using(db)
            .filter(status=Status.RUNNING, queue__in=slotted)
            .values_list("queue", "worker_id")
            .annotate(n=Count("pk"))
            .order_by()
        )
        for queue, worker, n in by_worker:
            if (queue, worker) not in holders:
                held[queue] += n
    out = []
    for view in found:
        flow = QueueFlow(view)
        flow.running = sum(n for (q, _k), n in per_key.items() if q == view.name)
        b = ready.get(view.name)
        if b is not None:
            flow.due, flow.due_capped, flow.scheduled = b.ready, b.ready_capped, b.scheduled
        lim = view.limits
        if view.paused:
            flow.reasons.append("paused")
        if lim.slotted and lim.concurrency is not None:
            # Workers lease the slots and run at most that many; RUNNING rows beyond them
            # are prefetched tasks waiting in a worker for one of its slots.
            flow.slots_held = held.get(view.name, 0)
            if flow.slots_held >= lim.concurrency:
                flow.full = True
                flow.reasons.append(f"at its concurrency limit ({flow.slots_held} of {lim.concurrency} running)")
        elif lim.concurrency is not None and flow.running >= lim.concurrency:
            flow.full = True
            flow.reasons.append(f"at its concurrency limit ({flow.running} of {lim.concurrency} running)")
        if lim.key_concurrency is not None:
            flow.full_keys = {
                k: n for (q, k), n in per_key.items() if q == view.name and k is not None and n >= lim.key_concurrency
            }
            if flow.full_keys:
                flow.reasons.append(f"{len(flow.full_keys)} key(s) at their limit of {lim.key_concurrency}")
        if lim.rate is not None and view.rate_tat is not None:
            at = next_start(view.rate_tat, now.timestamp(), lim.rate)
            if at > now.timestamp():
                flow.next_start_at = _epoch(at)
                flow.reasons.append(f"rate {lim.rate}: next start at {flow.next_start_at.isoformat()}")
        flow.waiting_on_limit = _held_back(flow, db, now)
        out.append(flow)
    return out


def _held_back(flow: QueueFlow, db: str, now: datetime) -> int:
    if flow.view.paused or flow.full or flow.next_start_at is not None:
        return flow.due
    if not flow.full_keys:
        return 0
    qs = Task.objects.using(db).filter(
        status=Status.READY, queue=flow.name, run_after__lte=now, limit_key__in=list(flow.full_keys)[:500]
    )
    return len(qs.values_list("pk", flat=True)[:COUNT_CAP])


def why_waiting(task: TaskBase, using: str | None = None) -> str | None:
    """Why a READY task has not started, in words; None when it is not waiting (or is next
    in line with nothing holding it back)."""
    if task.status != Status.READY:
        return None
    db = using or router.db_for_read(Task)
    now = clock.now_on(db)
    if task.run_after > now:
        return f"scheduled: due at {task.run_after.isoformat()}"
    flow = next(iter(queue_flows([task.queue], db)), None)
    if flow is None:
        return None
    lim = flow.limits
    if flow.view.paused:
        return f"queue {task.queue!r} is paused"
    if flow.full and flow.slots_held is not None:
        return f"queue {task.queue!r} is at its concurrency limit ({flow.slots_held} of {lim.concurrency} running)"
    if flow.full:
        return f"queue {task.queue!r} is at its concurrency limit ({flow.running} of {lim.concurrency} running)"
    if task.limit_key is not None and task.limit_key in flow.full_keys:
        running = flow.full_keys[task.limit_key]
        return f"key {task.limit_key!r} is at its limit ({running} of {lim.key_concurrency} running)"
    if flow.next_start_at is not None:
        return f"queue {task.queue!r} rate {lim.rate}: next start at {flow.next_start_at.isoformat()}"
    if task.limit_key is not None and lim.key_rate is not None:
        tat = KeyRate.objects.using(db).filter(queue=task.queue, key=task.limit_key).values_list("tat", flat=True)
        found = tat.first()
        if found is not None and next_start(found, now.timestamp(), lim.key_rate) > now.timestamp():
            at = _epoch(next_start(found, now.timestamp(), lim.key_rate))
            return f"key {task.limit_key!r} rate {lim.key_rate}: next start at {at.isoformat()}"
    return None


def describe(flow: QueueFlow) -> dict[str, Any]:
    """A queue's flow state as plain data (the JSON API, `ox_queue status --json`)."""
    return {
        "queue": flow.name,
        "paused": flow.view.paused,
        "limits": flow.limits.as_dict(),
        "settings": flow.view.settings.as_dict(),
        "overrides": flow.view.overrides,
        "running": flow.running,
        "due": flow.due,
        "scheduled": flow.scheduled,
        "waiting_on_limit": flow.waiting_on_limit,
        "full": flow.full,
        "slots_held": flow.slots_held,
        "full_keys": len(flow.full_keys),
        "next_start_at": flow.next_start_at.isoformat() if flow.next_start_at else None,
        "reasons": flow.reasons,
    }
