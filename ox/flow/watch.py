"""What a worker knows of its queues' flow control: which are limited (the settings' LIMITS
with the run-time overrides read from ox_queue at most a second ago, or at once on a NOTIFY
that says a queue's state changed; after an enqueue's NOTIFY the claim goes before a read that
is due), and which the last gate held back and until when.

A worker with any limited queue claims all its queues through the gate (ox.flow.gate), the
unlimited ones with no limits: one ordering by priority over everything it serves, so a
limited queue's backlog never runs ahead of a more urgent task of an unlimited queue, nor
the reverse."""

import time
from typing import Any

from ox.flow.decide import CONCURRENCY, KEY_RATE, RATE, Gated
from ox.flow.limits import QueueLimits, merged
from ox.flow.queues import read_states

REFRESH = 1.0  # seconds between reads of ox_queue (overrides set from the dashboard)


class FlowWatch:
    def __init__(self, settings: dict[str, QueueLimits], queues: list[str]) -> None:
        self.settings = settings
        self.queues = list(dict.fromkeys(queues))
        self.limits: dict[str, QueueLimits] = {}  # queue -> limits, every queue once any is limited
        self.explicit: set[str] = set()
        self.paused: set[str] = set()  # as read at the last refresh
        self._set({q: settings[q] for q in self.queues if q in settings and settings[q].any})
        self.next_refresh = 0.0
        self.claim_first = False  # woken by an enqueue: the next claim before a due read
        self.blocked: dict[str, str] = {}  # queue -> reason, from the last gate
        self.wake_at: dict[str, float] = {}  # queue -> epoch seconds: look again then (rates)
        self.hold_until: dict[str, float] = {}  # queue -> epoch seconds: its rate allows nothing before
        # Queues whose limits a refresh found changed (set at run time), or paused: the
        # worker gives back what it claimed of them ahead of its threads and has not started
        # (ox.leases.give_back_if_tightened), so that they start as the new limits allow
        # (claimed again, by the gate or under slots), or wait for the resume.
        self.tightened: set[str] = set()

    def _set(self, limited: dict[str, QueueLimits]) -> None:
        self.explicit = set(limited)  # the queues with limits of their own (or the limited flag)
        self.limits = {q: limited.get(q, QueueLimits()) for q in self.queues} if limited else {}

    def refresh(self, conn: Any, force: bool = False, claiming: bool = False) -> None:
        """Read the queues' state if a read is due. `claiming`: right before a claim, which
        goes first once after an enqueue's wake-up (woken)."""
        if claiming and self.claim_first:
            self.claim_first = False
            return
        now = time.monotonic()
        if not force and now < self.next_refresh:
            return
        self.next_refresh = now + REFRESH
        states = read_states(conn, self.queues)
        limited = {}
        for q in self.queues:
            base = self.settings.get(q, QueueLimits())
            lim = merged(base, states[q][1]) if q in states else base
            # ox_queue.limited: the unlimited claim skips the queue, so the gate must take it
            # even if its overrides read as no limit here (a value this version cannot read).
            if lim.any or (q in states and states[q][2]):
                limited[q] = lim
        before, explicit_before, paused_before = self.limits, self.explicit, self.paused
        self.paused = {q for q, state in states.items() if state[0]}
        self._set(limited)
        for q in self.queues:
            changed = self.limits.get(q, QueueLimits()) != before.get(q, QueueLimits())
            limited_now = q in self.explicit and (changed or q not in explicit_before)
            if limited_now or (q in self.paused and q not in paused_before):
                self.tightened.add(q)
        for q, lim in self.limits.items():
            if before.get(q) != lim:  # limits changed (a run-time override): look afresh
                self.blocked.pop(q, None)
                self.wake_at.pop(q, None)
                self.hold_until.pop(q, None)
        for q in list(self.blocked):
            if q not in self.limits:
                self.blocked.pop(q)
                self.wake_at.pop(q, None)
                self.hold_until.pop(q, None)

    def _own_gated(self) -> list[str]:
        return [q for q in self.explicit if q in self.limits and not self.limits[q].slotted]

    @property
    def slotted(self) -> dict[str, int]:
        """Queues whose only limit is `concurrency`: claimed under leased slots
        (ox.flow.slots), not through the gate; queue -> its concurrency. None for a worker
        that also serves a queue the gate claims: the gate claims them all then, in one
        priority order (it counts RUNNING rows, slotted workers' included)."""
        if self._own_gated():
            return {}
        return {q: lim.concurrency for q, lim in self.limits.items() if q in self.explicit and lim.concurrency}

    @property
    def gated(self) -> dict[str, QueueLimits]:
        """The queues the gate claims: with one that has key limits, rates, or limits it
        cannot read, every queue of this worker (one ordering by priority over all)."""
        return dict(self.limits) if self._own_gated() else {}

    @property
    def prefetchable(self) -> bool:
        """Whether the gate may claim ahead of free threads: only when every limited queue it
        claims has key concurrency 1 as its only limit (QueueLimits.one_per_key; ahead of a
        free thread a task would hold a queue-wide slot, one of a key's several places, or
        a rate's token early; a queue flagged limited with no limit this worker can read
        counts as limited). True with nothing gated."""
        return all(self.limits[q].one_per_key for q in self.explicit if q in self.gated)

    @property
    def unlimited(self) -> list[str]:
        """The queues the ordinary claim takes (slotted ones join it under their slots)."""
        if self._own_gated():
            return []
        return [q for q in self.queues if q not in self.explicit]

    def saw(self, looked: list[str], gated: Gated) -> None:
        """The gate looked at these queues and held back gated.blocked."""
        for q in looked:
            self.blocked.pop(q, None)
            self.wake_at.pop(q, None)
            self.hold_until.pop(q, None)
        self.blocked.update(gated.blocked)
        self.wake_at.update(gated.wake_at)
        self.hold_until.update(gated.hold_until)

    def slots_room(self, queue: str, room: int) -> None:
        """A slotted queue's claim: with no room here (no slot, or its slots' worth of tasks
        held here already) the queue is held back: the worker neither claims it nor wakes
        for its due tasks (it looks again when one of its tasks of the queue finishes, or at
        the poll), and does not mark itself idle."""
        if room > 0:
            self.blocked.pop(queue, None)
        else:
            self.blocked[queue] = CONCURRENCY

    def woken(self, state: bool = True) -> None:
        """A NOTIFY: a task was enqueued, or (`state`) a queue may have been paused or
        resumed, or its limits changed: then the state is read again before the claim. After
        an enqueue's the claim goes first (the read due, if any, waits for the next claim:
        the claim's own statement skips paused queues and those limited at run time, so a
        late read only delays a change of route, never breaks a pause or a limit)."""
        if state:
            self.next_refresh, self.claim_first = 0.0, False
        else:
            self.claim_first = True
        self.blocked.clear()
        self.wake_at.clear()
        self.hold_until.clear()

    def wakes(self) -> list[float]:
        """When to look again for queues a rate holds back: per queue the later of its keys'
        earliest next start and its own rate's. A time already past means now: the gate
        that refused saw it ahead of its own clock reading, and the moments since (a busy
        machine) must not turn a 20 ms wait into a poll interval. This never spins: every
        claim replaces what the gate looked at, and a claim with no free slot clears it."""
        out = [max(at, self.hold_until.get(q, at)) for q, at in self.wake_at.items()]
        out += [at for q, at in self.hold_until.items() if q not in self.wake_at]
        return out

    def open_limited(self, epoch_now: float) -> list[str]:
        """Gated queues worth a look now: all but those a rate holds back until later (a
        queue full by concurrency is looked at again at each claim: a poll, a slot freed
        here, a NOTIFY; another worker's slot frees without telling this one)."""
        return [q for q in self.gated if self.hold_until.get(q, epoch_now) <= epoch_now]

    def rate_held(self, epoch_now: float) -> bool:
        """Every queue of the worker held back by its own rate until later: a slot freed here
        starts nothing sooner (the worker already sleeps until the next token, and an enqueue
        meanwhile could not start before it either), so it is no reason to claim."""
        return bool(self.queues) and all(self.hold_until.get(q, 0.0) > epoch_now for q in self.queues)

    def freed(self, queue: str) -> bool:
        """A task of `queue` finished here: a slot of it is free. True: claim again now."""
        if self.blocked.get(queue) not in (None, RATE, KEY_RATE):
            self.blocked.pop(queue, None)
            return True
        return False
