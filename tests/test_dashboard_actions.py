"""Retry and cancel from the dashboard: POST only, CSRF, ox.change_task, counts reported."""

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from ox.models import Status, Task
from tests.test_dashboard_support import make_task, operator_fixture, staff_fixture  # noqa: F401

pytestmark = pytest.mark.django_db


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


@pytest.mark.parametrize("name", ["dashboard:retry", "dashboard:cancel"])
def test_single_actions_are_post_only(client, operator, name):
    task = make_task(Status.FAILED)
    assert client.get(reverse(name, args=[task.pk])).status_code == 405


def test_actions_need_change_permission(client, staff):
    task = make_task(Status.FAILED)
    assert client.post(reverse("dashboard:retry", args=[task.pk])).status_code == 403
    assert client.post(reverse("dashboard:bulk"), {"action": "retry", "ids": [task.pk]}).status_code == 403
    assert client.post(reverse("dashboard:retry_matching"), {"status": "FAILED"}).status_code == 403
    task.refresh_from_db()
    assert task.status == Status.FAILED


def test_actions_refuse_non_staff_even_with_permission(client):
    from django.contrib.auth.models import Permission

    user = User.objects.create_user("plain", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="change_task", content_type__app_label="ox"))
    client.force_login(user)
    task = make_task(Status.FAILED)
    assert client.post(reverse("dashboard:retry", args=[task.pk])).status_code == 403


def test_actions_check_csrf(operator):
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(operator)
    task = make_task(Status.FAILED)
    assert csrf_client.post(reverse("dashboard:retry", args=[task.pk])).status_code == 403
    task.refresh_from_db()
    assert task.status == Status.FAILED


def test_retry_one(client, operator):
    task = make_task(Status.FAILED)
    response = client.post(reverse("dashboard:retry", args=[task.pk]), follow=True)
    assert response.redirect_chain[-1][0] == reverse("dashboard:task", args=[task.pk])
    assert messages_of(response) == ["1 retried"]
    task.refresh_from_db()
    assert task.status == Status.READY and task.max_attempts > task.attempts


def test_cancel_ready_and_running(client, operator):
    ready, running = make_task(Status.READY), make_task(Status.RUNNING)
    response = client.post(reverse("dashboard:bulk"), {"action": "cancel", "ids": [ready.pk, running.pk]}, follow=True)
    assert messages_of(response) == ["1 cancelled; 1 running asked to cancel"]
    ready.refresh_from_db()
    running.refresh_from_db()
    assert ready.status == Status.CANCELLED
    assert running.status == Status.RUNNING and running.cancel_requested


def test_bulk_reports_unchanged(client, operator):
    failed, done = make_task(Status.FAILED), make_task(Status.SUCCESSFUL)
    response = client.post(reverse("dashboard:bulk"), {"action": "retry", "ids": [failed.pk, done.pk]}, follow=True)
    assert messages_of(response) == ["1 retried; 1 unchanged (not in a state that allows it)"]


@pytest.mark.parametrize(
    "data", [{"action": "explode", "ids": []}, {"action": "retry", "ids": ["nope"]}, {"action": "retry"}]
)
def test_bulk_rejects_bad_input(client, operator, data):
    response = client.post(reverse("dashboard:bulk"), data)
    assert response.status_code in (302, 400)
    if response.status_code == 302:  # no ids: nothing to do, said so
        assert messages_of(client.get(response["Location"])) == ["Select some tasks first."]


def test_bulk_next_must_be_local(client, operator):
    task = make_task(Status.FAILED)
    data = {"action": "retry", "ids": [task.pk], "next": "https://evil.example/"}
    response = client.post(reverse("dashboard:bulk"), data)
    assert response["Location"] == reverse("dashboard:tasks")


def test_retry_matching_confirms_count_first(client, operator):
    for _ in range(3):
        make_task(Status.FAILED, queue="emails")
    make_task(Status.CANCELLED, queue="emails")
    make_task(Status.FAILED, queue="default")
    make_task(Status.READY, queue="emails")
    confirm = client.get(reverse("dashboard:retry_matching"), {"queue": "emails"})
    assert confirm.status_code == 200 and confirm.context["count"] == 4
    assert b'<strong id="matching-count">4</strong>' in confirm.content
    # the GET changed nothing
    assert Task.objects.filter(status=Status.READY).count() == 1
    response = client.post(reverse("dashboard:retry_matching"), {"queue": "emails", "expected": "4"}, follow=True)
    assert messages_of(response) == ["4 retried"]
    assert response.redirect_chain[-1][0] == reverse("dashboard:tasks") + "?queue=emails"
    assert Task.objects.filter(status=Status.READY).count() == 5
    assert Task.objects.filter(queue="default", status=Status.FAILED).count() == 1


def test_retry_matching_bad_filter(client, operator):
    response = client.get(reverse("dashboard:retry_matching"), {"status": "NOPE"})
    assert response.status_code == 400 and b"This filter is not valid" in response.content
    make_task(Status.FAILED)
    assert client.post(reverse("dashboard:retry_matching"), {"id": "zzz"}).status_code == 400
    assert Task.objects.filter(status=Status.FAILED).count() == 1
