"""The dashboard through Django's test client: access, every page and partial, filters."""

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from dashboard.views.workers import workers
from ox import stats
from ox.models import Attempt, Outcome, Status, Task, Worker
from tests.test_dashboard_support import make_task, operator_fixture, render_at, staff_fixture  # noqa: F401

pytestmark = pytest.mark.django_db

PAGES = [
    "dashboard:overview",
    "dashboard:tasks",
    "dashboard:running",
    "dashboard:workers",
    "dashboard:benchmarks",
    "dashboard:workflows",
]


@pytest.mark.parametrize("name", PAGES)
def test_anonymous_is_sent_to_login(client, name):
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("name", PAGES)
def test_anonymous_poll_redirects_the_whole_page(client, name):
    response = client.get(reverse(name), headers={"HX-Request": "true", "HX-Current-URL": "http://testserver/"})
    assert response.status_code == 200
    assert response["HX-Redirect"].startswith(reverse("login"))


@pytest.mark.parametrize("name", PAGES)
def test_non_staff_is_refused(client, name):
    client.force_login(User.objects.create_user("plain", password="pw"))
    assert client.get(reverse(name)).status_code == 403


def test_task_detail_refuses_non_staff(client):
    task = make_task()
    client.force_login(User.objects.create_user("plain", password="pw"))
    assert client.get(reverse("dashboard:task", args=[task.pk])).status_code == 403


@pytest.mark.parametrize("name", PAGES)
def test_pages_and_partials_render_for_staff(client, staff, name):
    make_task()
    make_task(Status.FAILED)
    make_task(Status.RUNNING)
    page = client.get(reverse(name))
    assert page.status_code == 200
    assert b"<html" in page.content and b"htmx-2.0.11.min.js" in page.content
    assert b'hx-headers=\'{"X-CSRFToken": "' in page.content
    partial = client.get(reverse(name), headers={"HX-Request": "true"})
    assert partial.status_code == 200
    assert b"<html" not in partial.content
    for response in (page, partial):
        assert "HX-Request" in response["Vary"]
        assert "no-cache" in response["Cache-Control"]


def test_live_partials_poll(client, staff):
    for name in ("dashboard:overview", "dashboard:running", "dashboard:workers"):
        partial = client.get(reverse(name), headers={"HX-Request": "true"})
        assert b'hx-trigger="every 2s"' in partial.content


def test_overview_counts_per_queue(client, staff):
    now = timezone.now()
    make_task(queue="emails")
    make_task(queue="emails", run_after=now + timedelta(hours=1))
    make_task(Status.RUNNING, queue="emails")
    make_task(Status.FAILED, queue="emails")
    make_task(Status.FAILED, queue="emails", finished_at=now - timedelta(days=2))
    make_task(Status.SUCCESSFUL, queue="emails")
    response = client.get(reverse("dashboard:overview"), headers={"HX-Request": "true"})
    queues = {q.queue: q for q in response.context["overview"].queues}
    emails = queues["emails"]
    assert (emails.ready, emails.scheduled, emails.running, emails.failed_24h) == (1, 1, 1, 1)
    assert (emails.succeeded_1h, emails.failed_1h) == (1, 1)
    assert emails.failure_rate == 0.5
    assert "reports" in queues  # configured queues show even when empty
    chart = response.context["chart"]
    assert sum(chart["series"][0]["data"]) == 1 and sum(chart["series"][1]["data"]) == 1


def test_overview_partial_query_count(client, staff, django_assert_max_num_queries):
    for queue in ("default", "emails", "reports"):
        make_task(queue=queue)
        make_task(Status.FAILED, queue=queue)
        make_task(Status.SUCCESSFUL, queue=queue)
        make_task(Status.RUNNING, queue=queue)
    # session + user + its permissions (user and group: may it view tasks?) + four stats queries
    # + the ox_queue rows (each queue's pause and run-time limits, shown since flow control)
    # + the running tasks that report progress (ox.metadata)
    with django_assert_max_num_queries(10):
        response = client.get(reverse("dashboard:overview"), headers={"HX-Request": "true"})
    assert response.status_code == 200


def test_task_list_query_count(client, staff, django_assert_max_num_queries):
    for i in range(60):
        make_task(Status.FAILED if i % 2 else Status.READY)
    # session, user, its permissions (user and group: may it retry?), capped count, one page
    with django_assert_max_num_queries(6):
        response = client.get(reverse("dashboard:tasks"), {"status": "FAILED"}, headers={"HX-Request": "true"})
    assert len(response.context["page"].object_list) == 30


def test_task_list_filters(client, staff):
    failed = make_task(Status.FAILED, queue="emails", path="tests.tasks.always_fails")
    make_task(Status.READY, queue="emails", path="tests.tasks.always_fails")
    make_task(Status.FAILED, queue="default", path="tests.tasks.noop")

    def ids(**params):
        response = client.get(reverse("dashboard:tasks"), params)
        assert response.status_code == 200
        return {t.pk for t in response.context["page"].object_list}

    assert ids(status="FAILED", queue="emails") == {failed.pk}
    assert ids(task="tests.tasks.always_fails", status="FAILED") == {failed.pk}
    assert ids(id=str(failed.pk)) == {failed.pk}
    assert len(ids()) == 3


def test_task_list_enqueued_range(client, staff):
    old = make_task(enqueued_at=timezone.now() - timedelta(days=3))
    # ids are minted at enqueue: give the old row an id from its own time, as enqueue does
    Task.objects.filter(pk=old.pk).update(id=uuid.UUID(int=(int(old.enqueued_at.timestamp() * 1000) << 80) | 1))
    new = make_task()
    after = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    response = client.get(reverse("dashboard:tasks"), {"enqueued_after": after})
    assert [t.pk for t in response.context["page"].object_list] == [new.pk]
    response = client.get(reverse("dashboard:tasks"), {"enqueued_before": after})
    assert [t.enqueued_at for t in response.context["page"].object_list] == [old.enqueued_at]


@pytest.mark.parametrize(
    "params", [{"status": "EXPLODED"}, {"id": "not-a-uuid"}, {"enqueued_after": "yesterday"}, {"page": "x"}]
)
def test_bad_filter_gives_errors_and_an_empty_list(client, staff, params):
    make_task()
    response = client.get(reverse("dashboard:tasks"), params)
    assert response.status_code == 200
    if "page" in params:  # a bad page number is the first page, not an error
        assert len(response.context["page"].object_list) == 1
        return
    assert list(response.context["page"].object_list) == []
    assert response.context["filter"].errors
    assert b"This filter is not valid" in response.content


def test_task_detail_shows_attempts_and_escapes(client, staff):
    task = make_task(
        Status.FAILED, args=["<script>alert(1)</script>"], kwargs={"k": "<b>x</b>"}, attempts=2, max_attempts=2
    )
    for n in (1, 2):
        Attempt.objects.create(
            task=task,
            number=n,
            worker_id="w-9",
            started_at=timezone.now(),
            finished_at=timezone.now(),
            outcome=Outcome.FAILED,
            exception_class_path="builtins.RuntimeError",
            traceback=f"Traceback...\nRuntimeError: <script>boom {n}</script>",
        )
    response = client.get(reverse("dashboard:task", args=[task.pk]))
    body = response.content.decode()
    assert "<script>alert(1)</script>" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "&lt;script&gt;boom 1&lt;/script&gt;" in body and "&lt;script&gt;boom 2&lt;/script&gt;" in body
    assert 'id="attempt-1"' in body and 'id="attempt-2"' in body
    # a finished task stops polling
    assert 'hx-trigger="every 2s"' not in body


def test_task_detail_buttons_follow_state(client, operator):
    for status, retry, cancel in [
        (Status.FAILED, True, False),
        (Status.CANCELLED, True, False),
        (Status.READY, False, True),
        (Status.RUNNING, False, True),
        (Status.SUCCESSFUL, False, False),
    ]:
        body = client.get(reverse("dashboard:task", args=[make_task(status).pk])).content
        assert (b'id="retry-button"' in body, b'id="cancel-button"' in body) == (retry, cancel), status


def test_task_detail_without_permission_has_no_buttons(client, staff):
    body = client.get(reverse("dashboard:task", args=[make_task(Status.FAILED).pk])).content
    assert b'id="retry-button"' not in body


def test_task_detail_404(client, staff):
    assert client.get(reverse("dashboard:task", args=[uuid.uuid4()])).status_code == 404


def test_task_detail_query_count(client, staff, django_assert_max_num_queries):
    task = make_task(Status.SUCCESSFUL, return_value={"ok": True})
    # session, user, its two permission reads, the task, its steps (ox.steps); a success has
    # no attempt rows
    with django_assert_max_num_queries(6):
        response = client.get(reverse("dashboard:task", args=[task.pk]), headers={"HX-Request": "true"})
    assert b"&quot;ok&quot;: true" in response.content


def test_running_lists_leases(client, operator):
    task = make_task(Status.RUNNING, worker_id="worker-abc")
    body = client.get(reverse("dashboard:running")).content.decode()
    assert "worker-abc" in body and str(task.pk)[-12:] in body
    assert reverse("dashboard:cancel", args=[task.pk]) in body


def test_workers_live_and_stale(client, staff):
    # A fixed clock for the rows and the page: "live" means a heartbeat within three heartbeat
    # intervals (9 s here) of the page's now, so a wall-clock page rendered on a slow machine
    # could see live-1 go stale. The view and ox.stats.workers() both take the clock.
    now = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    stale_after = stats.STALE_HEARTBEATS * stats.heartbeat_interval()
    Worker.objects.create(id="live-1", host="h", pid=1, started_at=now, heartbeat_at=now)
    edge = now - timedelta(seconds=stale_after)  # exactly at the limit: still live
    Worker.objects.create(id="live-2", host="h", pid=5, started_at=now, heartbeat_at=edge)
    Worker.objects.create(id="stale-1", host="h", pid=2, started_at=now, heartbeat_at=now - timedelta(minutes=5))
    Worker.objects.create(id="stopped-1", host="h", pid=3, started_at=now, heartbeat_at=now, stopped_at=now)
    long_ago = now - timedelta(days=2)
    Worker.objects.create(id="ancient", host="h", pid=4, started_at=now, heartbeat_at=long_ago, stopped_at=long_ago)
    make_task(Status.RUNNING, worker_id="live-1")
    states = {s.worker.id: (s.state, s.in_flight) for s in stats.workers(now)}
    assert states == {
        "live-1": ("live", 1),
        "live-2": ("live", 0),
        "stale-1": ("stale", 0),
        "stopped-1": ("stopped", 0),
    }
    body = render_at(workers, staff, now, reverse("dashboard:workers"))
    rows = re.findall(r'<tr class="worker-(\w+)">\s*<td class="mono">([^<]+)</td>', body)
    assert {worker_id: state for state, worker_id in rows} == {w: s for w, (s, _n) in states.items()}
    assert '<p class="count" data-count="2">2 live</p>' in body


def test_filter_form_labels(client, staff):
    body = client.get(reverse("dashboard:tasks")).content.decode()
    assert "Enqueued after" in body and "Enqueued before" in body and "[invalid name]" not in body


def test_overview_shows_capped_backlog_counts(client, staff, monkeypatch):
    monkeypatch.setattr("ox.health.COUNT_CAP", 2)
    for _ in range(3):
        make_task(queue="emails")
    make_task(queue="emails", run_after=timezone.now() + timedelta(hours=1))
    response = client.get(reverse("dashboard:overview"), headers={"HX-Request": "true"})
    emails = {q.queue: q for q in response.context["overview"].queues}["emails"]
    assert (emails.ready, emails.ready_capped, emails.scheduled, emails.scheduled_capped) == (2, True, 1, False)
    html = response.content.decode()
    assert 'data-stat="ready"><span title="counted up to 2: there are more">2+</span>' in html
    assert '<td class="num" data-stat="scheduled">1</td>' in html
