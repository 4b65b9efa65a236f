"""The mechanisms the benchmarks rely on, checked for behaviour (speed is measured in bench/)."""

import signal
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from ox import clock, sql
from ox.listener import CHANNEL
from ox.models import Status, Task, Worker
from ox.prefetch import Prefetch
from tests import gated_tasks, tasks
from tests.helpers import wait_until
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def listening_since(moment) -> bool:
    """A LISTEN session opened at or after `moment` is up (its last statement was the LISTEN).
    The test database is this run's own, so that is the worker's listener thread."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query = %s AND backend_start >= %s",
            [f"LISTEN {CHANNEL}", moment],
        )
        return cursor.fetchone()[0] >= 1


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_idle_worker_is_woken_by_notify_not_the_poll(start_worker):
    interval = 30.0
    worker = start_worker("--interval", str(interval))
    # Wait for the events, not a guessed sleep: the worker registered, then its listener
    # session issued LISTEN (it opens after the worker row is written).
    started = wait_until(lambda: Worker.objects.filter(pid=worker.pid).values_list("started_at", flat=True).first())
    wait_until(lambda: listening_since(started), timeout=30)
    # Woken by a poll, a task would wait up to `interval` (the worker polls again `interval`
    # after its last claim); NOTIFY wakes it in milliseconds (3.3 ms p50 in the benchmarks).
    # interval / 10 leaves a busy machine room and still fails tenfold if it waited to poll.
    bound = interval / 10
    latencies = []
    for i in range(5):
        r = tasks.echo.enqueue(i)
        wait_until(lambda r=r: Task.objects.filter(pk=r.id, status=Status.SUCCESSFUL).exists(), timeout=interval / 2)
        row = Task.objects.get(pk=r.id)
        latencies.append((row.started_at - row.enqueued_at).total_seconds())
    assert max(latencies) < bound, latencies


def payloads_until(listener, marker: str) -> list[str]:
    """The payloads that arrive before `marker`, which the test sends itself right after the
    statement under test. PostgreSQL delivers notifications in commit order, so once the
    marker is in, every notification that statement caused is in too: no quiet period to guess."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, marker])  # autocommit: its own commit
    seen = []
    for note in listener.notifies(timeout=30):
        if note.payload == marker:
            return seen
        seen.append(note.payload)
    raise AssertionError(f"marker {marker!r} not delivered within 30 s (seen {seen})")


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_notify_trigger_fires_once_per_insert_statement_and_only_on_commit():
    import psycopg

    s = connection.settings_dict
    listener = psycopg.connect(
        host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"], dbname=s["NAME"], autocommit=True
    )
    # A worker of each queue waits (migration 0012: otherwise nothing needs a notification).
    now = timezone.now()
    for queue in ("default", "other"):
        Worker.objects.create(
            id=f"waiting-{queue}", host="h", pid=1, queues=[queue], started_at=now, heartbeat_at=now, idle_since=now
        )
    try:
        listener.execute(f"LISTEN {CHANNEL}")
        from django.db import transaction

        from ox import enqueue_many

        try:
            with transaction.atomic():
                tasks.echo.enqueue(1)
                raise RuntimeError
        except RuntimeError:
            pass
        assert payloads_until(listener, "after-rollback") == []  # rolled back: no wake-up
        enqueue_many(tasks.echo, [((i,), {}) for i in range(50)])
        # 50 rows, one statement, one NOTIFY, naming its queue (migration 0010).
        assert payloads_until(listener, "after-insert") == ["default"]
        with transaction.atomic():
            tasks.echo.enqueue(1)
            tasks.other_queue.enqueue()
            tasks.echo.enqueue(2)
        assert sorted(payloads_until(listener, "after-two-queues")) == ["default", "other"]
        # Turned off for a session (or role, or database): no notification.
        with connection.cursor() as cursor:
            cursor.execute("SET ox.notify = off")
        try:
            tasks.echo.enqueue(3)
            enqueue_many(tasks.echo, [((i,), {}) for i in range(5)])
            assert payloads_until(listener, "after-off") == []
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET ox.notify")
        tasks.echo.enqueue(4)
        assert payloads_until(listener, "after-reset") == ["default"]
    finally:
        listener.close()


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_a_listener_wakes_its_worker_only_for_its_own_queues():
    from ox.listener import Listener

    woken = threading.Event()
    listener = Listener(connection.alias, woken.set, ["emails", "reports"])
    listener.start()
    with connection.cursor() as cursor:  # every enqueue notifies, whoever waits: the filter is the listener's
        cursor.execute("SET ox.notify = always")
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # LISTEN is in place once a probe wakes it
            tasks.echo.using(queue_name="emails").enqueue("probe")
            if woken.wait(0.2):
                break
        assert woken.is_set(), "the listener never heard the probe"
        time.sleep(0.3)
        woken.clear()
        for i in range(20):
            tasks.echo.enqueue(i)  # queue "default": not this worker's
        tasks.other_queue.enqueue()
        assert not woken.wait(1.0), "woken by another queue's enqueue"
        tasks.echo.using(queue_name="reports").enqueue("mine")
        assert woken.wait(5.0), "not woken by its own queue's enqueue"
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ox.notify")
        listener.stop()
        listener.thread.join(timeout=5)


def test_complete_and_claim_is_one_statement(django_assert_num_queries):
    for i in range(6):
        tasks.echo.enqueue(i)
    now = clock.db_now(connection)
    first = sql.claim(connection, "w", ["default"], 3, now, now + timezone.timedelta(minutes=1))
    done = [sql.Completion(c.id, c.fence, "1", now, now) for c in first]
    # SQLite: BEGIN, the completion, the priorities waiting, one range scan, the UPDATE, COMMIT.
    # MariaDB (tests/test_round_trips.py): the completion's lock and update, the claim's three.
    expected = {"postgresql": 1, "sqlite": 6, "mysql": 8}[connection.vendor]
    with django_assert_num_queries(expected):
        written, claimed = sql.complete_and_claim(connection, done, "w", ["default"], (3, 0), now, now)
    assert written == {c.key for c in first} and len(claimed) == 3
    assert Task.objects.filter(status=Status.SUCCESSFUL).count() == 3


def test_prefetch_follows_task_duration():
    p = Prefetch(limit=100, window=0.05)
    assert p.size() == 0  # nothing known: only free slots
    for _ in range(50):
        p.observe("t.short", 0.0001)
    assert p.size() == 100
    assert p.short("t.short") and not p.short("t.never_seen")  # an unknown path is not prefetched
    p.running_long("t.short", 0.5)  # one is running long: that path is not short any more
    assert not p.short("t.short")
    for _ in range(100):
        p.observe("t.long", 2.0)
    assert p.size() == 0
    assert Prefetch(limit=7, window=None).size() == 7


def test_long_tasks_are_not_hoarded_by_one_worker(start_worker, tmp_path):
    # Two idle workers of two slots, four tasks that hold their slot until the gate opens: all
    # four start only if each worker holds just what it can run now (a hoarder would sit on two
    # it cannot start). Gated rather than slept: with 2 s sleeps, a second worker that starts
    # late on a busy machine finds the first two done and the first worker running the rest.
    gate = tmp_path / "gate"
    for i in range(4):
        gated_tasks.hold.enqueue(f"k{i}", str(gate))
    a = start_worker("--concurrency", "2")
    b = start_worker("--concurrency", "2")
    try:
        wait_until(lambda: Ledger.objects.count() == 4, timeout=60)
        holders = dict(Worker.objects.values_list("pid", "id"))
        assert set(Ledger.objects.values_list("pid", flat=True)) == {a.pid, b.pid}
        running = Task.objects.filter(status=Status.RUNNING)
        assert sorted(running.values_list("worker_id", flat=True)) == sorted([holders[a.pid], holders[b.pid]] * 2)
    finally:
        gate.touch()
    wait_until(lambda: Task.objects.filter(status=Status.SUCCESSFUL).count() == 4, timeout=60)
    for w in (a, b):
        w.signal(signal.SIGTERM)
    for w in (a, b):
        assert w.wait(timeout=30) == 0


def test_short_tasks_drain_in_batches(start_worker):
    from ox import enqueue_many

    enqueue_many(tasks.noop, [((), {}) for _ in range(3000)])
    worker = start_worker("--batch", "--concurrency", "1")
    assert worker.wait(timeout=120) == 0, worker.output()
    assert Task.objects.filter(status=Status.SUCCESSFUL).count() == 3000
