"""The gate's decision: candidates offered in claim order, each taken if every limit of its
queue allows it now, with what runs and the rate schedules counted as it goes; then why each
queue gave less than it had, and when a rate lets it start again."""

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ox.db.rows import read_ts
from ox.flow.limits import QueueLimits, next_start, take

# Why a queue gave fewer tasks than it had due (the dashboard and the worker's wake-up read it).
PAUSED, CONCURRENCY, KEYS, RATE, KEY_RATE = "paused", "concurrency", "key concurrency", "rate", "key rate"
_FIRST = (CONCURRENCY, KEYS, RATE, KEY_RATE)  # the reason reported when several held a queue


@dataclass(slots=True)
class Candidate:
    id: object  # as the database returns it
    queue: str
    is_async: bool
    limit_key: str | None
    priority: int
    run_after: datetime

    @classmethod
    def of(cls, r: Sequence[Any]) -> "Candidate":
        """From a row of (id, queue, is_async, limit_key, priority, run_after)."""
        return cls(r[0], str(r[1]), bool(r[2]), r[3], int(r[4]), read_ts(r[5]))

    @property
    def order(self) -> tuple[int, datetime, Any]:
        # The id as the database returns it (a UUID on PostgreSQL, its hex text on SQLite):
        # either sorts as the database's id order, and one claim's ids are all one kind.
        return (-self.priority, self.run_after, self.id)


@dataclass
class Gated:
    claimed: list = field(default_factory=list)  # ox.sql.Claimed
    # queue -> why it could give no more (only queues with due tasks left behind)
    blocked: dict[str, str] = field(default_factory=dict)
    # epoch seconds: when a rate allows the queue's next start (its own rate, or the earliest
    # of its keys' rates): the worker sleeps until then (a queue held by a full concurrency
    # limit is looked at again at the poll, or when a slot frees here)
    wake_at: dict[str, float] = field(default_factory=dict)
    # epoch seconds: the queue's own rate allows nothing before then; the worker does not ask
    # the gate for the queue until then. (A key's rate never holds back the queue.)
    hold_until: dict[str, float] = field(default_factory=dict)


class Decision:
    def __init__(
        self,
        limits: dict[str, QueueLimits],
        tats: dict[str, float | None],
        running: tuple[Counter[str], Counter[tuple[str, str]]],
        now: float,
    ) -> None:
        self.limits, self.now = limits, now
        self.running, self.per_key = running
        self.tats = dict(tats)
        self.key_tats: dict[tuple[str, str], float] = {}
        self.taken: list[object] = []
        self.taken_from: Counter[str] = Counter()
        self.refused: dict[str, set[str]] = {}  # queue -> reasons
        self.wakes: dict[str, float] = {}  # queue -> earliest rate wake among refusals
        self.rate_wakes: dict[str, float] = {}  # queue -> its own rate's next start
        self.refused_keys: set[tuple[str, str]] = set()  # full or rate-held keys seen
        self.rate_changed: set[str] = set()
        self.key_changed: set[tuple[str, str]] = set()
        # Keys whose earliest task seen was passed over in this claim (refused, or of a kind
        # without room): their later tasks wait too, so order holds within a key.
        self.passed: set[tuple[str, str]] = set()

    def _refuse(self, c: Candidate, why: str, wake: float | None = None) -> bool:
        self.refused.setdefault(c.queue, set()).add(why)
        if c.limit_key is not None and why in (KEYS, KEY_RATE):
            self.refused_keys.add((c.queue, c.limit_key))
        if wake is not None:
            self.wakes[c.queue] = min(wake, self.wakes.get(c.queue, wake))
            if why == RATE:
                self.rate_wakes[c.queue] = wake
        return False

    def held_by_keys(self, queue: str) -> bool:
        """Whether the queue passed over tasks for their keys and could still give more: a
        longer look past them may find tasks of free keys. (Not when the queue itself is
        full, or its own rate is spent: nothing more would be taken.)"""
        lim = self.limits[queue]
        if lim.concurrency is not None and self.running[queue] >= lim.concurrency:
            return False
        if queue in self.rate_wakes:
            return False
        reasons = self.refused.get(queue, set())
        return bool(reasons & {KEYS, KEY_RATE}) or any(q == queue for q, _k in self.passed)

    def offer(self, c: Candidate) -> bool:
        lim = self.limits[c.queue]
        if lim.concurrency is not None and self.running[c.queue] >= lim.concurrency:
            return self._refuse(c, CONCURRENCY)
        pair = (c.queue, c.limit_key) if c.limit_key is not None else None
        if pair is not None and lim.key_concurrency is not None and self.per_key[pair] >= lim.key_concurrency:
            return self._refuse(c, KEYS)
        new_tat = new_key_tat = None
        if lim.rate is not None:
            new_tat = take(self.tats.get(c.queue), self.now, lim.rate)
            if new_tat is None:
                return self._refuse(c, RATE, next_start(self.tats.get(c.queue), self.now, lim.rate))
        if pair is not None and lim.key_rate is not None:
            new_key_tat = take(self.key_tats.get(pair), self.now, lim.key_rate)
            if new_key_tat is None:
                return self._refuse(c, KEY_RATE, next_start(self.key_tats.get(pair), self.now, lim.key_rate))
        if new_tat is not None:
            self.tats[c.queue] = new_tat
            self.rate_changed.add(c.queue)
        if new_key_tat is not None and pair is not None:
            self.key_tats[pair] = new_key_tat
            self.key_changed.add(pair)
        self.running[c.queue] += 1
        if pair is not None:
            self.per_key[pair] += 1
        self.taken.append(c.id)
        self.taken_from[c.queue] += 1
        return True

    def outcome(self) -> Gated:
        """Why each queue held tasks back, and when its rates allow the next start. Only the
        queue's own rate holds the queue back (hold_until): one key's rate never holds back
        the queue's other keys, it only says when to look again."""
        out = Gated()
        for queue, reasons in self.refused.items():
            out.blocked[queue] = next(why for why in _FIRST if why in reasons)
            if queue in self.wakes:
                out.wake_at[queue] = self.wakes[queue]
            if queue in self.rate_wakes:
                out.hold_until[queue] = self.rate_wakes[queue]
        return out
