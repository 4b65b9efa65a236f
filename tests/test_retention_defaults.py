"""Retention out of the box: finished tasks are pruned after ox's default retention
(SUCCESSFUL and CANCELLED 7 days, FAILED 30 days) with no OPTIONS at all, PRUNE is laid over
those defaults, and ox_worker rows of workers long stopped (or long silent) go too; the
dashboard's Health page says what is in force. On every database."""

import signal
from collections import Counter
from datetime import timedelta
from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from ox import clock
from ox.conf import DEFAULT_PRUNE, OxOptions
from ox.models import ArchivedTask, Status, Task, Worker
from ox.prune import Pruner, prune_workers
from tests.helpers import wait_until
from tests.settings import TASKS
from tests.test_prune import make

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


def kept() -> dict[str, int]:
    # One statement over both tables: a worker's archiver moving a row between two counts
    # would count it twice (or not at all).
    both = Task.objects.values_list("status", flat=True).union(
        ArchivedTask.objects.values_list("status", flat=True), all=True
    )
    counts = Counter(both)
    return {s: counts[s] for s in Status}


def test_the_defaults_keep_failures_longer_than_successes():
    rules = OxOptions().prune_rules()
    assert rules == {"SUCCESSFUL": 7 * DAY, "FAILED": 30 * DAY, "CANCELLED": 7 * DAY}
    assert rules["SUCCESSFUL"] < rules["FAILED"] and rules["CANCELLED"] < rules["FAILED"]
    assert OxOptions().worker_retention() == 7 * DAY
    assert set(DEFAULT_PRUNE) == {"SUCCESSFUL", "FAILED", "CANCELLED"}


@pytest.mark.parametrize(
    ("prune", "expected"),
    [
        ({}, {"SUCCESSFUL": 7 * DAY, "FAILED": 30 * DAY, "CANCELLED": 7 * DAY}),
        ({"FAILED": "90d"}, {"SUCCESSFUL": 7 * DAY, "FAILED": 90 * DAY, "CANCELLED": 7 * DAY}),
        ({"SUCCESSFUL": None}, {"FAILED": 30 * DAY, "CANCELLED": 7 * DAY}),
        (
            {"SUCCESSFUL": 3600, "CANCELLED": "1h"},
            {"SUCCESSFUL": timedelta(hours=1), "FAILED": 30 * DAY, "CANCELLED": timedelta(hours=1)},
        ),
        (None, {}),
    ],
)
def test_prune_is_laid_over_the_defaults(prune, expected):
    assert OxOptions.from_dict({"PRUNE": prune}).prune_rules() == expected


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"PRUNE": "7d"}, "PRUNE must be a dict"),
        ({"PRUNE": {"READY": "1d"}}, "not a finished status"),
        ({"PRUNE": {"FAILED": "soon"}}, "PRUNE['FAILED']"),
        ({"PRUNE_WORKERS": "forever"}, "PRUNE_WORKERS"),
        ({"PRUNE_WORKERS": -5}, "PRUNE_WORKERS"),
    ],
)
def test_bad_retention_is_refused_clearly(options, fragment):
    with pytest.raises(ImproperlyConfigured, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        OxOptions.from_dict(options)


def run(*args: str) -> str:
    out = StringIO()
    call_command("prune_tasks", *args, stdout=out)
    return out.getvalue()


def test_prune_tasks_with_no_options_and_no_settings_applies_the_defaults():
    make(Status.SUCCESSFUL, 8 * DAY, n=3)
    make(Status.SUCCESSFUL, 6 * DAY, n=1)
    make(Status.CANCELLED, 8 * DAY, n=2)
    make(Status.FAILED, 8 * DAY, n=2)  # a failure is kept 30 days
    make(Status.FAILED, 31 * DAY, n=1)
    make(Status.READY, 60 * DAY, n=1)  # never a live task
    output = run()
    assert "SUCCESSFUL: deleted 3" in output and "CANCELLED: deleted 2" in output and "FAILED: deleted 1" in output
    assert kept() == {**dict.fromkeys(Status, 0), "SUCCESSFUL": 1, "FAILED": 2, "READY": 1}


@override_settings(TASKS={"default": {**TASKS["default"], "OPTIONS": {"PRUNE": None}}})
def test_prune_none_keeps_everything_and_the_command_says_how_to_prune():
    make(Status.SUCCESSFUL, 400 * DAY, n=1)
    with pytest.raises(CommandError, match="--older-than"):
        run()
    assert kept()["SUCCESSFUL"] == 1


# ------------------------------------------------------------------ worker rows
def worker(stopped_ago: timedelta | None, beat_ago: timedelta, name: str) -> Worker:
    now = timezone.now()
    return Worker.objects.create(
        id=f"ret-{name}",
        host="h",
        pid=1,
        queues=["default"],
        started_at=now - beat_ago - DAY,
        heartbeat_at=now - beat_ago,
        stopped_at=None if stopped_ago is None else now - stopped_ago,
    )


def test_old_worker_rows_go_but_never_one_a_running_task_or_a_slot_names():
    worker(8 * DAY, 8 * DAY, "stopped-long-ago")
    worker(DAY, DAY, "stopped-yesterday")
    worker(None, 8 * DAY, "vanished")  # SIGKILLed, its host gone: never stopped
    worker(None, timedelta(seconds=1), "alive")
    holder = worker(None, 8 * DAY, "vanished-with-a-task")
    (task,) = make(Status.RUNNING, 8 * DAY)
    Task.objects.filter(pk=task.pk).update(worker_id=holder.id)
    slotted = worker(None, 8 * DAY, "vanished-with-a-slot")
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ox_slot (queue, n, worker_id, expires_at) VALUES (%s, %s, %s, %s)",
            ["q-ret", 0, slotted.id, connection.ops.adapt_datetimefield_value(timezone.now())],
        )
    output = run("--status", "SUCCESSFUL")
    assert "workers: deleted 2 rows" in output
    assert set(Worker.objects.values_list("id", flat=True)) == {
        "ret-stopped-yesterday",
        "ret-alive",
        "ret-vanished-with-a-task",
        "ret-vanished-with-a-slot",
    }


def test_worker_rows_go_in_batches_and_none_keeps_them():
    for i in range(5):
        worker(8 * DAY, 8 * DAY, f"old-{i}")
    now = clock.db_now(connection)
    assert prune_workers(connection, now - 7 * DAY, limit=2) == 2
    assert prune_workers(connection, now - 7 * DAY, limit=2) == 2
    assert prune_workers(connection, now - 7 * DAY, limit=2) == 1
    assert prune_workers(connection, now - 7 * DAY, limit=2) == 0
    worker(8 * DAY, 8 * DAY, "kept")
    with override_settings(TASKS={"default": {**TASKS["default"], "OPTIONS": {"PRUNE_WORKERS": None}}}):
        assert "workers:" not in run("--status", "SUCCESSFUL")
    assert Worker.objects.filter(id="ret-kept").exists()


def test_the_pruning_duty_prunes_worker_rows_too():
    worker(8 * DAY, 8 * DAY, "old")
    pruner = Pruner(OxOptions().prune_rules(), interval=3600, batch_size=100, workers=7 * DAY)
    pruner.run(connection, clock.db_now(connection))
    assert not Worker.objects.filter(id="ret-old").exists()


@pytest.mark.django_db(transaction=True)
def test_a_worker_with_no_retention_options_prunes_at_start(start_worker):
    """A real worker with the defaults: old finished tasks and old worker rows are gone after
    its first pruning round, the rest stays."""
    make(Status.SUCCESSFUL, 8 * DAY, n=3)
    make(Status.FAILED, 8 * DAY, n=1)
    worker(8 * DAY, 8 * DAY, "old")
    proc = start_worker()
    wait_until(lambda: kept()["SUCCESSFUL"] == 0 and not Worker.objects.filter(id="ret-old").exists(), timeout=30)
    assert kept()["FAILED"] == 1
    assert Worker.objects.filter(pid=proc.pid).exists()  # its own row, of course, stays
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0


# ------------------------------------------------------------------ the dashboard
def test_the_health_page_shows_the_retention_in_force(admin_client):
    page = admin_client.get(reverse("dashboard:health")).content.decode()
    section = page[page.index('id="health-retention"') :]
    row = section[section.index('data-backend="default"') :]
    cells = row[: row.index("</tr>")].split("<td")[2:]
    assert [c[c.index(">") + 1 : c.index("</td>")] for c in cells] == ["7 d", "7 d", "30 d", "7 d", "5 min"]


@override_settings(
    TASKS={
        "default": {
            **TASKS["default"],
            "OPTIONS": {"PRUNE": {"SUCCESSFUL": None}, "PRUNE_WORKERS": None, "ARCHIVE_AFTER": None},
        }
    }
)
def test_the_health_page_says_kept_and_never(admin_client):
    page = admin_client.get(reverse("dashboard:health")).content.decode()
    section = page[page.index('id="health-retention"') :]
    row = section[section.index('data-backend="default"') :]
    cells = row[: row.index("</tr>")].split("<td")[2:]
    assert [c[c.index(">") + 1 : c.index("</td>")] for c in cells] == ["kept", "7 d", "30 d", "kept", "never"]
