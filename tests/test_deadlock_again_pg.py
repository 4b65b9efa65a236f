"""A PostgreSQL deadlock victim's write runs again (ox.sql.again_on_deadlock, 40P01), as an
InnoDB victim's does (tests/test_deadlock_again.py). ox takes its own rows in one order; another
session need not (a bulk UPDATE, ox.operations.cancel's among them). Here another session holds a
row ox's write needs next, then asks for one the write already holds: PostgreSQL's deadlock
check, run deadlock_timeout into the write's wait, finds the cycle and rolls the write back. It
must run again and win once the other session ends, writing everything once; before, the
worker's round raised and went through its outage path (reconnect, back off) to write it again.
Not run again: inside the caller's atomic(), with autocommit turned off by the caller, after
the victim's session was lost (a new one would lack the worker's liveness lock), and past
DEADLOCK_BUDGET seconds."""

import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, IntegrityError, OperationalError, connection, transaction

import ox
from ox import clock, sql
from ox.connection import open_worker_connection
from ox.db import driver
from ox.flow.gate import claim_limited
from ox.flow.limits import QueueLimits
from ox.models import Edge, Status, Task
from tests import workflow_tasks as wt

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's deadlock check (40P01)"),
]

# The victim's session runs its deadlock check this long into a wait: long enough for the test
# to close the cycle first (the check runs once per wait), short enough to be quick. The other
# session's is far longer, so the write under test is the one PostgreSQL picks.
VICTIM_CHECK = "1500ms"
TASK_ROW = "SELECT id FROM ox_task WHERE id = %s FOR UPDATE"
QUEUE_ROW = "SELECT name FROM ox_queue WHERE name = %s FOR UPDATE"


def _backend_pid(conn) -> int:
    with conn.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def _waits_on_a_lock(conn, pid: int) -> bool:
    with conn.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [pid])
        return cursor.fetchone()[0] > 0


def _victim(conn=None):
    """A worker connection whose deadlock check comes first, shared with _deadlock's thread
    (or `conn`, which stays this thread's own: a shared one keeps no enqueue cursor, and the
    tests after these use this thread's connection)."""
    if conn is None:
        conn = open_worker_connection(connection.alias)
        conn.inc_thread_sharing()
    with conn.cursor() as cursor:
        cursor.execute(f"SET deadlock_timeout = '{VICTIM_CHECK}'")
    return conn


def _claimed_parent(worker):
    """A two-step chain; its first step claimed on the worker's connection."""
    ox.chain(wt.add.s(1, 2), wt.total.s()).enqueue()
    now = clock.db_now(worker)
    (first,) = sql.claim(worker, "w1", ["default"], (1, 0), now, now + timedelta(seconds=120))
    child = Edge.objects.get(parent_id=first.id).child_id
    return first, child


def _deadlock(victim, write: Callable[[], Any], hold: tuple[str, object], ask: tuple[str, object]) -> dict:
    """Another session takes the `hold` row; `write` runs on `victim` in a thread and waits on
    it; then the other session asks for the `ask` row, which `write` holds: a cycle, found by
    the victim's check. The other session ends (rolled back) once its ask returned or failed.
    Returns {"result": ...} or {"error": ...} from `write`."""
    other = open_worker_connection(connection.alias)
    other.inc_thread_sharing()
    other.set_autocommit(False)
    watcher = open_worker_connection(connection.alias)
    watcher.inc_thread_sharing()
    pid = _backend_pid(victim)
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = write()
        except BaseException as exc:  # noqa: BLE001  (the test reads it)
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    try:
        with other.cursor() as cursor:
            cursor.execute("SET LOCAL deadlock_timeout = '60s'")
            cursor.execute("SET LOCAL lock_timeout = '20s'")  # bounded, whatever happens
            cursor.execute(hold[0], [hold[1]])
        thread.start()
        deadline = time.monotonic() + 10
        while not _waits_on_a_lock(watcher, pid):
            assert time.monotonic() < deadline, "the write never waited on the held row"
            time.sleep(0.01)
        with other.cursor() as cursor:
            cursor.execute(ask[0], [ask[1]])
        out["other_got_its_row"] = True  # the write let it go: it was the victim
    finally:
        other.rollback()
        other.close()
        watcher.close()
    thread.join(30)
    assert not thread.is_alive()
    return out


def _end_with_claim(worker, first) -> Callable[[], Any]:
    """The worker's usual write: the first step's success, its join and the next claim in one
    statement (sql.complete_and_claim)."""

    def write():
        now = clock.db_now(worker)
        done = [sql.Completion(first.id, first.fence, json.dumps(3), now, now, True)]
        return sql.complete_and_claim(worker, done, "w1", ["default"], (4, 0), now, now + timedelta(seconds=120))

    return write


def test_a_completion_picked_as_deadlock_victim_runs_again_and_counts_its_follower_down_once():
    worker = _victim()
    first, child = _claimed_parent(worker)

    out = _deadlock(worker, _end_with_claim(worker, first), (TASK_ROW, child), (TASK_ROW, first.id))
    worker.close()
    assert "error" not in out, out.get("error")
    assert out["other_got_its_row"]
    written, claimed = out["result"]
    assert written == {(first.id, first.fence)}
    assert claimed == []  # the follower became READY after the claim's snapshot
    assert Task.objects.get(pk=first.id).status == Status.SUCCESSFUL
    follower = Task.objects.get(pk=child)
    assert (follower.status, follower.waiting) == (Status.READY, 0)
    assert json.loads(Edge.objects.get(parent_id=first.id).result) == 3


def test_the_gates_claim_picked_as_deadlock_victim_runs_again():
    # The gate's claim in round trips (PostgreSQL with Django's client-side binding cursor):
    # it holds its finished task's row, then waits on the queue's row, which the other session
    # holds (as ox.operations.cancel's bulk UPDATE might hold a candidate).
    worker = _victim()
    assert driver(worker).gate_in_round_trips(worker) is not None
    wt.shout.enqueue("a")
    wt.shout.enqueue("b")
    now = clock.db_now(worker)
    (first,) = sql.claim(worker, "w1", ["default"], (1, 0), now, now + timedelta(seconds=120))
    with worker.cursor() as cursor:  # the queue's row, for the other session to hold
        cursor.execute(
            "INSERT INTO ox_queue (name, paused, overrides, limited, updated_by)"
            " VALUES ('default', false, '{}', false, '') ON CONFLICT DO NOTHING"
        )

    def write():
        now = clock.db_now(worker)
        done = [sql.Completion(first.id, first.fence, json.dumps("A!"), now, now, False)]
        limits = {"default": QueueLimits(concurrency=5)}
        return claim_limited(worker, "w1", limits, (1, 0), now, now + timedelta(seconds=120), done)

    out = _deadlock(worker, write, (QUEUE_ROW, "default"), (TASK_ROW, first.id))
    worker.close()
    assert "error" not in out, out.get("error")
    written, gated = out["result"]
    assert written == {(first.id, first.fence)}
    assert len(gated.claimed) == 1 and gated.claimed[0].id != first.id
    assert Task.objects.get(pk=first.id).status == Status.SUCCESSFUL
    assert Task.objects.filter(status=Status.RUNNING).count() == 1


def test_a_victim_whose_session_was_lost_is_not_run_again_on_a_new_one():
    # ox's own transaction (a workflow task's completion with its join) is the victim, and its
    # session is gone before ox's ROLLBACK: the wrapper is closed. A run again would open a new
    # session on it without the worker's liveness lock (rescuers would then take its running
    # tasks); the error goes to the worker's reconnect path instead, which takes the lock again.
    worker = _victim()
    first, child = _claimed_parent(worker)
    old_pid = _backend_pid(worker)
    killer = open_worker_connection(connection.alias)
    killer.inc_thread_sharing()
    killed: list[int] = []

    def lose_session_before_rollback(execute, text, params, many, context):
        if text == "ROLLBACK" and not killed:
            with killer.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [old_pid])
            killed.append(old_pid)
            time.sleep(0.3)
        return execute(text, params, many, context)

    def write():
        now = clock.db_now(worker)
        done = [sql.Completion(first.id, first.fence, json.dumps(3), now, now, True)]
        with worker.execute_wrapper(lose_session_before_rollback):
            return sql.complete(worker, done)  # ox's own transaction: the completion and its join

    out = _deadlock(worker, write, (TASK_ROW, child), (TASK_ROW, first.id))
    killer.close()
    assert killed == [old_pid]
    assert isinstance(out.get("error"), OperationalError), out
    assert driver(worker).deadlocked(out["error"])
    assert worker.connection is None  # closed, not opened again behind the worker's back
    worker.close()
    assert Task.objects.get(pk=first.id).status == Status.RUNNING  # nothing written: the worker's to redo
    assert Task.objects.get(pk=child).waiting == 1


def test_past_the_budget_the_victim_is_raised(monkeypatch):
    # PostgreSQL finds a deadlock only deadlock_timeout into a wait; the worker's loop waits for
    # the runs again, so they stop after DEADLOCK_BUDGET seconds (here none).
    monkeypatch.setattr(sql, "DEADLOCK_BUDGET", 0.0)
    worker = _victim()
    first, child = _claimed_parent(worker)

    out = _deadlock(worker, _end_with_claim(worker, first), (TASK_ROW, child), (TASK_ROW, first.id))
    worker.close()
    assert driver(connection).deadlocked(out.get("error")), out
    assert Task.objects.get(pk=first.id).status == Status.RUNNING


def test_with_autocommit_turned_off_by_the_caller_the_victim_is_raised():
    # The caller's own transaction is open (no atomic()): the victim's work was part of it.
    worker = _victim()
    first, child = _claimed_parent(worker)
    worker.set_autocommit(False)

    def write():
        now = clock.db_now(worker)
        done = [sql.Completion(first.id, first.fence, json.dumps(3), now, now, True)]
        return sql.complete(worker, done)

    out = _deadlock(worker, write, (TASK_ROW, child), (TASK_ROW, first.id))
    worker.rollback()
    worker.set_autocommit(True)
    worker.close()
    assert driver(connection).deadlocked(out.get("error")), out
    assert Task.objects.get(pk=first.id).status == Status.RUNNING


def test_inside_the_callers_atomic_the_victim_is_raised():
    """The caller's transaction: its error, not ox's to run again. (The write runs in this
    thread, on its own connection; the cycle is closed from another.)"""
    _victim(connection)
    first, child = _claimed_parent(connection)
    pid = _backend_pid(connection)
    done: list[dict] = []
    other = open_worker_connection(connection.alias)
    other.inc_thread_sharing()
    other.set_autocommit(False)
    watcher = open_worker_connection(connection.alias)
    watcher.inc_thread_sharing()
    with other.cursor() as cursor:
        cursor.execute("SET LOCAL deadlock_timeout = '60s'")
        cursor.execute("SET LOCAL lock_timeout = '20s'")
        cursor.execute(TASK_ROW, [child])

    def close_cycle() -> None:
        try:
            deadline = time.monotonic() + 10
            while not _waits_on_a_lock(watcher, pid):
                assert time.monotonic() < deadline, "the write never waited on the held row"
                time.sleep(0.01)
            with other.cursor() as cursor:
                cursor.execute(TASK_ROW, [first.id])
            done.append({})
        except BaseException as exc:  # noqa: BLE001  (the test reads it)
            done.append({"error": exc})

    closer = threading.Thread(target=close_cycle, daemon=True)
    closer.start()
    try:
        with pytest.raises(OperationalError) as raised, transaction.atomic():
            now = clock.db_now(connection)
            sql.complete(connection, [sql.Completion(first.id, first.fence, json.dumps(3), now, now, True)])
        closer.join(30)
        assert done == [{}]
    finally:
        other.rollback()
        other.close()
        watcher.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET deadlock_timeout")
    assert driver(connection).deadlocked(raised.value)
    assert Task.objects.get(pk=first.id).status == Status.RUNNING  # nothing of it was written
    assert Task.objects.get(pk=child).waiting == 1


def test_other_errors_are_not_taken_for_a_deadlock():
    d = driver(connection)
    assert not d.deadlocked(IntegrityError("duplicate key"))
    assert not d.deadlocked(DatabaseError("40P01 in the text is not its code"))
