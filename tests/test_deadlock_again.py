"""A deadlock victim's write runs again (ox.sql.again_on_deadlock). InnoDB picks a victim
among transactions that wait on each other and rolls all of it back; a worker's completion
(with its workflow join) was raised out of the worker's round instead (a CI run saw it once,
with four connections ending members of the same groups). Here the deadlock is made on
purpose: another session holds a follower the completion must count down, and then asks for
the completed task's own row. The other session has written more, so InnoDB rolls back the
completion's transaction, which must then run again and win once the other session ends."""

import json
import threading
import time
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, transaction
from django.db.transaction import TransactionManagementError

import ox
from ox import clock, sql
from ox.connection import open_worker_connection
from ox.models import Edge, Status, Task
from tests.testapp.models import Ledger

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "mysql", reason="InnoDB's deadlock victims (MariaDB)"),
]


def _deadlocks(conn) -> int:
    with conn.cursor() as cursor:
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
        return int(cursor.fetchone()[1])


def _lock_waits(conn, session: int) -> bool:
    """Whether that session waits in the join's lock of the followers. (Its wait can be on a
    one-row IN, which MariaDB reads while it plans the statement: information_schema's
    innodb_trx need not list it as a LOCK WAIT then, the process list shows the statement.)"""
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM information_schema.processlist WHERE id = %s AND time_ms > 200"
            " AND info LIKE 'SELECT id, status, waiting, queue FROM ox_task%%'",
            [session],
        )
        return cursor.fetchone()[0] > 0


def _session_id(conn) -> int:
    with conn.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        return int(cursor.fetchone()[0])


def _claimed_parent(worker):
    """A two-step chain; its first step claimed on the worker's connection."""
    from tests import workflow_tasks as wt

    ox.chain(wt.add.s(1, 2), wt.total.s()).enqueue()
    now = clock.db_now(worker)
    (first,) = sql.claim(worker, "w1", ["default"], (1, 0), now, now + timedelta(seconds=120))
    child = Edge.objects.get(parent_id=first.id).child_id
    return first, child


def _blocker_holding(child, first, rows: int):
    """Another session: writes `rows` rows (so it weighs more than the completion), locks the
    follower, and returns a function that then asks for the completed task's row."""
    other = open_worker_connection(connection.alias)
    other.inc_thread_sharing()  # the tests' other thread uses it too
    other.set_autocommit(False)
    with other.cursor() as cursor:
        for i in range(rows):
            cursor.execute("INSERT INTO testapp_ledger (`key`, pid, attempt) VALUES (%s, 0, 0)", [f"heavy{i}"])
        cursor.execute("SELECT id FROM ox_task WHERE id = %s FOR UPDATE", [child])
    return other


def test_a_completion_picked_as_deadlock_victim_runs_again_and_counts_its_follower_down_once():
    worker = open_worker_connection(connection.alias)
    worker.inc_thread_sharing()
    first, child = _claimed_parent(worker)
    other = _blocker_holding(child, first, 200)
    before = _deadlocks(other)
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

    session = _session_id(worker)
    thread = threading.Thread(target=complete, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not _lock_waits(other, session):  # the completion waits on the follower's lock
            assert time.monotonic() < deadline, "the completion never waited on the follower"
            time.sleep(0.01)
        with other.cursor() as cursor:
            # The cycle: this session now wants the row the completion holds.
            cursor.execute("SELECT id FROM ox_task WHERE id = %s FOR UPDATE", [first.id])
        assert _deadlocks(other) > before, "InnoDB saw no deadlock: the test made none"
    finally:
        other.rollback()
        other.close()
    thread.join(30)
    assert not thread.is_alive()
    worker.close()
    assert "error" not in out, out.get("error")
    assert out["written"] == {(first.id, first.fence)}
    # The follower was counted down once, by the run that committed (the claim of that
    # statement came before the join there: nothing else was READY).
    assert out["claimed"] == []
    assert Task.objects.get(pk=first.id).status == Status.SUCCESSFUL
    follower = Task.objects.get(pk=child)
    assert (follower.status, follower.waiting) == (Status.READY, 0)
    assert json.loads(Edge.objects.get(parent_id=first.id).result) == 3
    assert not Ledger.objects.exists()  # the other session's rows went with its rollback


def test_inside_the_callers_atomic_the_victim_is_raised():
    """The caller's transaction was rolled back with it: not ox's to run again."""
    first, child = _claimed_parent(connection)
    other = _blocker_holding(child, first, 200)
    errors: list[BaseException] = []
    session = _session_id(connection)

    def ask_for_first() -> None:
        deadline = time.monotonic() + 10
        while not _lock_waits(other, session):
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        with other.cursor() as cursor:
            cursor.execute("SELECT id FROM ox_task WHERE id = %s FOR UPDATE", [first.id])

    thread = threading.Thread(target=ask_for_first, daemon=True)
    thread.start()
    refused_after = False
    try:
        with transaction.atomic():
            now = clock.db_now(connection)
            done = [sql.Completion(first.id, first.fence, json.dumps(3), now, now, True)]
            try:
                sql.complete(connection, done)
            except OperationalError as exc:
                errors.append(exc)
            # The caller caught it and goes on inside its atomic(): its transaction is gone
            # (InnoDB rolled all of it back), so Django must refuse to write on in it.
            try:
                Ledger.objects.create(key="after", pid=0)
            except TransactionManagementError:
                refused_after = True
    finally:
        thread.join(30)
        other.rollback()
        other.close()
    assert len(errors) == 1 and errors[0].args[0] == 1213, errors
    assert refused_after
    assert not Ledger.objects.exists()
    assert Task.objects.get(pk=first.id).status == Status.RUNNING
    assert Task.objects.get(pk=child).waiting == 1
