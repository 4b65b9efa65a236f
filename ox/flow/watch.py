"""What a worker knows of its queues' flow control: which are limited (the settings' LIMITS
with the run-time overrides read from ox_queue at most a second ago, or at once on a NOTIFY),
and which the last gate held back and until when."""

import time
from typing import Any

from ox.flow.gate import Gated
from ox.flow.limits import QueueLimits, merged
from ox.flow.queues import read_states

REFRESH = 1.0  # seconds between reads of ox_queue (overrides set from the dashboard)


class FlowWatch:
    def __init__(self, settings: dict[str, QueueLimits], queues: list[str]) -> None:
        self.settings = settings
        self.queues = list(dict.fromkeys(queues))
        self.limits: dict[str, QueueLimits] = {q: settings[q] for q in self.queues if q in settings and settings[q].any}
        self.next_refresh = 0.0
        self.blocked: dict[str, str] = {}  # queue -> reason, from the last gate
        self.wake_at: dict[str, float] = {}  # queue -> epoch seconds (rates)

    def refresh(self, conn: Any, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self.next_refresh:
            return
        self.next_refresh = now + REFRESH
        states = read_states(conn, self.queues)
        limits = {}
        for q in self.queues:
            base = self.settings.get(q, QueueLimits())
            lim = merged(base, states[q][1]) if q in states else base
            if lim.any:
                limits[q] = lim
        self.limits = limits
        for q in list(self.blocked):
            if q not in limits:
                self.blocked.pop(q)
                self.wake_at.pop(q, None)

    @property
    def unlimited(self) -> list[str]:
        return [q for q in self.queues if q not in self.limits]

    def saw(self, looked: list[str], gated: Gated) -> None:
        """The gate looked at these queues and held back gated.blocked."""
        for q in looked:
            self.blocked.pop(q, None)
            self.wake_at.pop(q, None)
        self.blocked.update(gated.blocked)
        self.wake_at.update(gated.wake_at)

    def woken(self) -> None:
        """A NOTIFY: a task was enqueued, or a queue resumed or its limits changed."""
        self.next_refresh = 0.0
        self.blocked.clear()
        self.wake_at.clear()

    def open_limited(self, epoch_now: float) -> list[str]:
        """Limited queues worth a look now: all but those a rate holds back until later (a
        queue full by concurrency is looked at again at each claim: a poll, a slot freed
        here, a NOTIFY; another worker's slot frees without telling this one)."""
        return [q for q in self.limits if self.wake_at.get(q, epoch_now) <= epoch_now]

    def freed(self, queue: str) -> bool:
        """A task of `queue` finished here: a slot of it is free. True: claim again now."""
        if self.blocked.get(queue) in ("concurrency", "key concurrency"):
            self.blocked.pop(queue, None)
            return True
        return False
