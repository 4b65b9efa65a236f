"""The worker's duties towards what it holds: renew leases (and write when bodies started),
act on cancels, enforce timeouts, give back prefetched tasks stuck behind long ones, and
run the rescuer for everyone's lost tasks."""

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from ox import clock, sql
from ox.exceptions import TaskCancelled, TaskTimeout
from ox.logs import event, task_fields
from ox.metadata import flush_waiting

if TYPE_CHECKING:
    from ox.worker import Worker

logger = logging.getLogger("ox.worker")


class Leases:
    def __init__(self, worker: "Worker") -> None:
        self.w = worker

    def heartbeat(self) -> None:
        w = self.w
        assert w.sync is not None and w.aio is not None
        now = clock.db_now(w.conn)
        # Under DEBUG Django keeps every statement of a connection (up to 9,000): the worker's
        # own would hold tens of MiB of claims and completions for nothing.
        w.conn.queries_log.clear()
        clear = w.idle.clear_at_heartbeat()
        try:
            sql.heartbeat(w.conn, w.id, now, clear_idle=clear)
        except Exception:
            if clear:
                w.idle.marked = True  # the row was not cleared: the next heartbeat tries again
            raise
        rows = []
        for key, held in w.held.items():
            if held.lost:
                continue
            started = None
            if held.prep is not None:
                started = (w.aio if held.prep.is_async else w.sync).started_wall(key)
            rows.append((key[0], key[1], started))
        # Finished but not yet written: their leases must not run out while they wait.
        rows += [(f.claimed.id, f.claimed.fence, None) for f in w.completer.pending()]
        kept = sql.renew(w.conn, rows, now + timedelta(seconds=w.options.lease))
        flush_waiting(w.conn)  # metadata saved since the last write (ox.metadata)
        w.slots.renew(w.conn, now + timedelta(seconds=w.options.lease))
        for key, held in list(w.held.items()):
            if held.lost:
                continue
            if key not in kept:
                self._lost(key)
            elif kept[key]:
                w.interrupt(key, TaskCancelled)

    def _lost(self, key: tuple) -> None:
        w = self.w
        held = w.held[key]
        held.lost = True
        if held.prep is None:
            return
        executor = w.aio if held.prep.is_async else w.sync
        assert executor is not None
        if not executor.forget(key):
            message = "lease lost while running; the outcome will be fenced out"
            event(logger, logging.WARNING, message, **task_fields(held.claimed), worker=w.id)

    def rescue(self) -> bool:
        """Run the rescuer once; True if it found a worker whose lock just went free."""
        w = self.w
        now = clock.db_now(w.conn)
        rescued, marked = sql.rescue_and_mark(w.conn, now, w.options.max_lost, w.options.liveness_grace)
        if rescued:
            w.more_waiting = True  # claim them now rather than at the next poll
        for task_id, worker_id, status in rescued:
            event(
                logger,
                logging.WARNING,
                "rescued a lost task",
                task_id=task_id,
                lost_worker=worker_id,
                status=status,
                worker=w.id,
            )
        for worker_id in marked:
            message = "a worker's liveness lock is free; its tasks are rescued unless it is back within the grace"
            event(logger, logging.INFO, message, lost_worker=worker_id, worker=w.id)
        return bool(marked)

    def deadlines(self) -> list[float]:
        """When a running sync task times out or outlives its interrupt (the event loop
        enforces async timeouts itself), or when prefetched tasks have waited behind long
        ones for the prefetch window."""
        w = self.w
        assert w.sync is not None
        out = []
        window = w.options.prefetch_window
        waiting = w.sync.waiting() > 0
        assert w.aio is not None
        waiting_async = w.aio.waiting() > 0
        for key, held in w.held.items():
            if held.prep is None:
                continue
            executor = w.aio if held.prep.is_async else w.sync
            started = executor.started_at(key)
            if started is None:
                continue  # an unstarted task that was cancelled just skips: nothing to wait for
            if held.interrupted_at is not None:
                out.append(held.interrupted_at + w.options.interrupt_grace)
            elif held.prep.timeout:
                grace = w.options.interrupt_grace if held.prep.is_async else 0.0
                out.append(started + held.prep.timeout + grace)
            if window is not None and (waiting_async if held.prep.is_async else waiting):
                out.append(started + window)
            elif window is not None and w.local.parked.get(held.claimed.queue):
                out.append(started + window)  # tasks parked behind it may have to go back
        return out

    def enforce(self, now: float) -> None:
        w = self.w
        assert w.sync is not None and w.aio is not None
        for key, held in list(w.held.items()):
            if held.prep is None:
                continue
            executor = w.aio if held.prep.is_async else w.sync
            if held.interrupted_at is not None:
                started = executor.started_at(key)
                if started is not None and not w.stuck and now - held.interrupted_at > w.options.interrupt_grace:
                    w.stuck = True
                    message = "task ignored its interrupt; the worker stops claiming and will exit"
                    event(logger, logging.ERROR, message, **task_fields(held.claimed), worker=w.id)
            elif held.prep.timeout and not held.prep.is_async:
                started = w.sync.started_at(key)
                if started is not None and now >= started + held.prep.timeout:
                    w.interrupt(key, TaskTimeout)
            elif held.prep.timeout:
                # The event loop cancels an async task at its timeout; one that swallows the
                # cancellation and runs on is stuck like a thread that ignores its interrupt.
                started = w.aio.started_at(key)
                late = held.prep.timeout + w.options.interrupt_grace
                if started is not None and not w.stuck and now - started > late:
                    w.stuck = True
                    message = "async task ran on past its timeout; the worker stops claiming and will exit"
                    event(logger, logging.ERROR, message, **task_fields(held.claimed), worker=w.id)
        self._give_back_hoarded(now, is_async=False)
        self._give_back_hoarded(now, is_async=True)
        self._give_back_parked(now)

    def give_back_if_tightened(self) -> None:
        """Queues whose limits were set or changed at run time, or that were paused
        (ox.flow.watch.FlowWatch.tightened): their tasks claimed ahead of a thread (waiting
        in an executor, not parked for a slot: ox.flow.keeper sees to those) go back
        unstarted, so they start as the new limits allow, or after the resume."""
        w = self.w
        if not w.flow.tightened:
            return
        queues, w.flow.tightened = w.flow.tightened, set()
        taken = [p for ex in (w.sync, w.aio) if ex is not None for p in ex.take_waiting(queues)]
        if taken:
            w.to_hand_back.extend(p.key for p in taken if p.key not in w.to_hand_back)
            message = "gave back tasks claimed ahead: their queue's limits changed, or it was paused"
            event(logger, logging.INFO, message, count=len(taken), queues=",".join(sorted(queues)), worker=w.id)

    def _give_back_parked(self, now: float) -> None:
        """A slotted queue's slots here are all busy with tasks past the prefetch window,
        and tasks of it wait parked behind them: give those back (another worker may hold
        a free slot, and a more urgent task enqueued since goes before them)."""
        w = self.w
        window = w.options.prefetch_window
        if w.stopping:
            return
        for queue, waiting in list(w.local.parked.items()):
            if not waiting:
                continue
            if w.slots.count(queue) == 0:
                # No slot here (lost: another worker took it after its lease lapsed), and
                # whatever the window: held here, RUNNING on no slot, they would count against
                # the free slots and keep every worker, this one too, from the slots they
                # wait for.
                message = "gave back tasks parked without a slot"
            elif window is None:
                continue
            else:
                started = [
                    at
                    for key, h in w.held.items()
                    if h.prep is not None and h.claimed.queue == queue
                    if (at := (w.aio if h.prep.is_async else w.sync).started_at(key)) is not None  # type: ignore[union-attr]
                ]
                if len(started) < w.slots.count(queue) or any(now - at <= window for at in started):
                    continue
                message = "gave back tasks parked behind long ones"
            taken = w.local.take_queue(queue)
            if taken:
                w.to_hand_back.extend(p.key for p in taken if p.key not in w.to_hand_back)
                # Claim them again when a slot frees: a short claim may have marked this
                # worker waiting, and no enqueue tells it of tasks it gave back itself.
                w.prefetch_hold = w.gave_back = True
                event(logger, logging.INFO, message, count=len(taken), queue=queue, worker=w.id)

    def _give_back_hoarded(self, now: float, is_async: bool) -> None:
        """Every slot of a kind is busy with a task past the prefetch window, and prefetched
        tasks wait behind them: give those back, another worker may be idle."""
        w = self.w
        executor = w.aio if is_async else w.sync
        assert executor is not None
        window = w.options.prefetch_window
        if window is None or w.stopping or executor.waiting() == 0:
            return
        slots = w.settings.async_concurrency if is_async else w.settings.concurrency
        mine = [key for key, h in w.held.items() if h.prep and h.prep.is_async == is_async]
        started = [(key, at) for key in mine if (at := executor.started_at(key)) is not None]
        if len(started) < slots or any(now - at <= window for _key, at in started):
            return
        for key, at in started:
            w.prefetch.running_long(w.held[key].claimed.task_path, now - at)
        taken = executor.take_back()
        if taken:
            w.to_hand_back.extend(p.key for p in taken if p.key not in w.to_hand_back)
            w.prefetch_hold = w.gave_back = True  # as for parked tasks, above
            message = "gave back prefetched tasks waiting behind long ones"
            event(logger, logging.INFO, message, count=len(taken), worker=w.id)
