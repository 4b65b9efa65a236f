"""A wake-up by an enqueue lets the claim go first; a queue's state change is read before it.

An idle worker woken by a NOTIFY used to read ox_queue (its queues' pause and run-time limits)
before every such claim once a second had passed since the last read: a round trip on the
path from enqueue to start. The payload now tells the two apart on PostgreSQL (a queue name:
an enqueue; STATE_MARK and a name: ox.flow.queues changed that queue's state), and after an
enqueue's wake-up the due read waits for the next claim. The claim's own statement skips
paused queues and those limited at run time, so a pause still holds at once (the pause and
limits tests of test_flow_limits and test_attack_flow2 run real workers through it)."""

import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ox.connection import open_worker_connection
from ox.db import driver
from ox.db.dialect import STATE_MARK
from ox.flow import queues
from ox.flow.limits import QueueLimits
from ox.flow.watch import FlowWatch

PG = connection.vendor == "postgresql"


def _reads(conn, watch: FlowWatch, **kw) -> int:
    with CaptureQueriesContext(conn) as seen:
        watch.refresh(conn, **kw)
    return sum(1 for q in seen.captured_queries if "ox_queue" in q["sql"])


@pytest.mark.django_db(transaction=True)
def test_an_enqueues_wake_up_lets_one_claim_go_before_a_due_read():
    watch = FlowWatch({"default": QueueLimits()}, ["default", "other"])
    assert _reads(connection, watch, claiming=True) == 1  # the first read is due
    watch.next_refresh = 0.0  # a second has passed: due again
    watch.woken(False)  # an enqueue
    assert _reads(connection, watch, claiming=True) == 0  # the claim goes first
    assert _reads(connection, watch, claiming=True) == 1  # the next claim reads, as due
    # A state change's wake-up (or a plain one: may be either) reads before the claim,
    # even after an enqueue's that came first.
    watch.next_refresh = time.monotonic() + 60
    watch.woken(False)
    watch.woken(True)
    assert _reads(connection, watch, claiming=True) == 1
    # Between claims (upkeep) the read is never put off.
    watch.woken(False)
    watch.next_refresh = 0.0
    assert _reads(connection, watch) == 1


@pytest.mark.skipif(not PG, reason="PostgreSQL's payloads (MariaDB's wake-ups carry none)")
@pytest.mark.django_db(transaction=True)
def test_the_listener_tells_an_enqueue_from_a_state_change():
    """A real LISTEN session: each payload sent with pg_notify reaches `wake` as an enqueue,
    as a state change, or not at all (another queue's)."""
    got: list[bool] = []
    ready = threading.Event()
    stopped = threading.Event()
    served = frozenset({"default", f"{STATE_MARK}odd"})

    def wake(enqueued: bool = False) -> None:
        got.append(enqueued)

    def listen() -> None:
        conn = open_worker_connection(connection.alias)
        try:
            driver(conn).listen(conn, 0, served, wake, stopped, ready.set)
        finally:
            conn.close()

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert ready.wait(10)
    got.clear()
    cases = [
        ("default", [True]),  # an enqueue of a served queue
        (f"{STATE_MARK}default", [False]),  # its state changed
        ("", [False]),  # a bare NOTIFY ox_task: may be either
        ("other", []),  # another queue's enqueue
        (f"{STATE_MARK}other", []),  # another queue's state
        (f"{STATE_MARK}odd", [True]),  # the enqueue of a served queue whose name starts with the mark
    ]
    try:
        for payload, expected in cases:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify('ox_task', %s)", [payload])
                cursor.execute("SELECT pg_notify('ox_task', 'default')")  # a marker after each case
            deadline = time.monotonic() + 10
            while len(got) < len(expected) + 1:
                assert time.monotonic() < deadline, (payload, got)
                time.sleep(0.01)
            assert got == [*expected, True], payload
            got.clear()
    finally:
        stopped.set()
        thread.join(15)


@pytest.mark.skipif(not PG, reason="PostgreSQL's payloads")
@pytest.mark.django_db(transaction=True)
def test_pause_resume_and_limits_notify_as_state_changes_and_an_enqueue_as_a_queue_name():
    from ox import clock
    from ox.models import Worker
    from tests import tasks

    with connection.cursor() as cursor:
        cursor.execute("LISTEN ox_task")
    raw = connection.connection

    def payloads() -> list[str]:
        return [n.payload for n in raw.notifies(timeout=0.5, stop_after=10)]

    try:
        queues.pause("default")
        assert payloads() == [f"{STATE_MARK}default"]
        queues.set_limits("default", {"concurrency": 2})
        assert payloads() == [f"{STATE_MARK}default"]
        queues.resume("default")
        assert payloads() == [f"{STATE_MARK}default"]
        # The enqueue trigger notifies only while a worker is marked idle (migration 0012).
        now = clock.db_now(connection)
        Worker.objects.create(
            id="idle-cf", host="h", pid=1, queues=["default"], started_at=now, heartbeat_at=now, idle_since=now
        )
        tasks.noop.enqueue()
        assert payloads() == ["default"]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("UNLISTEN ox_task")
