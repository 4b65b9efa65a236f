"""When the worker loop ends, and how it ends (ox.worker.Worker.run): before every round
`done` asks whether to stop, and `finish` ends in order, whatever ended the loop (a stop
request, a stuck task, --max-tasks, --batch with nothing due, an exception)."""

import logging
import time
from typing import TYPE_CHECKING

from django.db import DatabaseError

from ox import clock, sql
from ox.logs import event, task_fields

if TYPE_CHECKING:
    from ox.worker import Worker

# Logged as the worker's: the same logger as the loop's own lines.
logger = logging.getLogger("ox.worker")

EXIT_OK = 0
EXIT_LEFT_BEHIND = 1
EXIT_STUCK = 3


def done(w: "Worker") -> bool:
    """Whether the loop ends before its next round: a stop request once nothing is in flight
    (or its grace is over), a stuck worker once its tasks are interrupted, --max-tasks reached,
    or --batch with nothing due."""
    busy = bool(w.held or w.completer or w.to_hand_back)
    if w.stopping:
        return not busy or time.monotonic() >= (w.stop_deadline or 0)
    if w.stuck:
        return not w.completer and all(h.interrupted_at for h in w.held.values())
    if w.settings.max_tasks is not None and w.claimed_total >= w.settings.max_tasks and not busy:
        return True
    if w.settings.batch and not busy and not w.more_waiting:
        # ...and the last claim came after the retries this worker scheduled were due,
        # and nothing is due (tasks given back, say, are claimed first).
        if w.last_claim_at < w.completer.retry_due:
            return False
        if due_waiting(w):
            w.more_waiting = True
            return False
        # Due tasks a limit holds back (another worker runs the queue's slots): wait for
        # them at the poll, without claiming in a loop.
        return not due_waiting(w, held_back=True)
    return False


def due_waiting(w: "Worker", held_back: bool = False) -> bool:
    """Whether due tasks wait in the queues no limit holds back (held_back: in those a
    limit holds back)."""
    blocked = w.flow.blocked
    queues = [q for q in w.settings.queues if (q in blocked) == held_back]
    if not queues:
        return False
    try:
        earliest = sql.earliest_ready(w.conn, queues, gate=True)
    except DatabaseError:
        return True  # cannot tell: carry on (the loop reconnects)
    return earliest is not None and earliest <= clock.db_now(w.conn)


def finish(w: "Worker") -> int:
    """The orderly end: outcomes written, tasks handed back, slots given back, the worker's row
    marked stopped, its parts stopped; the exit code says what it left."""
    try:
        w._guard(w._hand_back)
        w._guard(lambda: w.completer.flush(w.conn))
        w.slots.give_back_all(w.conn)
        sql.worker_stopped(w.conn, w.id, clock.db_now(w.conn))
    except (DatabaseError, AttributeError) as exc:
        event(logger, logging.ERROR, f"worker could not record its stop: {exc}", worker=w.id)
    left = [h.claimed for h in w.held.values()]
    for part in (w.sync, w.aio, w.listener, *(duty for duty, _next in w.duties)):
        if part is not None:
            part.stop()
    w.completer.signals.stop(timeout=5.0)
    for claimed in left:
        message = "worker left a task running; the rescuer will take it back"
        event(logger, logging.WARNING, message, **task_fields(claimed), worker=w.id)
    if w.conn is not None:
        w.conn.close()
    code = EXIT_STUCK if w.stuck else EXIT_LEFT_BEHIND if left else EXIT_OK
    event(
        logger,
        logging.INFO,
        "worker stopped",
        claimed=w.claimed_total,
        claims=w.claim_rounds,
        exit_code=code,
        worker=w.id,
    )
    return code
