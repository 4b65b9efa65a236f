"""A workflow's graph on the dashboard in a real browser: its boxes change colour as a real
worker runs the chain, without a page reload, and "Retry failed part" runs the failure again."""

import time

import pytest
from playwright.sync_api import expect

import ox
from ox.models import Status, Task
from tests import workflow_tasks as wt
from tests.browser.conftest import log_in, screenshot
from tests.helpers import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_graph_follows_the_workflow_and_retries_its_failed_part(page, operator, start_worker, tmp_path):
    marker = tmp_path / "fixed"
    run = ox.chain(
        # Running for more than two of the page's refreshes (every 2 s): a 1.5 s step could go
        # READY -> SUCCESSFUL between two of them, and the RUNNING box was never drawn.
        wt.slow_step.s(seconds=5),
        ox.group([wt.slow_step.s(seconds=1.5), wt.flaky.s(key="f", marker=str(marker))]),
        wt.echo_all.s(),
    ).enqueue(name="browser flow")
    log_in(page, "operator", f"/workflows/{run.id}/")
    page.evaluate("window.__noReload = true")
    graph = page.locator("#workflow-graph")
    expect(graph.locator('g[data-status="PENDING"]')).to_have_count(3)
    worker = start_worker("--concurrency", "2")
    first = graph.locator(f'g[data-task="{run.results[0].id}"]')
    expect(first).to_have_attribute("data-status", "RUNNING", timeout=20_000)
    expect(first).to_have_attribute("data-status", "SUCCESSFUL", timeout=20_000)
    flaky = graph.locator(f'g[data-task="{run.results[2].id}"]')
    expect(flaky).to_have_attribute("data-status", "FAILED", timeout=40_000)
    last = graph.locator(f'g[data-task="{run.last.id}"]')
    expect(last).to_have_attribute("data-status", "CANCELLED", timeout=20_000)
    assert page.evaluate("window.__noReload") is True, worker.output()[-2000:]
    screenshot(page, "workflow-graph")

    marker.touch()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not page.locator("#retry-failed-part").count():
        page.wait_for_timeout(200)  # offered once nothing runs or waits
    page.locator("#retry-failed-part").click()
    expect(page.locator("li.message-success")).to_contain_text("Retrying 2 tasks")
    wait_until(lambda: Task.objects.get(pk=run.last.id).status == Status.SUCCESSFUL, 40)
    expect(page.locator(f'#workflow-graph g[data-task="{run.last.id}"]')).to_have_attribute(
        "data-status", "SUCCESSFUL", timeout=20_000
    )
