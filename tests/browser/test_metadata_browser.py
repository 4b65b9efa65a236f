"""A task's progress (ox.metadata) on the dashboard in a real browser, moving while a real
worker runs the task, without a page reload."""

import time

import pytest
from playwright.sync_api import expect

from tests import metadata_tasks
from tests.browser.conftest import log_in, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_progress_bar_moves_on_the_task_page_and_the_running_page(page, operator, start_worker):
    result = metadata_tasks.progress.using(metadata={"stage": "exporting"}).enqueue(40, 0.2)  # 8 s
    log_in(page, "operator", f"/tasks/{result.id}/")
    page.evaluate("window.__noReload = true")  # a full page load would wipe it
    worker = start_worker("--concurrency", "1")
    bar = page.locator("#task-metadata progress")
    seen: set[float] = set()
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not any(0 < v < 1 for v in seen):
        if bar.count():
            seen.add(float(bar.get_attribute("value")))
        page.wait_for_timeout(200)
    assert any(0 < v < 1 for v in seen), (sorted(seen), worker.output())
    expect(page.locator("#task-metadata")).to_contain_text("exporting")
    assert page.evaluate("window.__noReload") is True
    screenshot(page, "task-progress")

    page.goto(page.url.split("/tasks/")[0] + "/running/")
    expect(page.locator("#running-live progress")).to_have_count(1, timeout=10_000)
    page.goto(page.url.split("/running/")[0] + f"/tasks/{result.id}/")
    expect(page.locator("#task-metadata .progress-figure")).to_have_text("100 %", timeout=30_000)
