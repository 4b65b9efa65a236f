"""/ox/metrics: bearer token or staff login, Prometheus text format 0.0.4, real counts."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.test import override_settings
from django.utils import timezone

from ox.metrics import WINDOW, render_metrics
from ox.models import Attempt, Outcome, Status, Task
from tests import tasks

pytestmark = pytest.mark.django_db

TOKEN = "a-metrics-token-long-enough"
URL = "/ox/metrics"
SAMPLE = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"]*",?)+\})? -?[0-9.e+]+$')


def parse(text):
    """{(name, frozenset(labels)): value}, checking every line's shape on the way."""
    samples, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in {"gauge", "counter"}
            typed.add(name)
            continue
        assert SAMPLE.match(line), line
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        assert name in typed, f"{name} has no # TYPE line before it"
        pairs = frozenset(tuple(p.split("=", 1)) for p in labels.rstrip("}").split(",") if p)
        samples[(name, frozenset((k, v.strip('"')) for k, v in pairs))] = float(value)
    return samples


@override_settings(OX_METRICS_TOKEN=TOKEN)
def test_no_credentials_is_401_with_a_bearer_challenge(client):
    response = client.get(URL)
    assert response.status_code == 401 and response["WWW-Authenticate"].startswith("Bearer")


@override_settings(OX_METRICS_TOKEN=TOKEN)
def test_wrong_token_is_401_and_right_token_is_200(client):
    assert client.get(URL, headers={"Authorization": "Bearer nope"}).status_code == 401
    response = client.get(URL, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"


@override_settings(OX_METRICS_TOKEN="")
def test_no_token_configured_means_no_token_works(client):
    assert client.get(URL, headers={"Authorization": "Bearer "}).status_code == 401


def test_staff_login_with_view_task_works_and_others_are_403(client):
    user = User.objects.create_user("someone", password="pw-long-enough")
    client.force_login(user)
    assert client.get(URL).status_code == 403
    user.is_staff = True
    user.save()
    assert client.get(URL).status_code == 403  # staff, but may not view tasks (as in the admin)
    user.user_permissions.add(Permission.objects.get(codename="view_task", content_type__app_label="ox"))
    user = User.objects.get(pk=user.pk)  # a fresh object: permissions are cached per instance
    client.force_login(user)
    assert client.get(URL).status_code == 200
    user.is_active = False
    user.save()
    assert client.get(URL).status_code == 401  # an inactive account's session no longer counts


def test_post_is_refused(admin_client):
    assert admin_client.post(URL).status_code == 405


def test_format_and_values(admin_client):
    # The numbers are read at one fixed `now` (render_metrics takes the clock): ages and the
    # recent windows are then exact instead of "about 90 s, give or take the machine's speed".
    now = timezone.now()
    tasks.echo.enqueue(1)
    tasks.echo.enqueue(2)
    tasks.other_queue.using(run_after=timedelta(hours=1)).enqueue()
    Task.objects.filter(queue="default").update(run_after=now - timedelta(seconds=90))
    done = tasks.echo.enqueue(3)
    Task.objects.filter(pk=done.id).update(status=Status.SUCCESSFUL, finished_at=now)
    failed = tasks.echo.enqueue(4)
    Task.objects.filter(pk=failed.id).update(status=Status.FAILED, finished_at=now)
    row = Task.objects.get(pk=failed.id)
    Attempt.objects.create(task=row, number=1, finished_at=now - WINDOW, outcome=Outcome.TIMED_OUT)  # the edge: in
    Attempt.objects.create(
        task=row, number=0, finished_at=now - WINDOW - timedelta(seconds=1), outcome=Outcome.FAILED
    )  # outside the window
    text = render_metrics(now=now)
    samples = parse(text)

    def value(name, **labels):
        return samples[(name, frozenset(labels.items()))]

    assert value("ox_tasks", queue="default", status="READY") == 2
    assert value("ox_tasks", queue="other", status="SCHEDULED") == 1
    assert value("ox_tasks", queue="emails", status="RUNNING") == 0
    assert value("ox_oldest_ready_age_seconds", queue="default") == 90
    assert value("ox_tasks_capped", queue="default", status="READY") == 0
    assert value("ox_tasks_finished_recent", queue="default", status="SUCCESSFUL") == 1
    assert value("ox_tasks_finished_recent", queue="default", status="FAILED") == 1
    assert value("ox_attempts_failed_recent", outcome="timed_out") == 1
    assert value("ox_attempts_failed_recent", outcome="failed") == 0
    assert value("ox_workers", state="alive") == 0
    assert "# HELP ox_tasks " in text and "# TYPE ox_tasks gauge" in text
    assert text.endswith("\n")
    # The view serves the same families and series, read at the wall clock.
    served = admin_client.get(URL).content.decode()
    assert parse(served).keys() == samples.keys()
    assert served.endswith("\n")


@override_settings(
    TASKS={
        "default": {
            "BACKEND": "ox.backend.OxBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"SCHEDULES": {"beat": {"task": "tests.tasks.noop", "every": 60}}},
        }
    }
)
def test_schedules_are_exported(admin_client):
    # At a fixed now the next tick is exact; the wall clock could sit a millisecond before a
    # tick, which is in the past by the time the test reads the clock again.
    now = datetime(2026, 3, 10, 12, 0, 30, tzinfo=UTC)
    samples = parse(render_metrics(now=now))
    next_tick = samples[("ox_schedule_next_tick_timestamp_seconds", frozenset({("schedule", "beat")}))]
    assert next_tick == datetime(2026, 3, 10, 12, 1, tzinfo=UTC).timestamp()
    assert samples[("ox_schedule_missed", frozenset({("schedule", "beat")}))] == 0
    assert samples[("ox_schedule_last_tick_timestamp_seconds", frozenset({("schedule", "beat")}))] == 0  # none yet
    served = parse(admin_client.get(URL).content.decode())
    assert ("ox_schedule_next_tick_timestamp_seconds", frozenset({("schedule", "beat")})) in served


def test_label_values_are_escaped():
    from ox.metrics import _family

    lines = _family("m", "gauge", "help", [({"queue": 'a"b\\c\nd'}, 1)])
    assert lines[-1] == 'm{queue="a\\"b\\\\c\\nd"} 1'


def test_backlog_counts_stop_at_the_cap(monkeypatch):
    monkeypatch.setattr("ox.health.COUNT_CAP", 2)
    for i in range(3):
        tasks.echo.enqueue(i)
    samples = parse(render_metrics())
    assert samples[("ox_tasks", frozenset({"queue": "default", "status": "READY"}.items()))] == 2
    assert samples[("ox_tasks_capped", frozenset({"queue": "default", "status": "READY"}.items()))] == 1
    assert samples[("ox_tasks_capped", frozenset({"queue": "default", "status": "SCHEDULED"}.items()))] == 0
