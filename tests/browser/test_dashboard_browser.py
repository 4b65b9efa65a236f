"""The dashboard in a real browser, with a real worker draining the queue."""

import re
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.tasks import task_backends
from django.utils import timezone
from playwright.sync_api import expect

from ox.models import Status, Task
from ox.periodic import Ticker
from ox.schedules import parse_schedule
from tests import gated_tasks, tasks
from tests.browser import tasks as browser_tasks
from tests.browser.conftest import PASSWORD, log_in, screenshot
from tests.settings import TASKS
from tests.test_dashboard_support import make_task

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

XSS = "<script>window.__xss = 1</script>"


def tile(page, stat: str) -> int:
    return int(page.locator(f'.tiles [data-stat="{stat}"]').inner_text())


def test_login_then_overview_follows_a_worker_draining(page, operator, start_worker, tmp_path):
    # The tasks hold their slots until the page has shown the drain half done: the overview
    # polls every 2 s, and a drain of fixed sleeps can end between two polls on a busy machine.
    gate = tmp_path / "gate"
    for i in range(40):
        gated_tasks.hold.enqueue(f"d{i}", str(gate))
    log_in(page, "operator")
    expect(page).to_have_url(re.compile(r"^http://[^/]+/$"))
    expect(page.locator("h1")).to_have_text("Overview")
    assert tile(page, "ready") == 40
    # A marker a full page load would wipe: the numbers must change in place.
    page.evaluate("window.__noReload = true")

    worker = start_worker("--concurrency", "2")
    seen = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready = tile(page, "ready")
        seen.add(ready)
        if 0 < ready < 40:
            gate.touch()  # the page showed the worker part way (38 ready while 2 run): let it finish
        if tile(page, "finished_1h") == 40:
            break
        page.wait_for_timeout(200)
    assert tile(page, "finished_1h") == 40, worker.output()
    assert tile(page, "ready") == 0
    assert any(0 < n < 40 for n in seen), f"no intermediate value seen: {sorted(seen)}"
    assert page.evaluate("window.__noReload") is True
    expect(page.locator("#throughput-chart")).to_have_attribute("data-drawn", "true")  # no eval: CSP
    # The tiles change on the swap, the chart a moment later (htmx:afterSettle redraws it): the
    # poll that showed 40 finished may have been read before the chart took its numbers.
    drawn: list[int] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        drawn = page.evaluate("Chart.getChart(document.querySelector('#throughput-chart')).data.datasets[0].data")
        if sum(drawn) == 40:
            break
        page.wait_for_timeout(100)
    assert sum(drawn) == 40, drawn
    screenshot(page, "overview")

    page.click("nav >> text=Workers")
    expect(page.locator("#workers-live tbody tr.worker-live")).to_have_count(1)
    expect(page.locator("#workers-live")).to_contain_text(str(worker.pid))
    screenshot(page, "workers")


def test_failed_task_tracebacks_then_retry_succeeds(page, operator, start_worker):
    result = browser_tasks.flaky.enqueue("flaky-1", XSS)
    worker = start_worker("--concurrency", "1")
    deadline = time.monotonic() + 30
    while Task.objects.get(pk=result.id).status != Status.FAILED:
        assert time.monotonic() < deadline, worker.output()
        time.sleep(0.1)

    log_in(page, "operator", f"/tasks/{result.id}/")
    expect(page.locator("#task-status")).to_have_text("failed")
    for number in (1, 2):
        attempt = page.locator(f"#attempt-{number}")
        attempt.locator("summary").click()
        traceback = attempt.locator("pre.traceback")
        expect(traceback).to_be_visible()
        expect(traceback).to_contain_text(f"RuntimeError: run {number} fails: {XSS}")
    # Arguments and exception messages holding markup are text, never executed.
    expect(page.locator("#task-args")).to_contain_text(XSS)
    assert page.evaluate("window.__xss") is None
    screenshot(page, "task-failed")

    page.click("#retry-button")
    expect(page.locator(".message-success")).to_have_text("1 retried")
    # The detail page refreshes itself until the task is finished.
    expect(page.locator("#task-status")).to_have_text("successful", timeout=30_000)
    expect(page.locator("#task-return")).to_contain_text("succeeded on run 3")
    expect(page.locator("details.attempt")).to_have_count(3)
    assert page.evaluate("window.__xss") is None
    screenshot(page, "task-detail")


def test_cancel_a_running_task(page, operator, start_worker):
    result = tasks.busy_for.enqueue(60)
    worker = start_worker("--concurrency", "1")
    log_in(page, "operator", "/running/")
    row = page.locator("#running-live tbody tr", has_text=result.id[-12:])
    expect(row).to_be_visible(timeout=20_000)
    expect(row).to_contain_text(Task.objects.get(pk=result.id).worker_id)
    screenshot(page, "running")
    row.locator("button", has_text="Cancel").click()
    expect(page.locator(".message-success")).to_have_text("1 running asked to cancel")
    task = Task.objects.get(pk=result.id)
    assert task.cancel_requested

    page.goto(f"/tasks/{result.id}/")
    # The worker interrupts it at its next heartbeat; the detail page polls every 2 s. Ten
    # heartbeats (30 s at the default 3 s) leave a busy machine room, and the 60 s body would
    # still be running well past that if the cancel were never seen.
    heartbeat = task_backends["default"].config.heartbeat
    status = expect(page.locator("#task-status"), "the worker did not interrupt the task: " + worker.output()[-2000:])
    status.to_have_text("cancelled", timeout=10 * heartbeat * 1000)
    expect(page.locator("#attempt-1")).to_contain_text("cancelled")


def test_bulk_retry_from_a_filtered_list(page, operator, start_worker):
    emails = [make_task(Status.FAILED, queue="emails", path="tests.tasks.noop", max_attempts=1) for _ in range(3)]
    others = [make_task(Status.FAILED, queue="default", path="tests.tasks.noop", max_attempts=1) for _ in range(2)]
    log_in(page, "operator", "/tasks/")
    page.fill('input[name="queue"]', "emails")
    page.select_option('select[name="status"]', "FAILED")
    page.click('button:has-text("Filter")')
    expect(page).to_have_url(re.compile(r"queue=emails"))
    rows = page.locator("#task-table tbody tr")
    expect(rows).to_have_count(3)
    screenshot(page, "tasks")

    # Two selected rows, retried in bulk.
    page.locator('#task-table input[name="ids"]').nth(0).check()
    page.locator('#task-table input[name="ids"]').nth(1).check()
    page.click('button:has-text("Retry selected")')
    expect(page.locator(".message-success")).to_have_text("2 retried")
    assert Task.objects.filter(queue="emails", status=Status.READY).count() == 2

    # The rest: "retry all matching", which shows the count before it acts.
    page.click("text=Retry all matching…")
    expect(page.locator("#matching-count")).to_have_text("1")
    screenshot(page, "retry-matching")
    page.click('button:has-text("Retry 1 task")')
    expect(page.locator(".message-success")).to_have_text("1 retried")

    start_worker("--concurrency", "2")
    page.goto("/tasks/?queue=emails")
    expect(page.locator("#task-table .badge-ok")).to_have_count(3, timeout=20_000)
    for task in others:
        task.refresh_from_db()
        assert task.status == Status.FAILED
    assert {t.status for t in Task.objects.filter(pk__in=[t.pk for t in emails])} == {Status.SUCCESSFUL}


def test_health_page_flags_a_missed_schedule_then_refreshes_it(page, operator, settings):
    now = timezone.now()
    beat = {"task": "tests.tasks.echo", "every": 60, "args": ["hi"]}
    # Hourly, half an hour away from now: its due tick is always about 30 min old.
    report = {"task": "tests.tasks.echo", "cron": f"{(now.minute + 30) % 60} * * * *", "queue": "reports"}
    options = {**TASKS["default"]["OPTIONS"], "SCHEDULES": {"beat": beat, "hourly-report": report}}
    settings.TASKS = {"default": {**TASKS["default"], "OPTIONS": options}}
    ticker = Ticker(task_backends["default"], [])
    beat, report = parse_schedule("beat", beat), parse_schedule("hourly-report", report)
    ticker.fire(connection, beat, beat.latest_tick(now), now)
    ticker.fire(connection, report, report.latest_tick(now) - timedelta(hours=3), now - timedelta(hours=3))

    log_in(page, "operator", "/health/")
    expect(page.locator("h1")).to_have_text("Health")
    missed = page.locator('#health-schedules tr[data-schedule="hourly-report"] .badge-failed')
    expect(missed).to_have_text("missed")
    expect(page.locator('#health-schedules tr[data-schedule="beat"] .badge-ok')).to_have_text("on time")
    table = page.locator("#health-table")
    expect(table).to_contain_text(
        {"postgresql": "dead tuples", "mysql": "History list length"}.get(connection.vendor, "this database is SQLite")
    )
    screenshot(page, "health")

    # A worker catches up: the schedules section refreshes in place, without a page load.
    page.evaluate("window.__noReload = true")
    ticker.fire(connection, report, report.latest_tick(timezone.now()), timezone.now())
    expect(missed).to_have_count(0, timeout=10_000)
    expect(page.locator('#health-schedules tr[data-schedule="hourly-report"] .badge-ok')).to_have_text("on time")
    assert page.evaluate("window.__noReload") is True


def test_non_staff_is_refused(page, transactional_db):
    User.objects.create_user("visitor", password=PASSWORD)
    page.goto("/tasks/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/tasks/"))
    screenshot(page, "login")
    log_in(page, "visitor", "/tasks/")
    response = page.goto("/tasks/")
    assert response.status == 403
    response = page.goto("/admin/ox/task/")
    assert "/admin/login/" in page.url
