"""Tasks a worker gives back unstarted (claimed ahead, then the worker stops) go back to
READY with no enqueue to tell the idle workers: ox.upkeep.hand_back wakes them as an enqueue
would (NOTIFY on PostgreSQL, KILL QUERY on MariaDB), so they start at once, not at the idle
worker's poll. SQLite has no wake-up: its workers poll."""

import signal
import time

import pytest
from django.db import connection

from ox.db import driver
from ox.models import Status, Task, Worker
from tests import gated_tasks, tasks
from tests.helpers import wait_until
from tests.test_notify_idle import options

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not driver(connection).notifies, reason="this database has no wake-up: workers poll"),
]


def test_what_a_stopping_worker_gives_back_starts_at_once_on_an_idle_one(start_worker, tmp_path):
    a = start_worker("--concurrency", "1", env=options(poll_interval=30, prefetch_window=None))
    wait_until(lambda: Worker.objects.filter(pid=a.pid, idle_since__isnull=False).exists(), timeout=30)
    # Held until the end: a task of fixed length could end while b boots on a busy machine,
    # and a would then run the one it claimed ahead itself.
    gate = tmp_path / "gate"
    long = gated_tasks.hold.enqueue("long", str(gate))
    ahead = tasks.echo.enqueue("claimed ahead")
    wait_until(lambda: Task.objects.get(pk=long.id).status == Status.RUNNING, timeout=10)
    wait_until(lambda: Task.objects.get(pk=ahead.id).status == Status.RUNNING, timeout=10)  # claimed ahead by a
    b = start_worker(env=options(poll_interval=30))
    wait_until(lambda: Worker.objects.filter(pid=b.pid, idle_since__isnull=False).exists(), timeout=30)
    time.sleep(0.5)  # b's listener has woken it once at its start and it found nothing
    stopped = time.monotonic()
    a.signal(signal.SIGTERM)
    wait_until(lambda: Task.objects.get(pk=ahead.id).status == Status.SUCCESSFUL, timeout=25)
    took = time.monotonic() - stopped
    gate.touch()
    row = Task.objects.get(pk=ahead.id)
    assert row.worker_id == Worker.objects.get(pid=b.pid, stopped_at__isnull=True).id
    assert took < 5, f"given back, it started {took:.1f} s later: at b's poll (30 s), not at once"
    assert a.wait(30) == 0
    b.signal(signal.SIGTERM)
    assert b.wait(30) == 0
