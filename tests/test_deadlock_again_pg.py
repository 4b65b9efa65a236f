"""A PostgreSQL deadlock victim's write runs again (ox.sql.again_on_deadlock, 40P01), as an
InnoDB victim's does (tests/test_deadlock_again.py). ox takes its own rows in one order; another
session need not. Here another session holds the follower a completion must count down, then
asks for the completed task's own row: PostgreSQL's deadlock check, run deadlock_timeout into the
completion's wait, finds the cycle and rolls the completion's statement back. It must run again
and win once the other session ends, counting the follower down once; before, the worker's
round raised and it went through its outage path (reconnect, back off) to write it again."""

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, transaction

import ox
from ox import clock, sql
from ox.connection import open_worker_connection
from ox.db import driver
from ox.models import Edge, Status, Task

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's deadlock check (40P01)"),
]

# The completion's session runs its deadlock check this long into a wait: long enough for the
# test to close the cycle first (the check runs once per wait), short enough to be quick. The
# other session's is far longer, so the completion is the one PostgreSQL picks.
VICTIM_CHECK = "1500ms"


def _backend_pid(conn) -> int:
    with conn.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _waits_on_a_lock(conn, pid: int) -> bool:
    with conn.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [pid])
        return cursor.fetchone()[0] > 0


def _claimed_parent(worker):
    """A two-step chain; its first step claimed on the worker's connection."""
    from tests import workflow_tasks as wt

    ox.chain(wt.add.s(1, 2), wt.total.s()).enqueue()
    now = clock.db_now(worker)
    (first,) = sql.claim(worker, "w1", ["default"], (1, 0), now, now + timedelta(seconds=120))
    child = Edge.objects.get(parent_id=first.id).child_id
    return first, child


def _other_holding(child):
    other = open_worker_connection(connection.alias)
    other.inc_thread_sharing()
    other.set_autocommit(False)
    with other.cursor() as cursor:
        cursor.execute("SET LOCAL deadlock_timeout = '60s'")
        cursor.execute("SET LOCAL lock_timeout = '20s'")  # bounded, whatever happens
        cursor.execute("SELECT id FROM ox_task WHERE id = %s FOR UPDATE", [child])
    return other


def _close_cycle(other, waiter, pid: int, first) -> None:
    """Once `pid` waits on the follower, the other session asks for the completed task's row."""
    deadline = time.monotonic() + 10
    while not _waits_on_a_lock(waiter, pid):
        assert time.monotonic() < deadline, "the completion never waited on the follower"
        time.sleep(0.01)
    with other.cursor() as cursor:
        cursor.execute("SELECT id FROM ox_task WHERE id = %s FOR UPDATE", [first.id])


def test_a_completion_picked_as_deadlock_victim_runs_again_and_counts_its_follower_down_once():
    worker = open_worker_connection(connection.alias)
    worker.inc_thread_sharing()
    with worker.cursor() as cursor:
        cursor.execute(f"SET deadlock_timeout = '{VICTIM_CHECK}'")
    first, child = _claimed_parent(worker)
    other = _other_holding(child)
    watcher = open_worker_connection(connection.alias)
    pid = _backend_pid(worker)
    out: dict = {}

    def complete() -> None:
        now = clock.db_now(worker)
        done = [sql.Completion(first.id, first.fence, json.dumps(3), now, now, True)]
        try:
            out["written"], out["claimed"] = sql.complete_and_claim(
                worker, done, "w1", ["default"], (4, 0), now, now + timedelta(seconds=120)
            )
        except BaseException as exc:  # noqa: BLE001
            out["error"] = exc

    thread = threading.Thread(target=complete, daemon=True)
    thread.start()
    try:
        _close_cycle(other, watcher, pid, first)
        # The other session got the row: the completion was the victim and let it go. Its run
        # again now waits for this session.
        assert thread.is_alive()
    finally:
        other.rollback()
        other.close()
        watcher.close()
    thread.join(30)
    assert not thread.is_alive()
    worker.close()
    assert "error" not in out, out.get("error")
    assert out["written"] == {(first.id, first.fence)}
    assert out["claimed"] == []  # the follower became READY after the claim's snapshot
    assert Task.objects.get(pk=first.id).status == Status.SUCCESSFUL
    follower = Task.objects.get(pk=child)
    assert (follower.status, follower.waiting) == (Status.READY, 0)
    assert json.loads(Edge.objects.get(parent_id=first.id).result) == 3


def test_inside_the_callers_atomic_the_victim_is_raised():
    """The caller's transaction was rolled back with it: not ox's to run again."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET deadlock_timeout = '{VICTIM_CHECK}'")
    first, child = _claimed_parent(connection)
    other = _other_holding(child)
    watcher = open_worker_connection(connection.alias)
    watcher.inc_thread_sharing()  # the closing thread's
    pid = _backend_pid(connection)
    closed: list[BaseException | None] = []

    def close_cycle() -> None:
        try:
            _close_cycle(other, watcher, pid, first)
            closed.append(None)
        except BaseException as exc:  # noqa: BLE001  (seen by the test below)
            closed.append(exc)

    closer = threading.Thread(target=close_cycle, daemon=True)
    closer.start()
    try:
        with pytest.raises(OperationalError) as raised, transaction.atomic():
            now = clock.db_now(connection)
            sql.complete(connection, [sql.Completion(first.id, first.fence, json.dumps(3), now, now, True)])
        assert driver(connection).deadlocked(raised.value)
        closer.join(30)
        assert closed == [None]
    finally:
        other.rollback()
        other.close()
        watcher.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET deadlock_timeout")
    assert Task.objects.get(pk=first.id).status == Status.RUNNING  # nothing of it was written
    assert Task.objects.get(pk=child).waiting == 1


def test_other_errors_are_not_taken_for_a_deadlock():
    from django.db import DatabaseError, IntegrityError

    d = driver(connection)
    assert not d.deadlocked(IntegrityError("duplicate key"))
    assert not d.deadlocked(DatabaseError("40P01 in the text is not its code"))
