"""One test per system check id: each misconfiguration is reported with its stable id."""

import pytest
from django.test import override_settings

from ox import checks
from tests.settings import DATABASES, TASKS

BASE = TASKS["default"]


def tasks_with(options=None, **params):
    return {"default": {**BASE, "OPTIONS": options or {}, **params}}


def ids(check):
    return [m.id for m in check()]


def every(task="tests.tasks.echo", **extra):
    return {"task": task, "every": 60, **extra}


def test_valid_settings_pass_every_check():
    options = {
        "SCHEDULES": {"beat": every(), "nightly": {"task": "tests.tasks.noop", "cron": "0 3 * * *"}},
        "LIMITS": {"emails": {"concurrency": 2, "key_concurrency": 1, "rate": "50/s", "key_rate": "5/10s"}},
    }
    with override_settings(TASKS=tasks_with(options), OX_METRICS_TOKEN="x" * 32):
        for check in (
            checks.check_options,
            checks.check_schedules,
            checks.check_database_settings,
            checks.check_worker_policy,
            checks.check_metrics_token,
            checks.check_limits,
        ):
            assert check() == [], check.__name__


@pytest.mark.parametrize(
    "options",
    [
        {"MAX_ATTEMPTS": 0},
        {"LEASE": -1},
        {"NOPE": 1},
        {"PRUNE": {"READY": "1d"}},
        {"PRUNE": {"FAILED": "soon"}},
        {"PRUNE_BATCH": 0},
        {"HEALTH_MAX_READY_AGE": 0},
        {"LIMITS": {"emails": {"concurrency": 0}}},
        {"LIMITS": {"emails": {"concurrency": True}}},
        {"LIMITS": {"emails": {"rate": "fast"}}},
        {"LIMITS": {"emails": {"rate": "0/s"}}},
        {"LIMITS": {"emails": {"key_rate": {"count": 5, "period": 1, "burst": 9}}}},
        {"LIMITS": {"emails": {"speed": 1}}},
        {"LIMITS": {"emails": 4}},
        {"LIMITS": ["emails"]},
    ],
)
def test_E001_bad_options(options):
    with override_settings(TASKS=tasks_with(options)):
        assert ids(checks.check_options) == ["ox.E001"]


def test_E002_bad_schedule_definition_and_not_E001():
    options = {"SCHEDULES": {"a": {"task": "tests.tasks.echo"}, "b": every(every=0), "c": every(args="x")}}
    with override_settings(TASKS=tasks_with(options)):
        assert ids(checks.check_schedules) == ["ox.E002"] * 3
        assert ids(checks.check_options) == []  # reported once, with the precise id


def test_E003_invalid_cron():
    with override_settings(TASKS=tasks_with({"SCHEDULES": {"n": {"task": "tests.tasks.echo", "cron": "0 25 * * *"}}})):
        messages = checks.check_schedules()
    assert [m.id for m in messages] == ["ox.E003"] and "hour" in messages[0].msg


@pytest.mark.parametrize("path", ["tests.tasks.missing", "nowhere.at_all", "tests.helpers.wait_until"])
def test_E004_task_does_not_import_or_is_not_a_task(path):
    with override_settings(TASKS=tasks_with({"SCHEDULES": {"s": every(path)}})):
        assert ids(checks.check_schedules) == ["ox.E004"]


def test_E005_schedule_queue_not_in_queues():
    options = {"SCHEDULES": {"a": every(queue="nope"), "b": every("tests.tasks.other_queue")}}
    with override_settings(TASKS=tasks_with(options, QUEUES=["default"])):
        assert ids(checks.check_schedules) == ["ox.E005", "ox.E005"]  # explicit, and the task's own


def test_E011_limits_for_a_queue_not_in_queues():
    options = {"LIMITS": {"emails": {"concurrency": 2}, "nope": {"rate": "5/s"}}}
    with override_settings(TASKS=tasks_with(options, QUEUES=["default", "emails"])):
        assert ids(checks.check_limits) == ["ox.E011"]
        assert ids(checks.check_options) == []


def test_E006_schedule_name_declared_twice():
    both = {**tasks_with({"SCHEDULES": {"s": every()}}), "other": {**BASE, "OPTIONS": {"SCHEDULES": {"s": every()}}}}
    with override_settings(TASKS=both):
        assert ids(checks.check_schedules) == ["ox.E006"]


def test_E007_database_alias_unknown():
    with override_settings(TASKS=tasks_with({"DATABASE": "replica"})):
        assert ids(checks.check_database_settings) == ["ox.E007"]


def test_E008_use_tz_off():
    with override_settings(USE_TZ=False):
        assert ids(checks.check_database_settings) == ["ox.E008"]


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_W001_sqlite_without_wal():
    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/x.sqlite3", "OPTIONS": {"timeout": 5}}
    wal = {**sqlite, "OPTIONS": {"init_command": "PRAGMA journal_mode = WAL;"}}
    with override_settings(DATABASES={**DATABASES, "jobs": sqlite, "walled": wal}):
        with override_settings(TASKS=tasks_with({"DATABASE": "jobs"})):
            assert ids(checks.check_database_settings) == ["ox.W001"]
        with override_settings(TASKS=tasks_with({"DATABASE": "walled"})):
            assert ids(checks.check_database_settings) == []


def test_W002_prefetch_with_a_single_loss_allowed():
    with override_settings(TASKS=tasks_with({"PREFETCH": 10, "MAX_LOST": 1})):
        assert ids(checks.check_worker_policy) == ["ox.W002"]
    with override_settings(TASKS=tasks_with({"PREFETCH": 10, "MAX_LOST": 3, "MAX_ATTEMPTS": 1})):
        assert ids(checks.check_worker_policy) == []


def test_W003_heartbeat_too_close_to_lease():
    with override_settings(TASKS=tasks_with({"HEARTBEAT": 15, "LEASE": 30})):
        assert ids(checks.check_worker_policy) == ["ox.W003"]


def test_W004_short_metrics_token():
    with override_settings(OX_METRICS_TOKEN="short"):
        assert ids(checks.check_metrics_token) == ["ox.W004"]


def test_checks_are_registered_with_django():
    from django.core.checks.registry import registry

    registered = set(registry.get_checks())
    for check in (
        checks.check_options,
        checks.check_schedules,
        checks.check_database_settings,
        checks.check_worker_policy,
        checks.check_metrics_token,
    ):
        assert check in registered


# ---------------------------------------------------------------- through `manage.py check`
# Django's own check_tasks builds every backend first: a backend that raised on bad OPTIONS
# crashed `manage.py check` with a traceback before ox's checks could report anything.

ECHO = "tests.tasks.echo"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("options", "check_id"),
    [
        ({"LEASE": -1}, "ox.E001"),
        ({"BOGUS": 1}, "ox.E001"),
        ({"SCHEDULES": {"s": {"task": ECHO, "cron": "61 * * * *"}}}, "ox.E003"),
        ({"SCHEDULES": {"s": {"task": ECHO, "cron": "0 0 30 2 *"}}}, "ox.E003"),
        ({"SCHEDULES": {"s": {"task": ECHO, "every": 60, "missed": "all"}}}, "ox.E002"),
        ({"SCHEDULES": "not a dict"}, "ox.E002"),
    ],
)
def test_manage_py_check_reports_bad_options_instead_of_crashing(options, check_id):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    with override_settings(TASKS=tasks_with(options)):
        with pytest.raises(SystemCheckError) as raised:
            call_command("check")
    assert f"({check_id})" in str(raised.value)
    assert str(raised.value).count("(ox.") == 1  # reported once, under its own id


def test_a_backend_with_bad_options_raises_on_first_use_not_when_built():
    from django.core.exceptions import ImproperlyConfigured
    from django.tasks import task_backends

    with override_settings(TASKS=tasks_with({"LEASE": -1})):
        backend = task_backends["default"]  # built without raising (checks build it too)
        with pytest.raises(ImproperlyConfigured, match="LEASE must be a positive number"):
            backend.config  # noqa: B018


@pytest.mark.django_db(transaction=True)
def test_runworker_prints_the_check_and_refuses_to_start_with_bad_options(start_worker):
    import json

    from ox.models import Worker

    worker = start_worker("--batch", env={"OX_TEST_OPTIONS": json.dumps({"LEASE": -1})})
    assert worker.wait(timeout=60) != 0
    assert "(ox.E001)" in worker.output() and "LEASE must be a positive number" in worker.output()
    assert "Traceback" not in worker.output() and "worker started" not in worker.output()
    assert not Worker.objects.exists()
