"""MariaDB: an idle worker's listener sleeps in SELECT SLEEP() and producers cut it short with
KILL QUERY once their enqueue has committed (ox.db.mysql.wake).

First against listeners of the tests' own (the real listen loop in a thread, under a worker
row written by hand, counting its wake-ups): who is woken, when, how often, at what cost in
statements; then real worker subprocesses whose poll (30 s) would show any wake-up that did
not come."""

import logging
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import ox
from ox.connection import open_worker_connection
from ox.db.mysql import wake
from ox.db.mysql.locks import listen_lock_name, lock_prefix
from ox.models import Status, Task, Worker
from tests import tasks
from tests.helpers import wait_until
from tests.test_notify_idle import options

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "mysql", reason="the KILL QUERY wake-up is MariaDB's"),
]


class Sleeper:
    """ox's listen loop on a session of its own, under a worker row of `queues`."""

    def __init__(self, queues: list[str], idle: bool = True, stopped: bool = False) -> None:
        self.lock_key = uuid.uuid4().int % 2_000_000_000 + 1
        now = timezone.now()
        self.row = Worker.objects.create(
            id=f"sleeper-{uuid.uuid4()}",
            host="test",
            pid=1,
            queues=queues,
            started_at=now,
            heartbeat_at=now,
            idle_since=now if idle else None,
            stopped_at=now if stopped else None,
            lock_key=self.lock_key,
        )
        self.wakes = 0
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.start()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)
        time.sleep(0.05)  # into its first SLEEP

    def _run(self) -> None:
        def woke() -> None:
            self.wakes += 1

        self.conn = open_worker_connection(connection.alias)  # a connection is its thread's
        try:
            wake.listen(self.conn, listen_lock_name(self.conn, self.lock_key), woke, self.stop, self.ready.set)
        except Exception:  # noqa: BLE001  (the session was ended by the test)
            pass
        finally:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001  (already ended)
                pass

    def count(self, settle: float = 0.3) -> int:
        time.sleep(settle)
        return self.wakes

    def close(self) -> None:
        """End the listener's session from outside (as a dropped connection would): its
        SLEEP fails at once, and its lock is free."""
        self.stop.set()
        with connection.cursor() as cursor:
            cursor.execute("SELECT IS_USED_LOCK(%s)", [listen_lock_name(connection, self.lock_key)])
            session = cursor.fetchone()[0]
            if session is not None:
                try:
                    cursor.execute("KILL CONNECTION %s", [session])
                except OperationalError:
                    pass  # it ended meanwhile (woken just as it was stopped)
        self.thread.join(5)


@pytest.fixture
def sleeper() -> Iterator:
    made: list[Sleeper] = []
    wake.forget()

    def make(queues: list[str], **kw: bool) -> Sleeper:
        made.append(Sleeper(queues, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()
    wake.forget()


def test_only_idle_running_workers_of_the_queue_are_woken(sleeper):
    busy = sleeper(["default"], idle=False)
    stopped = sleeper(["default"], stopped=True)
    other = sleeper(["other"])
    mine = sleeper(["other", "default"])
    tasks.echo.enqueue(1)
    assert mine.count() == 1
    assert (busy.wakes, stopped.wakes, other.wakes) == (0, 0, 0)


def test_a_wake_up_goes_out_after_commit_once_per_transaction_and_never_for_a_rollback(sleeper):
    s = sleeper(["default"])
    with transaction.atomic():
        for i in range(5):
            tasks.echo.enqueue(i)
        assert s.count() == 0  # nothing before the commit: the worker would find nothing
    assert s.count() == 1
    with transaction.atomic():
        tasks.echo.enqueue("gone")
        transaction.set_rollback(True)
    assert s.count() == 1
    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint that rolls back takes its wake-up with it
                tasks.echo.enqueue("gone too")
                raise RuntimeError
        except RuntimeError:
            pass
    assert s.count() == 1
    ox.enqueue_many(tasks.echo, [((i,), {}) for i in range(50)])
    assert s.count() == 2


def test_a_transaction_costs_one_look_whatever_it_enqueues(sleeper):
    sleeper(["default"])
    with CaptureQueriesContext(connection) as q:
        with transaction.atomic():
            for i in range(20):
                tasks.echo.enqueue(i)
            ox.enqueue_many(tasks.echo, [((i,), {}) for i in range(100)])
    looks = [x["sql"] for x in q.captured_queries if "IS_USED_LOCK" in x["sql"]]
    kills = [x["sql"] for x in q.captured_queries if x["sql"].startswith("KILL QUERY")]
    assert (len(looks), len(kills)) == (1, 1)


def test_a_look_is_reused_only_while_fresh(sleeper, monkeypatch):
    """Within SEEN_FRESH of a look, an enqueue costs its INSERT and one KILL (no look); past
    it, a look again, so a worker that marked itself since is found."""
    sleeper(["default"])
    monkeypatch.setattr(wake, "SEEN_FRESH", 30.0)
    tasks.echo.enqueue(0)
    with CaptureQueriesContext(connection) as q:
        tasks.echo.enqueue(1)
    sqls = [x["sql"] for x in q.captured_queries]
    assert not any("IS_USED_LOCK" in s for s in sqls), sqls
    assert sum(s.startswith("KILL QUERY") for s in sqls) == 1
    monkeypatch.setattr(wake, "SEEN_FRESH", 0.025)
    time.sleep(0.05)
    later = sleeper(["default"])
    tasks.echo.enqueue(2)
    assert later.count() == 1


def test_an_enqueue_in_autocommit_costs_its_insert_and_one_look(sleeper):
    """The figure of docs/databases.md: with no look of the last SEEN_FRESH to go by and no
    worker waiting, an enqueue is its INSERT and one look; with one waiting, one KILL more."""
    sleeper(["other"])
    with CaptureQueriesContext(connection) as q:
        tasks.echo.enqueue(1)
    sqls = [x["sql"] for x in q.captured_queries if "UTC_TIMESTAMP" not in x["sql"]]  # the clock (ox.clock)
    assert len(sqls) == 2 and sqls[0].startswith("INSERT") and "IS_USED_LOCK" in sqls[1], sqls
    wake.forget()
    sleeper(["default"])
    with CaptureQueriesContext(connection) as q:
        tasks.echo.enqueue(2)
    sqls = [x["sql"] for x in q.captured_queries if "UTC_TIMESTAMP" not in x["sql"]]
    assert len(sqls) == 3 and sqls[2].startswith("KILL QUERY"), sqls


def test_a_worker_row_whose_listener_is_gone_is_not_woken_and_costs_no_error(sleeper, caplog):
    s = sleeper(["default"])
    s.close()  # the session ends: its lock is free, IS_USED_LOCK says NULL
    with caplog.at_level(logging.INFO, logger="ox.worker"):
        result = tasks.echo.enqueue(1)
    assert Task.objects.get(pk=result.id).status == Status.READY
    assert "could not wake" not in caplog.text


def test_a_listener_that_reconnected_is_found_again(sleeper, monkeypatch):
    """The look is kept, with the listener's old session in it; the KILL to that session says
    no such thread: the look is dropped and taken again for that same enqueue, which wakes the
    new session."""
    monkeypatch.setattr(wake, "SEEN_FRESH", 30.0)
    s = sleeper(["default"])
    tasks.echo.enqueue(0)
    assert s.count() == 1
    s.close()
    again = Sleeper.__new__(Sleeper)  # same worker row, a new listener session
    again.lock_key, again.row, again.wakes = s.lock_key, s.row, 0
    again.ready, again.stop = threading.Event(), threading.Event()
    again.start()
    try:
        tasks.echo.enqueue(1)  # the stale session: 1094, a new look, the new session
        assert again.count() == 1
    finally:
        again.close()


def test_a_producer_that_may_not_kill_says_so_once_and_its_enqueues_stand(sleeper, caplog):
    user = f"oxp{uuid.uuid4().hex[:8]}"
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE USER '{user}'@'%%' IDENTIFIED BY 'pw'")
        cursor.execute(f"GRANT ALL ON `{name}`.* TO '{user}'@'%%'")
    settings = {**connection.settings_dict, "USER": user, "PASSWORD": "pw"}
    other = type(connections[connection.alias])(settings, alias="ox_refused")  # a producer's own database user
    try:
        s = sleeper(["default"])
        with caplog.at_level(logging.WARNING, logger="ox.worker"):
            for _ in range(3):
                wake.wake_later(other, lock_prefix(other), ["default"])
        assert caplog.text.count("may not KILL QUERY") == 1
        assert s.count() == 0
        mine = sleeper(["default"])  # another worker, which this user may KILL: still woken
        wake.wake_later(connection, lock_prefix(connection), ["default"])
        assert mine.count() == 1
    finally:
        other.close()
        with connection.cursor() as cursor:
            cursor.execute(f"DROP USER '{user}'@'%%'")


# ------------------------------------------------------------------ real workers
def idle_worker(start_worker, **opts):
    worker = start_worker(env=options(poll_interval=30, **opts))
    wait_until(
        lambda: Worker.objects.filter(pid=worker.pid, stopped_at__isnull=True, idle_since__isnull=False).exists(),
        timeout=30,
    )
    return worker


def ran_within(result, seconds: float, since: float) -> float:
    wait_until(lambda: Task.objects.get(pk=result.id).status == Status.SUCCESSFUL, timeout=seconds + 5)
    took = time.monotonic() - since
    assert took < seconds, f"ran {took:.2f} s after the enqueue (the poll is 30 s)"
    return took


def test_an_idle_worker_runs_a_task_at_once_not_at_its_poll(start_worker):
    worker = idle_worker(start_worker)
    for i in range(5):
        started = time.monotonic()
        ran_within(tasks.echo.enqueue(i), 3, started)
        time.sleep(0.2 if i % 2 else 1.2)  # within and past SEEN_KEPT
    with transaction.atomic():
        result = tasks.echo.enqueue("in atomic")
        time.sleep(0.3)
    ran_within(result, 3, time.monotonic())
    worker.signal(15)
    assert worker.wait(30) == 0


def test_a_worker_whose_listener_session_was_killed_still_wakes_at_once(start_worker):
    """The listener's session is ended (KILL CONNECTION) while the worker waits; an enqueue
    right after, while the listener reconnects, wakes no one, but the listener wakes the worker
    once it is back."""
    worker = idle_worker(start_worker)
    row = Worker.objects.get(pid=worker.pid, stopped_at__isnull=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT IS_USED_LOCK(%s)", [listen_lock_name(connection, row.lock_key)])
        session = cursor.fetchone()[0]
        assert session is not None
        cursor.execute("KILL CONNECTION %s", [session])
    started = time.monotonic()
    ran_within(tasks.echo.enqueue("in the gap"), 3, started)
    wait_until(lambda: _listener_session(row.lock_key) not in (None, session), timeout=10)
    started = time.monotonic()
    ran_within(tasks.echo.enqueue("after"), 3, started)
    worker.signal(15)
    assert worker.wait(30) == 0


def _listener_session(lock_key: int) -> int | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT IS_USED_LOCK(%s)", [listen_lock_name(connection, lock_key)])
        return cursor.fetchone()[0]


def test_notify_off_means_no_listener_and_no_mark(start_worker):
    worker = start_worker(env=options(notify=False, poll_interval=0.3))
    wait_until(lambda: Worker.objects.filter(pid=worker.pid, stopped_at__isnull=True).exists(), timeout=30)
    result = tasks.echo.enqueue(1)
    wait_until(lambda: Task.objects.get(pk=result.id).status == Status.SUCCESSFUL, timeout=10)
    time.sleep(1)
    row = Worker.objects.get(pid=worker.pid, stopped_at__isnull=True)
    assert row.idle_since is None and _listener_session(row.lock_key) is None
    worker.signal(15)
    assert worker.wait(30) == 0
