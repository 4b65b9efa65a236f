"""The worker's idle mark (where it has a listener: PostgreSQL, MariaDB).

The enqueue trigger (migration 0012) sends its NOTIFY only for queues that a running worker has
marked idle in its ox_worker row (on MariaDB the producer reads the marks itself and wakes the
marked workers with KILL QUERY, ox.db.mysql.wake): a NOTIFY makes its committing transaction take a cluster-wide
lock until the commit is flushed, which costs concurrent producers up to a third of their
throughput, and a busy worker needs no wake-up (it claims again as soon as a slot frees).

- Marked (idle_since = now) after a claim that found less than it asked for, when the worker
  is about to wait with free slots; once, until cleared.
- Cleared with the heartbeat when no claim since the previous heartbeat came back short and
  the worker is not waiting now: it has had work all along, so producers stop notifying within
  two heartbeats. (A worker with free slots of one kind stays marked while the other kind keeps
  it busy: the trigger cannot tell the kinds apart, so it notifies; the worker claims, finds
  nothing of its free kind, and waits again.)
- A slot freed while unmarked: enqueues meanwhile notified no one, so the worker claims at
  once instead of at its next poll (marked, it would have been notified of them).
- The look after the mark: a producer whose trigger ran just before the mark committed (it saw
  no idle worker) and whose transaction commits just after the claim that preceded the mark
  sends nothing; the worker looks again IDLE_RELOOK after marking, which finds an enqueue that
  committed meanwhile. One that commits later still (a long transaction) waits for the next
  poll (POLL_INTERVAL) or the next notification.
"""

import time
from typing import TYPE_CHECKING

from ox import clock, sql
from ox.db import driver

if TYPE_CHECKING:
    from ox.worker import Worker

IDLE_RELOOK = 0.05  # seconds after marking: covers producers that were committing as it marked


class IdleMark:
    def __init__(self, worker: "Worker") -> None:
        self.w = worker
        self.marked = False
        self.short_since_heartbeat = False
        self.notified_while_full = False
        self.woken = False  # a wake-up came since the last claim

    def after_claim(self) -> None:
        """The claim just made found nothing more waiting: mark, and look again shortly."""
        w = self.w
        if w.listener is None:
            return  # nothing would hear a notification: leave producers alone
        self.short_since_heartbeat = True
        woken, self.woken = self.woken, False
        if self.marked:
            if woken and driver(w.conn).lossy_wakeups:
                # A wake-up sent while the listener was between two waits was lost; the
                # commit it was for may have come after this claim: look once more.
                w.next_poll = min(w.next_poll, time.monotonic() + IDLE_RELOOK)
            return
        sql.mark_idle(w.conn, w.id, clock.db_now(w.conn))
        self.marked = True
        w.next_poll = min(w.next_poll, time.monotonic() + IDLE_RELOOK)

    def slot_freed(self) -> None:
        w = self.w
        if w.listener is not None and (not self.marked or self.notified_while_full):
            self.notified_while_full = False
            w.more_waiting = True

    def clear_at_heartbeat(self) -> bool:
        """Whether this heartbeat clears the mark (and forget the claims seen since the last):
        no claim came back short since the last heartbeat, and the worker is not waiting now
        (free slots of a kind it claims now and nothing more to claim, as after a short claim:
        it makes no claim until woken, so "no short claim since" alone would clear a waiting
        worker). Async slots count once async tasks were seen (ox.claims.Claims.limits): until
        then a worker busy with sync tasks is cleared, and an async task enqueued meanwhile
        waits for its async probe (POLL_INTERVAL)."""
        w = self.w
        # A worker a limit holds back (ox.flow) is not waiting for enqueues: unmark it.
        waiting = not w.more_waiting and max(w.claims.limits()) > 0 and not w.flow.blocked
        clear = self.marked and not self.short_since_heartbeat and not waiting
        self.short_since_heartbeat = False
        if clear:
            self.marked = False
        return clear
