"""ox_health: thresholds from OPTIONS or flags, exit codes through call_command and a real
subprocess, JSON output."""

import json
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from ox.health import STALE_FORGET, Thresholds, check_health, queue_counts
from ox.models import Status, Task, Worker
from tests import tasks
from tests.conftest import ROOT
from tests.settings import TASKS

pytestmark = pytest.mark.django_db


def health(*args):
    out = StringIO()
    try:
        call_command("ox_health", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), str(exc)
    return 0, out.getvalue(), ""


def worker(name, silent_for, stopped=False):
    now = timezone.now()
    Worker.objects.create(
        id=name,
        host="h",
        pid=1,
        started_at=now - timedelta(hours=2),
        heartbeat_at=now - silent_for,
        stopped_at=now if stopped else None,
    )


def test_empty_queue_is_healthy():
    code, out, _ = health()
    assert code == 0 and out.strip().endswith("healthy")


def test_backlog_threshold_from_flag():
    for i in range(3):
        tasks.echo.enqueue(i)
    tasks.echo.using(run_after=timedelta(hours=1)).enqueue("later")  # scheduled, not backlog
    assert health("--max-backlog", "3")[0] == 0
    code, _, message = health("--max-backlog", "2")
    assert code == 1 and "backlog: 3 due tasks" in message


@override_settings(TASKS={"default": {**TASKS["default"], "OPTIONS": {"HEALTH_MAX_READY_AGE": 60}}})
def test_oldest_ready_age_threshold_from_options_and_flag_overrides_it():
    tasks.echo.enqueue(1)
    Task.objects.update(run_after=timezone.now() - timedelta(seconds=120))
    code, _, message = health()
    assert code == 1 and "oldest ready task has waited" in message
    assert health("--max-ready-age", "600")[0] == 0


def test_stale_and_alive_workers():
    worker("alive", timedelta(seconds=1))
    worker("stale", timedelta(seconds=120))
    worker("gone", STALE_FORGET + timedelta(minutes=1))  # silent for too long: not counted
    worker("stopped", timedelta(seconds=500), stopped=True)
    code, out, message = health()
    assert code == 1 and "1 stale workers" in message and "workers: 1 alive, 1 stale" in out
    assert health("--max-stale-workers", "1")[0] == 0
    assert health("--max-stale-workers", "1", "--stale-after", "600")[0] == 0
    code, _, message = health("--max-stale-workers", "1", "--min-workers", "2")
    assert code == 1 and "1 workers alive (min 2)" in message


def test_json_report():
    tasks.echo.enqueue(1)
    tasks.other_queue.enqueue()
    code, out, _ = health("--json", "--max-backlog", "1")
    report = json.loads(out)
    assert code == 1 and report["healthy"] is False and report["backlog"] == 2
    by_queue = {q["queue"]: q for q in report["queues"]}
    assert by_queue["default"]["ready"] == 1 and by_queue["other"]["ready"] == 1
    assert by_queue["emails"]["ready"] == 0  # every configured queue is listed
    assert report["thresholds"]["max_backlog"] == 1
    assert (report["table"] is None) == (_vendor() not in ("postgresql", "mysql"))


def _vendor():
    from django.db import connection

    return connection.vendor


def test_check_health_counts_running_and_scheduled():
    tasks.echo.enqueue(1)
    tasks.echo.using(run_after=timedelta(minutes=5)).enqueue(2)
    r = tasks.echo.enqueue(3)
    Task.objects.filter(pk=r.id).update(status=Status.RUNNING)
    h = check_health(Thresholds(), queues=["default"])
    assert [(q.queue, q.ready, q.scheduled, q.running) for q in h.queues] == [("default", 1, 1, 1)]
    assert h.healthy


@pytest.mark.django_db(transaction=True)
def test_exit_codes_from_a_real_subprocess(worker_env):
    def run(*args, env=worker_env):
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "ox_health", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert run().returncode == 0
    tasks.echo.enqueue(1)
    tasks.echo.enqueue(2)
    done = run("--max-backlog", "1")
    assert done.returncode == 1 and "backlog: 2 due tasks" in done.stderr
    assert json.loads(run("--json").stdout)["backlog"] == 2
    unreachable = {**worker_env, "DATABASE_URL": "postgres://postgres@127.0.0.1:1/none"}
    down = run(env=unreachable)
    assert down.returncode == 2 and "cannot read the database" in down.stderr


def test_queue_counts_stop_at_the_cap_and_oldest_stays_exact():
    now = timezone.now()
    for minutes in (5, 3, 1):
        tasks.echo.using(run_after=now - timedelta(minutes=minutes)).enqueue(minutes)
        tasks.echo.using(run_after=now + timedelta(minutes=minutes)).enqueue(minutes)
    [capped] = queue_counts(now, cap=2)
    assert (capped.ready, capped.ready_capped, capped.scheduled, capped.scheduled_capped) == (2, True, 2, True)
    assert capped.oldest_ready_age == pytest.approx(300, abs=1)
    [exact] = queue_counts(now, cap=3)
    assert (exact.ready, exact.ready_capped, exact.scheduled, exact.scheduled_capped) == (3, False, 3, False)


def test_a_capped_backlog_is_over_the_threshold(monkeypatch):
    monkeypatch.setattr("ox.health.COUNT_CAP", 2)
    for i in range(3):
        tasks.echo.enqueue(i)
    h = check_health(Thresholds(max_backlog=2))
    assert (h.backlog, h.backlog_capped) == (2, True)
    assert h.problems == ["backlog: more than 2 due tasks waiting (max 2)"]
    # The count goes as far as the threshold: a threshold over the cap is still compared exactly.
    h = check_health(Thresholds(max_backlog=3))
    assert (h.backlog, h.backlog_capped, h.problems) == (3, False, [])


def test_the_text_report_marks_a_count_that_stopped_at_the_cap(monkeypatch):
    monkeypatch.setattr("ox.health.COUNT_CAP", 2)
    now = timezone.now()
    for i in range(3):
        tasks.echo.enqueue(i)
        tasks.echo.using(run_after=now + timedelta(minutes=5)).enqueue(i)
    # Counts go up to the cap or the threshold, whichever is higher: a threshold of 1 keeps the cap.
    _code, out, _err = health("--max-backlog", "1")
    assert "default: 2+ ready, 2+ scheduled, 0 running" in out
    monkeypatch.setattr("ox.health.COUNT_CAP", 10)
    _code, out, _err = health("--max-backlog", "1")
    assert "default: 3 ready, 3 scheduled, 0 running" in out
