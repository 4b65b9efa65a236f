"""PostgreSQL: an enqueue notifies only when a worker of its queue waits (migration 0012, ox.idle).

The trigger is tested against rows of ox_worker written by hand (which workers are marked idle,
of which queues, stopped or not), with a LISTEN session of its own counting what arrives; then
real worker subprocesses: a waiting worker is marked and woken at once (its poll is 30 s), a
draining one clears its mark within heartbeats, and an enqueue whose transaction saw no idle
worker and commits after the worker's last look is still found by the worker's poll."""

import json
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

import ox
from ox.models import Status, Task, Worker
from tests import gated_tasks, tasks
from tests.helpers import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY is PostgreSQL's"),
]


def worker_row(queues: list[str], idle: bool = True, stopped: bool = False) -> Worker:
    now = timezone.now()
    return Worker.objects.create(
        id=f"test-{uuid.uuid4()}",
        host="test",
        pid=1,
        queues=queues,
        started_at=now,
        heartbeat_at=now,
        idle_since=now if idle else None,
        stopped_at=now if stopped else None,
    )


def test_no_waiting_worker_no_notification(listener):
    worker_row(["default"], idle=False)  # running, busy
    worker_row(["default"], stopped=True)  # idle when it stopped
    worker_row(["other"])  # waits, for another queue
    tasks.echo.enqueue(1)
    assert listener() == []


def test_a_waiting_worker_of_the_queue_is_notified_once_per_statement(listener):
    worker_row(["other", "default"])
    tasks.echo.enqueue(1)
    assert listener() == ["default"]
    ox.enqueue_many(tasks.echo, [((i,), {}) for i in range(50)])
    assert listener() == ["default"]


def test_notify_always_and_off(listener):
    with connection.cursor() as cursor:
        cursor.execute("SET ox.notify = always")
    try:
        tasks.echo.enqueue(1)  # nobody waits, yet it notifies
        assert listener() == ["default"]
        worker_row(["default"])
        with connection.cursor() as cursor:
            cursor.execute("SET ox.notify = off")
        tasks.echo.enqueue(1)  # someone waits, yet it does not
        assert listener() == []
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET ox.notify")
    tasks.echo.enqueue(1)
    assert listener() == ["default"]


def options(**values: object) -> dict[str, str]:
    return {"OX_TEST_OPTIONS": json.dumps({k.upper(): v for k, v in values.items()})}


def idle_since(worker_id: str | None = None):
    rows = Worker.objects.filter(stopped_at__isnull=True)
    row = rows.filter(id=worker_id).first() if worker_id else rows.first()
    return row.idle_since if row else None


def test_a_waiting_worker_marks_itself_and_wakes_at_once(start_worker, listener):
    worker = start_worker(env=options(poll_interval=30))
    wait_until(lambda: idle_since() is not None, timeout=30)
    started = time.monotonic()
    result = tasks.echo.enqueue("hi")
    wait_until(lambda: Task.objects.get(pk=result.id).status == Status.SUCCESSFUL, timeout=10)
    assert time.monotonic() - started < 5  # a poll would take 30 s
    assert "default" in listener(0.1)
    worker.signal(15)
    assert worker.wait(30) == 0


def test_a_draining_worker_clears_its_mark_and_marks_again_when_done(start_worker):
    """20,000 tasks at concurrency 1 keep the worker busy for seconds: its heartbeat (0.3 s)
    clears the mark while the backlog lasts, and it marks again once the backlog is gone."""
    worker = start_worker("--concurrency", "1", env=options(heartbeat=0.3, lease=3))
    wait_until(lambda: idle_since() is not None, timeout=30)
    ox.enqueue_many(tasks.noop, [((), {})] * 20_000)
    seen_clear = wait_until(
        lambda: idle_since() is None and Task.objects.filter(status=Status.READY).exists(), timeout=30, interval=0.05
    )
    assert seen_clear
    wait_until(lambda: not Task.objects.filter(status__in=[Status.READY, Status.RUNNING]).exists(), timeout=120)
    wait_until(lambda: idle_since() is not None, timeout=10)
    worker.signal(15)
    assert worker.wait(30) == 0


def test_an_enqueue_that_commits_after_the_workers_last_look_waits_for_its_poll(start_worker, tmp_path, listener):
    """The documented limit: the producer's trigger runs while the worker is busy (no mark,
    so no notification), its transaction stays open past the worker's mark and the look
    after it, and it commits later. The worker finds the task at its poll (2 s here)."""
    gate = tmp_path / "gate"
    worker = start_worker("--concurrency", "1", env=options(poll_interval=2, heartbeat=0.3, lease=3))
    wait_until(lambda: idle_since() is not None, timeout=30)
    gated_tasks.hold.enqueue("held", str(gate))
    wait_until(lambda: idle_since() is None, timeout=10)  # busy through a heartbeat: cleared
    listener(0.05)
    with transaction.atomic():
        late = tasks.echo.enqueue("late")
        Path(gate).touch()  # the worker finishes "held", looks (sees nothing), marks itself
        wait_until(lambda: idle_since() is not None, timeout=10)
        time.sleep(0.3)  # past the look IDLE_RELOOK after the mark
    committed = time.monotonic()
    assert listener(0.1) == []  # the trigger saw no waiting worker
    wait_until(lambda: Task.objects.get(pk=late.id).status == Status.SUCCESSFUL, timeout=10)
    assert time.monotonic() - committed < 2 + 1.5
    worker.signal(15)
    assert worker.wait(30) == 0


def test_mark_is_a_timestamp_of_the_database_clock(start_worker):
    worker = start_worker()
    since = wait_until(lambda: idle_since(), timeout=30)
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now = cursor.fetchone()[0]
    assert now - timedelta(seconds=60) < since <= now
    worker.signal(15)
    assert worker.wait(30) == 0


def test_the_triggers_look_reads_the_idle_index_however_many_workers_stopped():
    """ox_worker keeps a row per worker start; the trigger's look must not scan them all."""
    now = timezone.now()
    Worker.objects.bulk_create(
        Worker(id=f"gone-{i}", host="h", pid=i, queues=["default"], started_at=now, heartbeat_at=now, stopped_at=now)
        for i in range(20_000)
    )
    worker_row(["default"])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ox_worker")
        cursor.execute(
            "EXPLAIN (FORMAT JSON) SELECT 1 FROM ox_worker w WHERE w.idle_since IS NOT NULL"
            " AND w.stopped_at IS NULL AND w.queues @> to_jsonb('default'::text)"
        )
        plan = json.dumps(cursor.fetchone()[0])
    assert "ox_worker_idle" in plan and "Seq Scan" not in plan, plan


def test_a_worker_with_a_free_slot_stays_marked_through_heartbeats(start_worker, tmp_path):
    """Concurrency 2, one slot held by a long task: the worker waits for its other slot and makes
    no claim until woken. Its heartbeats (0.3 s) must not clear the mark, or an enqueue would
    notify no one and wait for the poll (30 s here)."""
    gate = tmp_path / "gate"
    worker = start_worker("--concurrency", "2", env=options(poll_interval=30, heartbeat=0.3, lease=3))
    wait_until(lambda: idle_since() is not None, timeout=30)
    gated_tasks.hold.enqueue("held", str(gate))
    wait_until(lambda: Task.objects.filter(status=Status.RUNNING).exists(), timeout=10)
    time.sleep(1.5)  # five heartbeats
    assert idle_since() is not None
    started = time.monotonic()
    waiting = tasks.echo.enqueue("next")
    wait_until(lambda: Task.objects.get(pk=waiting.id).status == Status.SUCCESSFUL, timeout=20)
    assert time.monotonic() - started < 5
    Path(gate).touch()
    worker.signal(15)
    assert worker.wait(30) == 0
