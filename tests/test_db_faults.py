"""PostgreSQL goes away under a draining worker: nothing is lost or left stuck."""

import os
import subprocess
import time

import pytest
from django.db import connection

from ox.models import Status, Task
from tests import tasks
from tests.helpers import wait_until
from tests.testapp.models import Ledger

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'"),
]


def unfinished() -> int:
    return Task.objects.exclude(status=Status.SUCCESSFUL).count()


def enqueue(n: int) -> None:
    from ox import enqueue_many

    enqueue_many(tasks.record_then_sleep, [((f"k{i}", 0.01), {}) for i in range(n)])


def assert_all_done(n: int) -> None:
    wait_until(lambda: unfinished() == 0, timeout=90, interval=0.2)
    assert Ledger.objects.values("key").distinct().count() == n


def test_terminated_backends_mid_drain(start_worker):
    enqueue(600)
    worker = start_worker("--concurrency", "2")
    for _ in range(3):
        wait_until(lambda: Task.objects.filter(status=Status.SUCCESSFUL).count() > 50, timeout=30)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        time.sleep(0.5)
    assert_all_done(600)
    assert worker.proc.poll() is None, worker.output()
    assert "reconnected" in worker.output()


def restart_postgres() -> None:
    cluster = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", cluster, "main", "restart"],
        check=True,
        timeout=120,
        capture_output=True,
    )


@pytest.mark.skipif(not os.path.isdir("/etc/postgresql"), reason="needs a local Debian PostgreSQL cluster")
def test_postgres_restart_mid_drain(start_worker):
    enqueue(600)
    worker = start_worker("--concurrency", "2")
    wait_until(lambda: Task.objects.filter(status=Status.SUCCESSFUL).count() > 50, timeout=30)
    connection.close()
    restart_postgres()
    connection.close()  # this test's own session died with the server too
    assert_all_done(600)
    assert worker.proc.poll() is None, worker.output()
    assert "reconnected" in worker.output()


@pytest.mark.skipif(not os.path.isdir("/etc/postgresql"), reason="needs a local Debian PostgreSQL cluster")
def test_postgres_restart_with_tasks_in_flight_reruns_nothing(start_worker):
    # Every session (every worker's liveness lock) dies with the server. Workers back within
    # the liveness grace of each other keep their tasks: nothing is rescued, nothing re-run.
    from ox.models import Attempt, Outcome

    results = [tasks.record_then_sleep.enqueue(f"flight{i}", 6.0) for i in range(4)]
    workers = [start_worker("--concurrency", "2") for _ in range(2)]
    wait_until(lambda: Ledger.objects.filter(key__startswith="flight").count() == 4, timeout=30)
    connection.close()
    restart_postgres()
    connection.close()
    wait_until(lambda: all(Task.objects.get(pk=r.id).status == Status.SUCCESSFUL for r in results), timeout=60)
    outputs = [w.output() for w in workers]
    assert not Attempt.objects.filter(outcome=Outcome.LOST).exists(), outputs
    assert Ledger.objects.filter(key__startswith="flight").count() == 4, outputs
    assert all(w.proc.poll() is None for w in workers), outputs
