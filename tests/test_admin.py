"""The Task and Worker admin: actions go through ox.operations, need change_task, report counts."""

import time
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse
from django.utils import timezone

from ox.models import Attempt, Outcome, Status, Task, Worker
from tests.test_dashboard_support import make_task

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:ox_task_changelist"


def staff_with(*codenames: str) -> User:
    user = User.objects.create_user("admin-user", password="pw", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="ox"))
    return user


@pytest.fixture
def admin_client(client):
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def test_changelist_filters_and_search(admin_client):
    task = make_task(Status.FAILED, path="tests.tasks.always_fails", queue="emails")
    # "Newest first" is id order, and ids minted in the same millisecond order at random (uuid7):
    # the second task must come at least a millisecond later.
    time.sleep(0.002)
    ready = make_task(Status.READY, queue="emails")
    old = make_task(Status.SUCCESSFUL, enqueued_at=timezone.now() - timedelta(days=3))
    # ids are minted at enqueue: give the old row an id from its own time, as enqueue does
    Task.objects.filter(pk=old.pk).update(id=uuid.UUID(int=(int(old.enqueued_at.timestamp() * 1000) << 80) | 1))
    url = reverse(CHANGELIST)

    def listed(**params):
        response = admin_client.get(url, params)
        assert response.status_code == 200
        return list(response.context["cl"].result_list)

    assert len(listed()) == 3
    assert listed(status__exact="FAILED") == [task]
    assert listed(queue="emails") == [ready, task]  # newest first
    assert listed(queue="emails", status__exact="READY") == [ready]
    assert old.pk not in {t.pk for t in listed(enqueued="24h")} and len(listed(enqueued="24h")) == 2
    assert listed(q="tests.tasks.always_fails") == [task]  # an exact path
    assert listed(q="always_fails") == []  # no substring search: it would read every row
    assert listed(q=str(task.pk)) == [task]
    body = admin_client.get(url).content.decode()
    # The filters offer the configured queues (no SELECT DISTINCT over the table), and no
    # date hierarchy (which reads the table's whole date range).
    assert "?queue=reports" in body and "?enqueued=7d" in body
    assert admin_client.get(url).context["cl"].date_hierarchy is None


def test_change_page_shows_attempt_tracebacks_as_pre(admin_client):
    task = make_task(Status.FAILED)
    Attempt.objects.create(
        task=task,
        number=1,
        finished_at=timezone.now(),
        outcome=Outcome.FAILED,
        exception_class_path="builtins.ValueError",
        traceback="Traceback (most recent call last):\n  <script>x</script>\nValueError: bad",
    )
    body = admin_client.get(reverse("admin:ox_task_change", args=[task.pk])).content.decode()
    assert "<pre" in body and "ValueError: bad" in body
    assert "&lt;script&gt;x&lt;/script&gt;" in body


def test_retry_action_reports_counts(admin_client):
    failed = [make_task(Status.FAILED) for _ in range(2)]
    done = make_task(Status.SUCCESSFUL)
    data = {"action": "retry_tasks", "_selected_action": [t.pk for t in [*failed, done]]}
    response = admin_client.post(reverse(CHANGELIST), data, follow=True)
    assert [str(m) for m in response.context["messages"]] == [
        "3 selected: 2 retried; 1 unchanged (not in a state that allows it)."
    ]
    assert Task.objects.filter(status=Status.READY).count() == 2


def test_cancel_action_reports_counts(admin_client):
    ready, running = make_task(Status.READY), make_task(Status.RUNNING)
    data = {"action": "cancel_tasks", "_selected_action": [ready.pk, running.pk]}
    response = admin_client.post(reverse(CHANGELIST), data, follow=True)
    assert [str(m) for m in response.context["messages"]] == ["2 selected: 1 cancelled; 1 running asked to cancel."]
    running.refresh_from_db()
    assert running.cancel_requested


def test_actions_need_change_task(client):
    client.force_login(staff_with("view_task"))
    task = make_task(Status.FAILED)
    response = client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    assert b"retry_tasks" not in response.content
    response = client.post(reverse(CHANGELIST), {"action": "retry_tasks", "_selected_action": [task.pk]})
    task.refresh_from_db()
    assert task.status == Status.FAILED


def test_actions_offered_with_change_task(client):
    client.force_login(staff_with("view_task", "change_task"))
    make_task(Status.FAILED)
    assert b"retry_tasks" in client.get(reverse(CHANGELIST)).content


def test_task_fields_are_read_only(admin_client):
    task = make_task(Status.FAILED)
    response = admin_client.post(reverse("admin:ox_task_change", args=[task.pk]), {"status": "READY"})
    assert response.status_code in (200, 302)
    task.refresh_from_db()
    assert task.status == Status.FAILED


def test_worker_admin_is_read_only(admin_client):
    now = timezone.now()
    Worker.objects.create(id="w-1", host="h", pid=1, started_at=now, heartbeat_at=now)
    assert admin_client.get(reverse("admin:ox_worker_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:ox_worker_change", args=["w-1"])).status_code == 200
    assert admin_client.get(reverse("admin:ox_worker_add")).status_code == 403
    assert admin_client.post(reverse("admin:ox_worker_delete", args=["w-1"]), {"post": "yes"}).status_code == 403
    assert Worker.objects.filter(id="w-1").exists()
