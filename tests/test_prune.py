"""Retention: prune_tasks per status and age, in batches, dry run; the workers' pruning duty."""

import json
import re
import signal
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ox.models import ArchivedTask, Attempt, Outcome, Status, Task
from ox.prune import Pruner, prune
from tests.helpers import wait_until
from tests.settings import TASKS

pytestmark = pytest.mark.django_db


def make(status, age, n=1, attempts=0):
    now = timezone.now()
    finished = now - age if status in (Status.SUCCESSFUL, Status.FAILED, Status.CANCELLED) else None
    rows = Task.objects.bulk_create(
        [
            Task(
                task_path="tests.tasks.noop",
                status=status,
                run_after=now - age,
                enqueued_at=now - age,
                finished_at=finished,
                attempts=max(attempts, 1),
                max_attempts=max(attempts, 1),
            )
            for _ in range(n)
        ]
    )
    for row in rows:
        for number in range(1, attempts + 1):
            Attempt.objects.create(task=row, number=number, finished_at=now - age, outcome=Outcome.FAILED)
    return rows


def run(*args):
    out = StringIO()
    call_command("prune_tasks", *args, stdout=out)
    return out.getvalue()


def counts():
    """Tasks per status in ox_task and the archive together (a worker's archiver may move them)."""
    return {
        s: Task.objects.filter(status=s).count() + ArchivedTask.objects.filter(status=s).count()
        for s in Status
        if s != Status.PENDING
    }


def test_dry_run_prints_counts_and_deletes_nothing():
    make(Status.SUCCESSFUL, timedelta(days=8), n=4)
    make(Status.FAILED, timedelta(days=9), n=2)
    make(Status.SUCCESSFUL, timedelta(days=1), n=3)
    output = run("--older-than", "7d", "--dry-run")
    assert "SUCCESSFUL: would delete 4 tasks" in output
    assert "FAILED: would delete 2 tasks" in output
    assert "CANCELLED: would delete 0 tasks" in output
    assert Task.objects.count() == 9


def test_prunes_per_status_and_age_and_never_live_tasks():
    make(Status.SUCCESSFUL, timedelta(days=8), n=3)
    make(Status.SUCCESSFUL, timedelta(days=2), n=2)
    make(Status.FAILED, timedelta(days=8), n=2, attempts=2)
    make(Status.CANCELLED, timedelta(days=30), n=1)
    make(Status.READY, timedelta(days=30), n=2)
    make(Status.RUNNING, timedelta(days=30), n=1)
    output = run("--older-than", "7d", "--status", "SUCCESSFUL,cancelled")
    assert "SUCCESSFUL: deleted 3 tasks" in output and "CANCELLED: deleted 1 tasks" in output
    assert counts() == {"READY": 2, "RUNNING": 1, "SUCCESSFUL": 2, "FAILED": 2, "CANCELLED": 0}
    assert Attempt.objects.count() == 4
    run("--older-than", "1w", "--status", "FAILED")
    assert counts()["FAILED"] == 0 and Attempt.objects.count() == 0  # attempts go with their task


def test_batches_are_separate_short_deletes():
    make(Status.SUCCESSFUL, timedelta(hours=2), n=10)
    with CaptureQueriesContext(connection) as ctx:
        output = run("--older-than", "1h", "--status", "SUCCESSFUL", "--batch-size", "3")
    deletes = [q["sql"] for q in ctx.captured_queries if q["sql"].startswith("DELETE FROM ox_task")]
    assert len(deletes) == 4  # 3 + 3 + 3 + 1
    assert "total: 10 tasks in 4 batches of at most 3" in output
    assert not Task.objects.exists()


def test_oldest_rows_go_first():
    old = make(Status.SUCCESSFUL, timedelta(days=5), n=2)
    make(Status.SUCCESSFUL, timedelta(days=3), n=2)
    from ox.prune import prune_batch

    assert prune_batch(connection, "SUCCESSFUL", timezone.now() - timedelta(days=1), 2, wait=True) == 2
    assert not Task.objects.filter(pk__in=[r.pk for r in old]).exists() and Task.objects.count() == 2


@override_settings(
    TASKS={"default": {**TASKS["default"], "OPTIONS": {"PRUNE": {"SUCCESSFUL": "1d", "FAILED": 7 * 86400}}}}
)
def test_without_older_than_the_options_rules_apply():
    """PRUNE is laid over the defaults: CANCELLED keeps its 7 days."""
    make(Status.SUCCESSFUL, timedelta(days=2), n=2)
    make(Status.FAILED, timedelta(days=2), n=2)
    make(Status.CANCELLED, timedelta(days=60), n=1)
    make(Status.CANCELLED, timedelta(days=6), n=1)
    output = run()
    assert "SUCCESSFUL: deleted 2" in output and "FAILED: deleted 0" in output and "CANCELLED: deleted 1" in output
    assert counts()["FAILED"] == 2 and counts()["CANCELLED"] == 1


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--older-than", "soon"), "not a duration"),
        (("--older-than", "1d", "--status", "READY"), "finished statuses"),
        (("--older-than", "1d", "--batch-size", "0"), "at least 1"),
        (("--older-than", "1d", "--backend", "nope"), "nope"),
    ],
)
def test_bad_arguments(args, fragment):
    with pytest.raises(CommandError, match=fragment):
        run(*args)


def test_pruner_duty_respects_its_interval_and_budget():
    make(Status.SUCCESSFUL, timedelta(days=2), n=5)
    pruner = Pruner({"SUCCESSFUL": timedelta(days=1)}, interval=3600, batch_size=2)
    # A round stops after DUTY_BUDGET seconds and carries on at the next call, so on a busy
    # machine the five rows may take more than one call; the round that ends it is complete
    # (its last batch is short) and sets the next round an interval away.
    for _ in range(10):  # a call runs at least one batch unless stalled: 2 + 2 + 1 takes three
        pruner.run(connection, timezone.now())
        if not Task.objects.exists():
            break
    assert not Task.objects.exists()
    make(Status.SUCCESSFUL, timedelta(days=2), n=1)
    pruner.run(connection, timezone.now())  # not due again for an hour
    assert Task.objects.count() == 1
    result = prune(connection, {"SUCCESSFUL": timedelta(days=1)}, timezone.now(), 1, budget=-1)
    assert result.done is False and result.total == 0  # out of budget before the first batch


@pytest.mark.django_db(transaction=True)
def test_a_pruner_holding_the_lock_makes_the_other_skip():
    if connection.vendor != "postgresql":
        pytest.skip("advisory locks are PostgreSQL's; SQLite's single writer serialises pruners")
    from ox.connection import open_worker_connection
    from ox.prune import PRUNER_KEY, prune_batch
    from ox.sql import LOCK_NAMESPACE

    make(Status.SUCCESSFUL, timedelta(days=2), n=2)
    other = open_worker_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, PRUNER_KEY])
            assert prune_batch(connection, "SUCCESSFUL", timezone.now(), 10, wait=False) is None
            cursor.execute("ROLLBACK")
        assert prune_batch(connection, "SUCCESSFUL", timezone.now(), 10, wait=False) == 2
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_prunes_with_its_duty(start_worker):
    make(Status.SUCCESSFUL, timedelta(days=3), n=5)
    make(Status.FAILED, timedelta(days=3), n=2)
    options = {"PRUNE": {"SUCCESSFUL": "1d"}, "PRUNE_BATCH": 2}
    worker = start_worker(env={"DJANGO_SETTINGS_MODULE": "tests.settings_ops", "OX_TEST_OPTIONS": json.dumps(options)})
    wait_until(lambda: counts()["SUCCESSFUL"] == 0, timeout=30, interval=0.1)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    assert counts()["FAILED"] == 2
    # One round, or several if a busy machine ran one past its DUTY_BUDGET: five in all.
    pruned = [int(n) for n in re.findall(r"pruned (\d+) finished tasks", worker.output())]
    assert sum(pruned) == 5, worker.output()
