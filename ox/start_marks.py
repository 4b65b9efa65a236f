"""The start mark of a task tried before, written before its body starts.

A worker records when a body started with its next heartbeat, up to START_MARK_DELAY later
(ox.worker): one write for many starts. A worker killed in that time leaves its attempt without
a mark, as does one killed while the task still waited in its inbox, prefetched behind others.
On a task's first attempt the rescue cannot tell the two apart, and counts the loss toward
MAX_LOST: the task may be what kills its workers. From the second attempt on (a retry, or a
claim after a loss) the task's own thread writes the mark before the body starts, so a lost
attempt without one did not start (but for the database error below), and the rescue does not
count it (ox.sql.rescue_and_mark).
A task that kills its worker at once is still FAILED after MAX_LOST deaths; one that only
waited in the inboxes of workers that died no longer is.

One round trip before the body, on the task's own connection, for attempts after the first
only. If the claim is no longer this worker's (fenced out), the body does not start. If the
mark cannot be written (a database error), the body runs as it did before marks were written
first, its mark coming with the heartbeat: skipping it would leave a task whose mark can never
be written going round for ever (claimed, skipped, rescued uncounted), never run.
"""

import logging

from django.db import DatabaseError, connections

from ox import clock, sql
from ox.execution import Prepared
from ox.metadata import in_pool_thread, with_fresh_connection

logger = logging.getLogger("ox.worker")


def needed(prep: Prepared) -> bool:
    """Whether this attempt writes its start mark before its body (not its task's first)."""
    return prep.claimed.attempts > 1


def write(prep: Prepared) -> bool:
    """Write the mark now (in the task's thread): False if the claim is no longer ours."""
    try:
        return with_fresh_connection(prep.using, _write, prep)
    except DatabaseError as exc:
        logger.warning("could not write the start mark of task %s before its body: %r", prep.claimed.id, exc)
        return True


async def awrite(prep: Prepared) -> bool:
    """write() for an async task, from the event loop."""
    try:
        return await in_pool_thread(prep.using, _write, prep)
    except DatabaseError as exc:
        logger.warning("could not write the start mark of task %s before its body: %r", prep.claimed.id, exc)
        return True


def _write(prep: Prepared) -> bool:
    return sql.mark_started(connections[prep.using], prep.claimed, clock.estimated_now())
