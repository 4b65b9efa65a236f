"""Claiming: how many tasks of each kind to ask for, the claim itself (with finished tasks
riding on it), and handing what was claimed to the executors, so that a claim is never left
held without an executor and one worker never hoards what another could run now."""

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.tasks.base import TaskError

from ox import clock, sql
from ox.completer import refused
from ox.execution import Finished, Prepared, decide_retry, prepare, unrunnable
from ox.flow import gate
from ox.workflow import join
from ox.workflow.canvas import input_text, with_input

if TYPE_CHECKING:
    from ox.worker import Worker

logger = logging.getLogger("ox.worker")

TOP_UP_EVERY = 0.5  # seconds between looks for more slots for tasks parked here


@dataclass
class Held:
    """A claim this worker holds a lease on: being prepared, or handed to an executor."""

    claimed: sql.Claimed
    prep: Prepared | None = None
    interrupted_at: float | None = None  # monotonic
    lost: bool = False


class Claims:
    def __init__(self, worker: "Worker") -> None:
        self.w = worker
        self.async_queues: set[str] = set()  # queues an async task was claimed from
        self.next_top_up = 0.0
        # Per kind (sync, async): the last claim that asked for it got all it asked, so more
        # may wait; a slot of that kind freeing is then a reason to claim at once, idle mark
        # or not (the mark is for enqueues: it does not say the backlog is empty).
        self.full = [False, False]

    def busy(self, is_async: bool) -> int:
        w = self.w
        return sum(1 for h in w.held.values() if (h.prep.is_async if h.prep else h.claimed.is_async) == is_async)

    def limits(self, probe: bool = True) -> tuple[int, int]:
        """How many sync and async tasks to ask for: each kind's free slots, plus a prefetch
        sized to how short tasks are (none while prefetched tasks were just given back).
        Async tasks are looked for once seen, or once a poll interval (probe=False: the room
        for them whatever the probe says)."""
        w = self.w
        # A worker whose queues go through the gate (ox.flow) claims for free slots only: a
        # prefetched task would hold a limited slot without running, and asking the gate for
        # room it will not give is a claim (and a probe) for nothing while the slots are busy.
        # Except where key concurrency is the only limit (FlowWatch.prefetchable): a task
        # claimed ahead then holds just its own key.
        extra = 0 if w.prefetch_hold or not w.flow.prefetchable else w.prefetch.size()
        limits = []
        for is_async, slots in ((False, w.settings.concurrency), (True, w.settings.async_concurrency)):
            busy = self.busy(is_async)
            want = max(slots + extra - busy, 0)
            # Refill early, before the prefetched tasks run out, but not one task at a time.
            limits.append(want if busy < slots or want >= max(extra // 2, 1) else 0)
        if probe and not (w.async_seen or time.monotonic() >= w.next_async_probe):
            limits[1] = 0
        if w.settings.max_tasks is not None:
            left = max(w.settings.max_tasks - w.claimed_total, 0)
            limits[0] = min(limits[0], left)
            limits[1] = min(limits[1], left - limits[0])
        return limits[0], limits[1]

    def claim(self) -> None:
        w = self.w
        sync_limit, async_limit = self.limits()
        now = clock.db_now(w.conn)
        lease = now + timedelta(seconds=w.options.lease)
        w.last_claim_at = time.monotonic()
        w.claim_rounds += 1
        # Finished tasks ride on the claim: one round trip, one commit for both.
        w.completer.flush_failures(w.conn)
        done = w.completer.take_successes()
        w.flow.refresh(w.conn, claiming=True)
        w.leases.give_back_if_tightened()  # before the claim: what it set aside goes back first
        try:
            written, claimed, filled = self._claim_rows(done, (sync_limit, async_limit), now, lease)
        except Exception as exc:
            if not (done and refused(exc)):
                raise
            # A result the database refused: find it, write the rest; claim next time round.
            w.completer.isolate(w.conn, lambda batch: sql.complete(w.conn, batch))
            return
        if done:
            w.completer.written(written)
        for c in claimed:
            w.held[c.key] = Held(c)
            if c.is_async:
                self.async_queues.add(c.queue)
        w.claimed_total += len(claimed)
        got_async = sum(1 for c in claimed if c.is_async)
        for kind, asked, got in ((0, sync_limit, len(claimed) - got_async), (1, async_limit, got_async)):
            if asked > 0:
                self.full[kind] = got >= asked
        probe_only = sync_limit == 0 and not w.async_seen  # looking for a kind never seen yet
        w.async_seen = w.async_seen or got_async > 0
        if async_limit and not got_async:
            w.next_async_probe = time.monotonic() + w.poll_interval
        # A workflow task's end may have made its followers READY: claim again at once.
        w.more_waiting = w.completer.take_followed() or filled
        gave_back = True
        try:
            gave_back = self._start(claimed)
        finally:
            # Whatever failed above, a claim is never left held without an executor.
            w.to_hand_back.extend(k for k, h in w.held.items() if h.prep is None and k not in w.to_hand_back)
        if gave_back:
            # What went back would come straight back: claim again when a slot frees (or at
            # the next poll), never in a claim/hand-back loop.
            w.gave_back, w.more_waiting = True, False
            w.next_poll = time.monotonic() + w.poll_interval
        elif not w.more_waiting:
            self._schedule_poll()
            # Held back by a limit (ox.flow), the worker does not mark itself waiting: new
            # tasks would not change what the limit allows, and every enqueue would notify
            # it for a claim the limit refuses. It looks again at its poll, or when one of
            # its own tasks of the queue finishes.
            if not probe_only and not w.flow.blocked:
                w.idle.after_claim()

    def _claim_rows(
        self, done: list[sql.Completion], limits: tuple[int, int], now: datetime, lease: datetime
    ) -> tuple[set[tuple[uuid.UUID, int]], list[sql.Claimed], bool]:
        """Queues with key limits or rates through the gate (ox.flow.gate) first, with the
        completions (their slots then count as free), for the free slots only (no prefetch:
        a prefetched task would hold a limited slot without running; but with prefetch when
        key concurrency is the only limit, see limits()); then one ordinary
        claim for the unlimited queues and the slotted ones this worker holds slots of
        (ox.flow.keeper; prefetch included: past its slots a task waits parked here), with
        the completions if the gate did not take them. Returns the completions written, the
        claimed, and whether every claim got all it asked for."""
        w = self.w
        flow = w.flow
        written: set[tuple[uuid.UUID, int]] = set()
        claimed: list[sql.Claimed] = []
        filled = False
        slotted = flow.slotted
        if slotted or w.slots.sized:
            w.slots.follow(w.conn, slotted, set(flow.gated), flow.paused)
        # Queues whose only limit is concurrency: under the slots held here (ox.flow.keeper),
        # in the ordinary claim, at most `room` each (more would only wait parked).
        open_slotted = []
        extra = 0 if w.prefetch_hold else w.prefetch.size()
        for queue, n in slotted.items():
            if queue in flow.paused:  # nothing to claim (the statement skips it): no slot either
                w.slots.trim(w.conn, queue, self._of(queue))
                continue
            # The slots it could start the queue's tasks on now: its free threads (and free
            # async slots once the queue is known to have async tasks: a worker that ever saw
            # one would otherwise take a sync queue's every slot), plus those its tasks of the
            # queue run on. A worker whose threads are busy with other queues takes none.
            cap = self._slot_cap(queue, n)
            room = w.slots.room(w.conn, queue, max(limits) > 0, self._of(queue), extra, cap, now, lease)
            flow.slots_room(queue, room)
            if room > 0:
                open_slotted.append(queue)
        looked = flow.open_limited(now.timestamp())
        if looked:
            demand = limits
            if not flow.prefetchable:
                demand = tuple(
                    min(want, max(slots - self.busy(kind), 0))
                    for want, slots, kind in zip(
                        limits, (w.settings.concurrency, w.settings.async_concurrency), (False, True), strict=True
                    )
                )
            gate_written, gated = gate.claim_limited(
                w.conn, w.id, {q: flow.limits[q] for q in looked}, demand, now, lease, done
            )
            written |= gate_written
            done = []
            flow.saw(looked, gated)
            claimed += gated.claimed
            got_async = sum(1 for c in gated.claimed if c.is_async)
            # As for the unlimited claim: a kind that got all it asked for may have more
            # waiting, so claim again as soon as a slot frees.
            filled = (
                filled
                or (demand[0] > 0 and len(gated.claimed) - got_async >= demand[0])
                or (demand[1] > 0 and got_async >= demand[1])
            )
            limits = (max(limits[0] - (len(gated.claimed) - got_async), 0), max(limits[1] - got_async, 0))
        queues = flow.unlimited + open_slotted
        if queues and max(limits) > 0:
            more_written, more = sql.complete_and_claim(
                w.conn, done, w.id, queues, limits, now, lease, gate=open_slotted
            )
            written |= more_written
            claimed += more
            got_async = sum(1 for c in more if c.is_async)
            more_filled = (limits[0] > 0 and len(more) - got_async >= limits[0]) or (
                limits[1] > 0 and got_async >= limits[1]
            )
            filled = filled or more_filled
            for queue in open_slotted:
                w.slots.after(w.conn, queue, self._of(queue) + sum(1 for c in more if c.queue == queue))
        elif done:
            written |= sql.complete(w.conn, done)
        return written, claimed, filled

    def _slot_cap(self, queue: str, n: int) -> int:
        """How many of a slotted queue's slots this worker could start tasks on now."""
        w = self.w
        free = max(w.settings.concurrency - (self.busy(False) - w.local.parked_count(False)), 0)
        if queue in self.async_queues:
            free += max(w.settings.async_concurrency - (self.busy(True) - w.local.parked_count(True)), 0)
        return min(n, w.local.in_use(queue) + free)

    def top_up_slots(self) -> None:
        """Between claims: a queue with tasks parked here takes the slots it could start
        them on (its limit was raised, or another worker gave slots back)."""
        w = self.w
        if time.monotonic() < self.next_top_up:
            return
        self.next_top_up = time.monotonic() + TOP_UP_EVERY  # a statement at most this often
        for queue, n in w.flow.slotted.items():
            if queue in w.local.parked and w.local.parked[queue] and queue not in w.flow.paused:
                cap = self._slot_cap(queue, n)
                if cap > w.slots.count(queue):
                    now = clock.db_now(w.conn)
                    w.slots.take(w.conn, queue, cap, now, now + timedelta(seconds=w.options.lease))

    def _of(self, queue: str) -> int:
        """The queue's tasks held here (claimed, parked, running)."""
        return sum(1 for h in self.w.held.values() if h.claimed.queue == queue)

    def _start(self, claimed: list[sql.Claimed]) -> bool:
        """Prepare and hand over; True if some claims had to go back."""
        w = self.w
        history = self._history([c.id for c in claimed if c.attempts > 1])
        flows = [c for c in claimed if c.workflow_id is not None]
        if flows:
            # A task after others in a workflow gets their results first (from its edges),
            # read by the claim itself where the database allows (Claimed.inputs).
            unread = [c.id for c in flows if c.inputs is None]
            found = join.inputs(w.conn, unread) if unread else {}
            for c in flows:
                pairs = c.inputs if c.inputs is not None else found.get(c.id)
                if pairs:
                    c.args_json = with_input(c.args_json, input_text(pairs))
        preps: list[Prepared] = []
        for c in claimed:
            timeout = w.options.timeout_for(c.queue, None)
            try:
                prep = prepare(c, w.backend.alias, w.id, history.get(c.id, ([], [])), timeout, w.alias)
            except Exception as exc:  # noqa: BLE001  (one odd row never stops the others)
                prep = unrunnable(c, f"the task could not be prepared: {exc!r}", retryable=True, cause=exc)
            if isinstance(prep, Finished):
                # No user code decides here (the task did not even resolve): default backoff.
                del w.held[c.key]
                w.completer.add(decide_retry(prep, w.options))
            else:
                w.async_seen = w.async_seen or prep.is_async
                preps.append(prep)
        return self._hand_over(preps)

    def _history(self, ids: list[uuid.UUID]) -> dict[uuid.UUID, tuple[list[TaskError], list[str]]]:
        """Earlier attempts of retried tasks, so their context (its attempt number) and
        signals see them. If they cannot be read (the connection dropped), this raises: the
        claim's tasks go back unstarted rather than run with a wrong attempt number."""
        w = self.w
        if not ids:
            return {}
        rows = sql.attempt_history(w.conn, ids)
        out = {}
        for task_id, found in rows.items():
            errors = [TaskError(exception_class_path=path, traceback=text) for path, text, _w in found]
            out[task_id] = (errors, [worker for _p, _t, worker in found])
        return out

    def _schedule_poll(self) -> None:
        """Sleep until the next poll, or until the earliest scheduled task is due."""
        w = self.w
        wait = w.poll_interval
        # Only the kinds there is room for: a due async task behind full async slots must
        # not wake a worker whose free slots are sync ones, again and again.
        sync_room, async_room = self.limits(probe=False)
        # Queues a limit holds back are left out (their tasks are due but may not start);
        # a rate says when its next start is allowed.
        now = clock.db_now(w.conn)
        queues = [q for q in w.settings.queues if q not in w.flow.blocked]
        earliest = sql.earliest_ready(w.conn, queues, (sync_room > 0, async_room > 0), gate=True) if queues else None
        for at in w.flow.wakes():
            wait = min(wait, max(at - now.timestamp(), 0.001))
        if earliest is not None:
            wait = min(wait, max((earliest - now).total_seconds(), 0.001))
            if async_room and not w.async_seen:
                # What comes due may be async (a task scheduled a moment ahead, or one whose
                # producer's reading of the database clock is a few ms ahead of ours): look
                # for async tasks then, not only at the next probe a poll interval away.
                w.next_async_probe = min(w.next_async_probe, time.monotonic() + wait)
        retry_in = w.completer.retry_due - time.monotonic()
        if retry_in > 0:  # a retry this worker scheduled comes due sooner
            wait = min(wait, retry_in)
        w.next_poll = time.monotonic() + wait

    def _hand_over(self, preps: list[Prepared]) -> bool:
        """Give claimed tasks to their executor: as many as the kind has free slots, then
        prefetched ones only if their path is known to be short. The rest go straight back,
        so one worker never hoards what another could run now."""
        w = self.w
        assert w.sync is not None and w.aio is not None
        extra = 0 if w.prefetch_hold else w.prefetch.size()
        new = {p.key for p in preps}
        room = {}
        for is_async, slots in ((False, w.settings.concurrency), (True, w.settings.async_concurrency)):
            busy = sum(1 for k, h in w.held.items() if h.prep and h.prep.is_async == is_async and k not in new)
            room[is_async] = (slots - busy, extra)
        back = []
        for prep in preps:
            free, prefetch = room[prep.is_async]
            if free > 0:
                room[prep.is_async] = (free - 1, prefetch)
            elif prefetch > 0 and w.prefetch.short(prep.claimed.task_path):
                room[prep.is_async] = (free, prefetch - 1)
            else:
                back.append(prep)
                continue
            w.held[prep.key].prep = prep
            (w.aio if prep.is_async else w.sync).submit(prep)
        if back:  # left without prep: claim() sets them aside for _hand_back
            w.prefetch_hold = True
        return bool(back)
