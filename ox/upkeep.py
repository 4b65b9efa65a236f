"""The worker's upkeep between claims: leases renewed, limits followed, lost tasks
rescued, duties run, unstarted claims handed back. On the worker's (main) thread and
connection, like the rest of the loop (ox.worker)."""

import logging
import time
from typing import TYPE_CHECKING

from django.db import InterfaceError, OperationalError

from ox import clock, sql
from ox.db import driver
from ox.db.dialect import CHANNEL
from ox.executor import Key
from ox.logs import event

if TYPE_CHECKING:
    from ox.worker import Worker

logger = logging.getLogger("ox.worker")


def maintain(w: "Worker") -> None:
    """Between claims: what came back after an outage first, the heartbeat (leases), the
    limits followed, the rescue, timeouts and cancels enforced, the duties."""
    if w.reconnected:
        # Back after an outage: what finished meanwhile is written first (fenced), and
        # leases renewed, before this worker's rescuer may judge anyone's leases.
        w.reconnected = False
        w.completer.flush(w.conn)
        w.next_heartbeat = 0.0
    now = time.monotonic()
    if now >= w.next_heartbeat:
        w.next_heartbeat = now + w.options.heartbeat
        w.leases.heartbeat()
    prefetched = any(ex.waiting() for ex in (w.sync, w.aio) if ex is not None)
    if w.slots.sized or prefetched:
        # Between claims too (its threads may all be busy): a queue paused, or claimed by
        # the gate now, gets its parked tasks back within a second, before they start;
        # tasks claimed ahead go back if a limit they would hold was set meanwhile.
        w.flow.refresh(w.conn)
        w.leases.give_back_if_tightened()
    if w.slots.sized:
        w.slots.follow(w.conn, w.flow.slotted, set(w.flow.gated), w.flow.paused)
        w.claims.top_up_slots()
    if now >= w.next_rescue and now - w.reconnected_at < w.options.liveness_grace:
        w.next_rescue = w.reconnected_at + w.options.liveness_grace
    elif now >= w.next_rescue:
        w.next_rescue = now + w.options.rescue_interval
        if w.leases.rescue():
            # A worker was just found without its lock: look again when its grace is up.
            w.next_rescue = min(w.next_rescue, now + w.options.liveness_grace + 0.05)
    w.leases.enforce(now)
    for duty, next_run in w.duties:
        if now >= next_run[0]:
            next_run[0] = now + duty.interval
            try:
                duty.run(w.conn, clock.db_now(w.conn))
            except (OperationalError, InterfaceError):
                raise
            except Exception as exc:  # noqa: BLE001  (a duty's bug must not stop the tasks)
                event(logger, logging.ERROR, f"duty {duty.name} failed: {exc!r}", worker=w.id)


def hand_back(w: "Worker") -> None:
    """Claims that have not started go back to READY without spending an attempt:
    at shutdown every one waiting, otherwise those the loop set aside."""
    taken: list[Key] = list(w.to_hand_back)
    if w.stopping or w.stuck:
        taken += [p.key for ex in (w.sync, w.aio) if ex is not None for p in ex.take_back()]
    if not taken:
        return
    queues = {w.held[key].claimed.queue for key in taken if key in w.held}
    flows = [key[0] for key in taken if key in w.held and w.held[key].claimed.workflow_id is not None]
    count = sql.hand_back(w.conn, taken, clock.db_now(w.conn), flows)
    w.to_hand_back = []
    if count and (w.stopping or w.stuck) and driver(w.conn).notifies:
        # Back to READY, but no enqueue tells the idle workers, which may sleep a whole poll
        # interval: a leaving worker wakes them, as an enqueue would. Only a leaving one: a
        # running worker that gives back what it found no room for (an async task claimed
        # under the sync limit) would wake itself, claim the task again and give it back,
        # hundreds of times a second (tests/test_attack.py).
        with w.conn.cursor() as cursor:
            for queue in sorted(queues):
                driver(w.conn).notify(cursor, CHANNEL, queue)
    for key in taken:
        w.held.pop(key, None)
    w.claimed_total -= len(taken)
    if w.stopping:
        event(logger, logging.INFO, "handed back claimed tasks that had not started", count=count, worker=w.id)
