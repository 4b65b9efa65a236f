"""The worker's slots (ox.flow.slots) for its slotted queues: sizing the rows to the limit,
taking slots when there is work and room, giving back those it has no task for, renewing
them with the heartbeat, and telling the executors (ox.flow.local) how many of each queue's
tasks may run here at once.

A claim of a slotted queue asks for the slots held plus the prefetch, less what the worker
already holds of the queue: tasks past the slots wait parked, claimed and leased, and start
here as slots free. After each claim the slots beyond the queue's tasks held here go back at
once, for other workers."""

import logging
from collections.abc import Callable
from datetime import datetime

from django.db.backends.base.base import BaseDatabaseWrapper

from ox.flow import slots
from ox.flow.local import LocalLimits
from ox.logs import event

logger = logging.getLogger("ox.worker")

Resume = Callable[[list], None]


class SlotKeeper:
    def __init__(self, worker_id: str, local: LocalLimits, resume: Resume, hand_back: Resume) -> None:
        self.worker_id = worker_id
        self.local = local
        self.resume = resume  # hands parked tasks that may start now to their executors
        self.hand_back = hand_back  # gives parked tasks back to READY, unstarted
        self.sized: dict[str, int] = {}  # queue -> the concurrency its rows were sized to
        self.held: dict[str, set[int]] = {}  # queue -> slot numbers held (and counted)
        # queue -> slots held past a lowered limit: not counted (no task starts on them), kept
        # until the tasks running here fit in the counted ones, then given back.
        self.retired: dict[str, set[int]] = {}

    def count(self, queue: str) -> int:
        return len(self.held.get(queue, ()))

    def follow(self, conn: BaseDatabaseWrapper, slotted: dict[str, int], gated: set[str], paused: set[str]) -> None:
        """The slotted queues and their limits now (FlowWatch.slotted): size rows of a limit
        new or changed; let go of queues no longer slotted: their parked tasks go back to
        READY if the gate claims the queue now (it counts RUNNING rows, and would see them
        as running), or start if it has no limit. A paused queue's parked tasks go back."""
        for queue in paused & set(self.local.parked):
            self.hand_back(self.local.take_queue(queue))
        for queue, n in slotted.items():
            if self.sized.get(queue) != n:
                slots.size(conn, queue, n)
                self.sized[queue] = n
                mine = self.held.get(queue, set()) | self.retired.get(queue, set())
                self.retired[queue] = {i for i in mine if i >= n}
                self._set(queue, {i for i in mine if i < n})
            self._retire(conn, queue)
        for queue in [q for q in self.sized if q not in slotted]:
            if queue in gated:
                self.hand_back(self.local.take_queue(queue))
            held = self.held.pop(queue, set()) | self.retired.pop(queue, set())
            slots.give_back(conn, self.worker_id, queue, held)
            del self.sized[queue]
            self.resume(self.local.set_allowance(queue, None))

    def _retire(self, conn: BaseDatabaseWrapper, queue: str) -> None:
        retired = self.retired.get(queue)
        if retired and self.local.in_use(queue) <= self.count(queue):
            slots.retire(conn, self.worker_id, queue, retired, self.sized[queue])
            self.retired[queue] = set()

    def _set(self, queue: str, held: set[int]) -> None:
        self.held[queue] = held
        self.resume(self.local.set_allowance(queue, len(held)))

    def take(self, conn: BaseDatabaseWrapper, queue: str, cap: int, now: datetime, expires_at: datetime) -> None:
        """Hold up to `cap` slots of the queue (the most this worker could run of it)."""
        want = min(cap, self.sized.get(queue, 0)) - self.count(queue)
        if want > 0:
            got = slots.take(conn, self.worker_id, queue, want, now, expires_at)
            if got:
                self._set(queue, self.held.get(queue, set()) | set(got))

    def trim(self, conn: BaseDatabaseWrapper, queue: str, in_use: int) -> None:
        """No more work found: keep as many slots as the queue's tasks held here."""
        held = sorted(self.held.get(queue, set()))
        extra = held[max(in_use, 0) :]
        if extra:
            slots.give_back(conn, self.worker_id, queue, extra)
            self._set(queue, set(held[: max(in_use, 0)]))

    def renew(self, conn: BaseDatabaseWrapper, expires_at: datetime) -> None:
        """With the heartbeat: extend the leases; a slot lost meanwhile (its lease ran out
        during an outage and another worker took it, or a lower limit deleted it) stops
        counting here at once."""
        if not any(self.held.values()) and not any(self.retired.values()):
            return
        kept = slots.renew(conn, self.worker_id, expires_at)
        for queue, retired in self.retired.items():
            retired &= kept.get(queue, set())
        for queue, held in list(self.held.items()):
            still = held & kept.get(queue, set())
            if still != held:
                event(
                    logger,
                    logging.WARNING,
                    "slots lost",
                    queue=queue,
                    held=len(held),
                    kept=len(still),
                    worker=self.worker_id,
                )
                self._set(queue, still)

    def give_back_all(self, conn: BaseDatabaseWrapper) -> None:
        if any(self.held.values()) or any(self.retired.values()):
            slots.give_back_all(conn, self.worker_id)
        for queue in self.held:
            self.held[queue] = set()
        self.retired.clear()

    def room(
        self,
        conn: BaseDatabaseWrapper,
        queue: str,
        asking: bool,
        in_use: int,
        prefetch: int,
        cap: int,
        now: datetime,
        lease: datetime,
    ) -> int:
        """Before a claim (asking: it has free threads or prefetch to fill): take slots up
        to `cap`, and say how many of the queue's tasks the claim may bring (the slots held
        plus the prefetch, less the queue's tasks held here already; none without a slot: a
        task parked here would wait while a worker holding slots could run it). `cap`: the
        slots this worker could start tasks on now (its free threads, and those its tasks of
        the queue run on): a worker busy with other queues takes none."""
        if asking:
            self.take(conn, queue, cap, now, lease)
        held = self.count(queue)
        if not asking and in_use < held:  # slots with nothing to run here (no free thread)
            self.trim(conn, queue, in_use)
        return max(held + prefetch - in_use, 0) if held else 0

    def after(self, conn: BaseDatabaseWrapper, queue: str, in_use: int) -> None:
        """After the claim: the worker keeps only the slots its tasks of the queue here use
        (the claim found no more of them, or filled this worker's threads with other queues'
        tasks); the rest go back for other workers."""
        if in_use < self.count(queue):
            self.trim(conn, queue, in_use)
