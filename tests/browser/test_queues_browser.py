"""The Queues page in a real browser with a real worker: the settings' concurrency limit fills
up, a pause from the page holds the rest back (and the task page says so), an override and a
resume from the page let them run, all under the Content-Security-Policy."""

import time

import pytest
from playwright.sync_api import expect

from ox.models import QueueState, Status, Task
from tests import gated_tasks
from tests.browser.conftest import log_in, screenshot
from tests.browser.test_csp_browser import COLLECT, violations
from tests.settings import TASKS
from tests.test_durability import options
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LIMITS = {"emails": {"concurrency": 3}}


def test_pause_override_and_resume_from_the_queues_page(page, operator, settings, start_worker, tmp_path):
    # The page (this process) and the worker (a subprocess) read the same LIMITS.
    settings.TASKS = {"default": {**TASKS["default"], "OPTIONS": {**TASKS["default"]["OPTIONS"], "LIMITS": LIMITS}}}
    page.context.add_init_script(COLLECT)
    gate = tmp_path / "gate"
    results = [gated_tasks.hold.using(queue_name="emails").enqueue(f"q{i}", str(gate)) for i in range(5)]
    worker = start_worker("--queues", "emails", "--concurrency", "5", env=options(limits=LIMITS, heartbeat=0.5))

    log_in(page, "operator", "/queues/")
    expect(page.locator("h1")).to_have_text("Queues")
    expect(page.locator("nav a[aria-current=page]")).to_have_text("Queues")
    emails = page.locator('#queue-flows tr[data-queue="emails"]')
    expect(emails.locator('[data-limit="concurrency"]')).to_have_text("concurrency 3 settings")
    # The table polls: the worker fills the limit while the page is open.
    expect(emails.locator('[data-stat="running"]'), worker.output).to_have_text("3/3", timeout=30_000)
    expect(emails.locator('[data-stat="waiting_on_limit"]')).to_have_text("2")
    expect(emails.locator('[data-stat="reasons"]')).to_contain_text("at its concurrency limit (3 of 3 running)")

    emails.locator('button[data-action="pause"]').click()
    expect(page.locator(".message-success")).to_have_text("emails: paused")
    emails = page.locator('#queue-flows tr[data-queue="emails"]')
    expect(emails.locator('[data-stat="state"] .badge')).to_have_text("paused")
    expect(emails.locator('button[data-action="resume"]')).to_be_visible()
    expect(emails.locator('[data-stat="reasons"]')).to_contain_text("paused")
    state = QueueState.objects.get(name="emails")
    assert state.paused and state.updated_by == "operator"
    screenshot(page, "queues")

    # The three running finish; the paused queue starts none of the other two.
    gate.touch()
    page.evaluate("window.__noReload = true")
    expect(emails.locator('[data-stat="running"]')).to_have_text("0/3", timeout=20_000)
    expect(emails.locator('[data-stat="waiting_on_limit"]')).to_have_text("2")
    assert page.evaluate("window.__noReload") is True  # updated in place by the poll
    time.sleep(1.5)  # a worker polls every second even without a NOTIFY
    assert Ledger.objects.count() == 3
    waiting = Task.objects.filter(queue="emails", status=Status.READY).first()

    page.goto(f"/tasks/{waiting.pk}/")
    expect(page.locator("#task-waiting")).to_contain_text("queue 'emails' is paused")

    page.goto("/")
    expect(page.locator('#queues tr[data-queue="emails"] [data-stat="flow"]')).to_contain_text("paused")
    expect(page.locator('#queues tr[data-queue="emails"] [data-stat="flow"]')).to_contain_text("0/3 running")

    # A bad override is refused with its error, and changes nothing.
    page.goto("/queues/")
    form = page.locator('form.limit-form[data-queue="emails"]')
    form.locator('input[name="rate"]').fill("fast")
    form.locator('button:has-text("Save limits")').click()
    form = page.locator('form.limit-form[data-queue="emails"]')
    expect(form.locator(".errors")).to_contain_text("not a rate: 'fast'")
    assert QueueState.objects.get(name="emails").overrides == {}

    form.locator('input[name="rate"]').fill("")
    form.locator('input[name="concurrency"]').fill("4")
    form.locator('button:has-text("Save limits")').click()
    expect(page.locator(".message-success")).to_have_text("emails: limits now 4 at a time")
    emails = page.locator('#queue-flows tr[data-queue="emails"]')
    expect(emails.locator('[data-limit="concurrency"]')).to_have_text("concurrency 4 override, settings 3")
    assert QueueState.objects.get(name="emails").overrides == {"concurrency": 4}

    emails.locator('button[data-action="resume"]').click()
    expect(page.locator(".message-success")).to_have_text("emails: resumed")
    deadline = time.monotonic() + 30
    while Task.objects.filter(pk__in=[r.id for r in results], status=Status.SUCCESSFUL).count() < 5:
        assert time.monotonic() < deadline, worker.output()
        time.sleep(0.1)
    emails = page.locator('#queue-flows tr[data-queue="emails"]')
    expect(emails.locator('[data-stat="state"] .badge')).to_have_text("running")
    expect(emails.locator('[data-stat="due"]')).to_have_text("0")
    assert violations(page) == []
