"""The dashboard's workflow pages (dashboard/views/workflows.py, dashboard/graph.py): the list,
a workflow drawn as a graph whose query count does not grow with its size, the link from a
task, and the retry of the failed part (ox.change_task only, POST only)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import ox
from dashboard.graph import COLUMN_CAP
from ox.models import Status, Task
from tests import workflow_tasks as wt
from tests.test_dashboard_support import operator_fixture, staff_fixture  # noqa: F401

pytestmark = pytest.mark.django_db


def group_of(n: int):
    return ox.group([wt.add.s(i, 0) for i in range(n)]).then(wt.total.s()).enqueue(name=f"group of {n}")


def test_the_list_counts_each_workflows_tasks_by_status(client, staff):
    run = group_of(3)
    Task.objects.filter(pk=run.results[0].id).update(status=Status.FAILED)
    page = client.get(reverse("dashboard:workflows")).content.decode()
    assert "group of 3" in page and f"/workflows/{run.id}/" in page
    assert 'badge-failed">failed</span> 1' in page and 'badge-ready">ready</span> 2' in page
    assert 'badge-pending">pending</span> 1' in page


def test_the_graph_draws_every_task_with_its_status_and_links_to_it(client, staff):
    run = ox.chain(wt.add.s(1, 1), ox.group([wt.add.s(1), wt.add.s(2)]), wt.total.s()).enqueue()
    Task.objects.filter(pk=run.results[0].id).update(status=Status.SUCCESSFUL)
    page = client.get(reverse("dashboard:workflow", args=[run.id])).content.decode()
    for result in run.results:
        assert f'data-task="{result.id}"' in page and f"/tasks/{result.id}/" in page
    assert page.count('data-status="SUCCESSFUL"') == 1 and page.count('data-status="PENDING"') == 3
    assert page.count("<line ") == 4  # first -> both members, both members -> total
    # Live while something waits: the partial polls.
    assert 'hx-trigger="every 2s"' in page


def test_a_thousand_member_group_draws_a_bounded_picture_in_as_many_queries(client, staff):
    small, big = group_of(3), group_of(1000)
    counts = []
    for run in (small, big):
        with CaptureQueriesContext(connection) as queries:
            page = client.get(reverse("dashboard:workflow", args=[run.id])).content.decode()
        counts.append(len(queries))
    assert counts[0] == counts[1], counts
    assert page.count("<g class=") == COLUMN_CAP + 1 + 1  # the shown members, "+976 more", the callback
    assert "+976 more" in page


def test_a_task_links_to_its_workflow_and_says_what_it_waits_for(client, staff):
    run = group_of(2)
    page = client.get(reverse("dashboard:task", args=[run.last.id])).content.decode()
    assert f'href="/workflows/{run.id}/"' in page.replace(reverse("dashboard:workflows"), "/workflows/")
    assert "waits for 2 tasks before it" in page


def test_retry_of_the_failed_part_needs_change_permission_and_post(client, staff):
    run = ox.chain(wt.add.s(1, 1), wt.add.s(1)).enqueue()
    operations_cancel = ox.cancel
    operations_cancel([run.results[0].id])
    url = reverse("dashboard:retry_workflow", args=[run.id])
    assert client.post(url).status_code == 403  # staff without ox.change_task
    page = client.get(reverse("dashboard:workflow", args=[run.id])).content.decode()
    assert "retry-failed-part" not in page


def test_retry_of_the_failed_part_by_an_operator(client, operator):
    run = ox.chain(wt.add.s(1, 1), wt.add.s(1)).enqueue()
    ox.cancel([run.results[0].id])
    assert [Task.objects.get(pk=r.id).status for r in run.results] == [Status.CANCELLED, Status.CANCELLED]
    page = client.get(reverse("dashboard:workflow", args=[run.id])).content.decode()
    assert 'id="retry-failed-part"' in page
    url = reverse("dashboard:retry_workflow", args=[run.id])
    assert client.get(url).status_code == 405
    response = client.post(url, follow=True)
    assert "Retrying 2 tasks" in response.content.decode()
    assert [Task.objects.get(pk=r.id).status for r in run.results] == [Status.READY, Status.PENDING]
