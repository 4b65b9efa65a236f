"""The worker's side of slots (ox.flow.slots): of a slotted queue, at most as many tasks run
here at once as the worker holds slots. Claimed tasks beyond that (prefetched ones) are parked
and start, in claim order, as the queue's running ones finish or more slots come; they are
still held (leased, renewed), and are given back with the inbox at shutdown.

Shared by the executor threads and the worker's loop: every method takes the lock."""

import threading
from collections import Counter, deque
from typing import Any


def _order(prep: Any) -> tuple:
    c = prep.claimed
    return (-c.priority, c.run_after, c.id)


class LocalLimits:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.allowance: dict[str, int] = {}  # slotted queue -> slots held here
        self.running: Counter[str] = Counter()  # slotted queue -> admitted, not finished
        self.parked: dict[str, deque[Any]] = {}
        self.counted: set[Any] = set()  # keys admitted under a slotted queue's count

    def admit(self, prep: Any) -> bool:
        """May this task start now? If not it is parked (False) until a slot of its queue frees here."""
        queue = prep.claimed.queue
        with self.lock:
            if queue not in self.allowance or prep.key in self.counted:
                return True  # not slotted here, or admitted already (resumed from parked)
            if self.running[queue] < self.allowance[queue] and not self.parked.get(queue):
                self.running[queue] += 1
                self.counted.add(prep.key)
                return True
            waiting = self.parked.setdefault(queue, deque())
            waiting.append(prep)
            if len(waiting) > 1 and _order(waiting[-2]) > _order(prep):
                # A more urgent task claimed after the ones parked goes before them: parked
                # tasks start in claim order (priority, then due time, then id).
                self.parked[queue] = deque(sorted(waiting, key=_order))
            return False

    def finished(self, prep: Any) -> list[Any]:
        """An admitted task ended (or went back unstarted): the parked ones of its queue that
        may start now (admitted)."""
        queue = prep.claimed.queue
        with self.lock:
            if prep.key in self.counted:
                self.counted.discard(prep.key)
                self.running[queue] = max(self.running[queue] - 1, 0)
            return self._release(queue) if queue in self.allowance else []

    def set_allowance(self, queue: str, slots: int | None) -> list[Any]:
        """How many slots of `queue` this worker holds (None: the queue is not slotted any
        more). Returns the parked tasks that may start now."""
        with self.lock:
            if slots is None:  # no limit here now: they all go (the caller took them if not)
                self.allowance.pop(queue, None)
                return list(self.parked.pop(queue, ()))
            self.allowance[queue] = slots
            return self._release(queue)

    def _release(self, queue: str) -> list[Any]:
        out = []
        waiting = self.parked.get(queue)
        while waiting and self.running[queue] < self.allowance[queue]:
            prep = waiting.popleft()
            self.running[queue] += 1
            self.counted.add(prep.key)
            out.append(prep)
        return out

    def in_use(self, queue: str) -> int:
        with self.lock:
            return self.running[queue]

    def parked_count(self, is_async: bool) -> int:
        with self.lock:
            return sum(1 for d in self.parked.values() for p in d if p.is_async == is_async)

    def parked_keys(self, is_async: bool) -> set[Any]:
        with self.lock:
            return {p.key for d in self.parked.values() for p in d if p.is_async == is_async}

    def take_parked(self, is_async: bool) -> list[Any]:
        """Every parked task of one kind (shutdown, or given back): they never started."""
        with self.lock:
            out = []
            for waiting in self.parked.values():
                kept = [p for p in waiting if p.is_async != is_async]
                out += [p for p in waiting if p.is_async == is_async]
                waiting.clear()
                waiting.extend(kept)
            return out

    def take_queue(self, queue: str) -> list[Any]:
        """Every parked task of a queue, both kinds (it was paused, or the gate claims it now)."""
        with self.lock:
            return list(self.parked.pop(queue, ()))

    def drop(self, key: Any, is_async: bool) -> Any | None:
        """Take one parked task of a kind out (its lease was lost, or it was cancelled before
        it started)."""
        with self.lock:
            for waiting in self.parked.values():
                for prep in waiting:
                    if prep.key == key and prep.is_async == is_async:
                        waiting.remove(prep)
                        return prep
        return None
