"""Every dashboard and admin page in Chromium under the Content-Security-Policy the server
sends: htmx polls, Chart.js draws, the task list's poll pauses while rows are selected, admin
tracebacks keep their style, and the browser reports no violation. The listener is shown to
work: an inline script injected at the end is blocked and reported."""

import json
import time

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone
from playwright.sync_api import expect

from ox.models import Attempt, Outcome, Status
from tests.browser.conftest import log_in
from tests.test_dashboard_support import make_task

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Runs in every document before its own scripts (Playwright injects it; it is not page content).
COLLECT = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + e.sourceFile + ":" + e.lineNumber);
});
"""


@pytest.fixture
def watched(page):
    page.context.add_init_script(COLLECT)
    console = []
    page.on("console", lambda m: console.append(m.text) if "Content Security Policy" in m.text else None)
    return page, console


def violations(page) -> list[str]:
    return page.evaluate("window.__csp || []")


def polls(page, path: str, seconds: float) -> int:
    """htmx requests to `path` seen over `seconds`."""
    seen = []

    def record(request):
        if request.headers.get("hx-request") == "true" and request.url.split("?")[0].endswith(path):
            seen.append(request.url)

    page.on("request", record)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        page.wait_for_timeout(200)
    page.remove_listener("request", record)
    return len(seen)


def test_pages_work_under_the_policy_with_no_violation(watched, operator, settings, tmp_path):
    page, console = watched
    # The admin shows attempts inline to those who may view attempts.
    operator.user_permissions.add(Permission.objects.get(codename="view_attempt", content_type__app_label="ox"))
    failed = make_task(Status.FAILED, queue="emails")
    Attempt.objects.create(
        task=failed,
        number=1,
        finished_at=timezone.now(),
        outcome=Outcome.FAILED,
        exception_class_path="builtins.RuntimeError",
        traceback="Traceback (most recent call last):\n  " + "x" * 400 + "\nRuntimeError: boom",
    )
    make_task(Status.RUNNING)
    settings.OX_BENCH_RESULTS_DIR = tmp_path
    run = {
        "started_at": "2026-11-20T10:00:00+00:00",
        "cells": [{"name": "drain", "metric": "throughput", "unit": "tasks/s", "arms": {"ox": {"value": 900.0}}}],
    }
    (tmp_path / "run.json").write_text(json.dumps(run))
    seen = {}

    log_in(page, "operator")
    expect(page.locator("h1")).to_have_text("Overview")
    with page.expect_request(lambda r: r.headers.get("hx-request") == "true", timeout=10_000):
        pass  # the overview polls every 2 s: htmx runs
    expect(page.locator("#throughput-chart")).to_have_attribute("data-drawn", "true")  # no eval: CSP
    seen["/"] = violations(page)

    page.goto("/tasks/")
    rows = page.locator('#task-table input[name="ids"]')
    expect(rows).to_have_count(2)
    # The poll (every 5 s) pauses while a row is selected, without an hx-trigger filter (eval).
    rows.nth(0).check()
    assert polls(page, "/tasks/", 6.5) == 0
    rows.nth(0).uncheck()
    assert polls(page, "/tasks/", 6.5) >= 1
    seen["/tasks/"] = violations(page)

    for path, ready in [
        (f"/tasks/{failed.pk}/", "#attempt-1"),
        ("/running/", "#running-live"),
        ("/workers/", "#workers-live"),
        ("/health/", "#health-table"),
        ("/tasks/retry-matching/?queue=emails", "#matching-count"),
    ]:
        page.goto(path)
        expect(page.locator(ready)).to_be_visible()
        seen[path] = violations(page)
    page.goto("/running/")
    with page.expect_request(lambda r: r.headers.get("hx-request") == "true", timeout=10_000):
        pass
    seen["/running/ poll"] = violations(page)

    page.goto("/benchmarks/")
    expect(page.locator("#bench-chart-0")).to_have_attribute("data-drawn", "true")  # no eval: CSP
    seen["/benchmarks/"] = violations(page)

    for path in ("/admin/", "/admin/ox/task/", "/admin/ox/task/?status__exact=FAILED"):
        page.goto(path)
        expect(page.locator("#content")).to_be_visible()
        seen[path] = violations(page)
    page.goto(f"/admin/ox/task/{failed.pk}/change/")
    traceback = page.locator("pre.ox-traceback")
    expect(traceback).to_contain_text("RuntimeError: boom")
    # Styled from ox/admin.css (a class): the inline style attribute it had would be blocked.
    assert traceback.evaluate("e => getComputedStyle(e).whiteSpace") == "pre-wrap"
    seen["admin change"] = violations(page)

    assert all(not v for v in seen.values()), seen
    assert console == [], console

    # The listener sees what the policy blocks: an inline script is refused and reported.
    page.evaluate(
        "() => { const s = document.createElement('script'); s.textContent = 'window.__ran = 1';"
        " document.body.appendChild(s); }"
    )
    page.wait_for_function("window.__csp.length > 0")
    assert page.evaluate("window.__ran") is None
    assert any(v.startswith("script-src") for v in violations(page)), violations(page)
