"""A group's callback runs exactly once however many workers end its members at the same
moment, and a worker killed in the middle of a group neither stalls it nor runs the callback
twice. Real worker subprocesses, every database."""

import signal
import time

import pytest
from django.db import connection
from django.db.models import Count

import ox
from ox.models import Status, Task
from tests import workflow_tasks as wt
from tests.helpers import wait_until
from tests.test_durability import options
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def unfinished(run) -> int:
    ids = [r.id for r in run.results]
    return Task.objects.filter(pk__in=ids, status__in=[Status.PENDING, Status.READY, Status.RUNNING]).count()


def test_a_thousand_member_group_under_four_workers_runs_its_callback_once(start_worker):
    run = ox.group([wt.member.s(n) for n in range(1000)]).then(wt.count_members.s()).enqueue()
    workers = [start_worker("--concurrency", "2") for _ in range(4)]
    wait_until(lambda: unfinished(run) == 0, 240)
    assert Ledger.objects.filter(key="callback").count() == 1
    callback = Task.objects.get(pk=run.last.id)
    assert callback.status == Status.SUCCESSFUL
    assert callback.return_value == 1000 * 1_000_000 + sum(range(1000))
    # Every member ran once, and the members were spread over the workers (a real race).
    runs = dict(Ledger.objects.exclude(key="callback").values_list("key").annotate(n=Count("id")))
    assert len(runs) == 1000 and set(runs.values()) == {1}
    by_worker = Task.objects.filter(workflow_id=run.id).values("worker_id").distinct().count()
    assert by_worker >= 2, "one worker ran the whole group: no race was tested"
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(30) == 0


def test_a_worker_killed_mid_group_neither_stalls_it_nor_runs_the_callback_twice(start_worker):
    lease, heartbeat, rescue = (3.0, 0.5, 0.5) if connection.vendor == "sqlite" else (30.0, 3.0, 1.0)
    env = options(lease=lease, heartbeat=heartbeat, rescue_interval=rescue, liveness_grace=1.0)
    run = ox.group([wt.member.s(n, 0.02) for n in range(200)]).then(wt.count_members.s()).enqueue()
    victim = start_worker("--concurrency", "4", env=env)
    other = start_worker("--concurrency", "2", env=env)
    wait_until(lambda: Ledger.objects.count() >= 40, 60)
    victim.signal(signal.SIGKILL)
    victim.wait(10)
    started = time.monotonic()
    wait_until(lambda: unfinished(run) == 0, 120)
    assert Ledger.objects.filter(key="callback").count() == 1
    callback = Task.objects.get(pk=run.last.id)
    assert callback.return_value == 200 * 1_000_000 + sum(range(200)), other.output()[-2000:]
    assert Task.objects.filter(workflow_id=run.id, status=Status.SUCCESSFUL).count() == 201
    # Only what the killed worker ran may have run twice: those in its hands, and those it
    # finished whose success was still in its completion batch.
    twice = set(Ledger.objects.values("key").annotate(n=Count("id")).filter(n__gt=1).values_list("key", flat=True))
    by_victim = set(Ledger.objects.filter(pid=victim.pid).values_list("key", flat=True))
    assert twice <= by_victim, twice - by_victim
    assert time.monotonic() - started < 90
