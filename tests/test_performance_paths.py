"""The mechanisms the benchmarks rely on, checked for behaviour (speed is measured in bench/)."""

import signal
import time

import pytest
from django.db import connection
from django.utils import timezone

from ox import sql
from ox.models import Status, Task, Worker
from ox.prefetch import Prefetch
from tests import tasks
from tests.helpers import wait_until
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_idle_worker_is_woken_by_notify_not_the_poll(start_worker):
    worker = start_worker("--interval", "30")
    wait_until(lambda: Worker.objects.filter(pid=worker.pid).exists(), timeout=30)
    time.sleep(0.5)  # idle: its next poll is 30 s away
    latencies = []
    for i in range(5):
        r = tasks.echo.enqueue(i)
        wait_until(lambda r=r: Task.objects.filter(pk=r.id, status=Status.SUCCESSFUL).exists(), timeout=5)
        row = Task.objects.get(pk=r.id)
        latencies.append((row.started_at - row.enqueued_at).total_seconds())
    assert max(latencies) < 1.0, latencies


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_notify_trigger_fires_once_per_insert_statement_and_only_on_commit():
    import psycopg

    s = connection.settings_dict
    listener = psycopg.connect(
        host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"], dbname=s["NAME"], autocommit=True
    )
    try:
        listener.execute("LISTEN ox_task")
        from django.db import transaction

        from ox import enqueue_many

        try:
            with transaction.atomic():
                tasks.echo.enqueue(1)
                raise RuntimeError
        except RuntimeError:
            pass
        assert list(listener.notifies(timeout=0.5)) == []  # rolled back: no wake-up
        enqueue_many(tasks.echo, [((i,), {}) for i in range(50)])
        assert len(list(listener.notifies(timeout=0.5))) == 1
    finally:
        listener.close()


def test_complete_and_claim_is_one_statement(django_assert_num_queries):
    for i in range(6):
        tasks.echo.enqueue(i)
    now = timezone.now()
    first = sql.claim(connection, "w", ["default"], 3, now, now + timezone.timedelta(minutes=1))
    done = [sql.Completion(c.id, c.fence, "1", now) for c in first]
    expected = 1 if connection.vendor == "postgresql" else 4  # SQLite: BEGIN, two statements, COMMIT
    with django_assert_num_queries(expected):
        written, claimed = sql.complete_and_claim(connection, done, "w", ["default"], 3, now, now)
    assert written == {c.id for c in first} and len(claimed) == 3
    assert Task.objects.filter(status=Status.SUCCESSFUL).count() == 3


def test_prefetch_follows_task_duration():
    p = Prefetch(limit=100, window=0.05)
    assert p.size() == 0  # nothing known: only free slots
    for _ in range(50):
        p.observe(0.0001)
    assert p.size() == 100
    for _ in range(100):
        p.observe(2.0)
    assert p.size() == 0
    assert Prefetch(limit=7, window=None).size() == 7


def test_long_tasks_are_not_hoarded_by_one_worker(start_worker):
    # Two idle workers, four 2 s tasks: each worker may hold only what it can run now.
    for i in range(4):
        tasks.record_then_sleep.enqueue(f"k{i}", 2.0)
    a = start_worker("--concurrency", "2")
    b = start_worker("--concurrency", "2")
    wait_until(lambda: Ledger.objects.count() == 4, timeout=30)
    holders = dict(Worker.objects.values_list("pid", "id"))
    assert set(Ledger.objects.values_list("pid", flat=True)) == {a.pid, b.pid}
    running = Task.objects.filter(status=Status.RUNNING)
    assert {holders[a.pid], holders[b.pid]} == set(running.values_list("worker_id", flat=True))
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
