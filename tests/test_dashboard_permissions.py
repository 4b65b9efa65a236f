"""Least privilege on task data: every dashboard page, partial and action, and the staff path of
/ox/metrics, for staff with no ox permission, with ox.view_task, and with ox.change_task (the
admin's rules: /admin/ox/task/ is the reference). Issue #16: staff without a single ox
permission were refused by the admin but read every task's arguments and tracebacks here."""

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from ox.models import Status, Task
from tests.test_dashboard_support import make_task, staff_user

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}


def pages(task: Task) -> list[str]:
    detail = reverse("dashboard:task", args=[task.pk])
    health = reverse("dashboard:health")
    return [
        reverse("dashboard:overview"),
        reverse("dashboard:tasks"),
        reverse("dashboard:tasks") + "?status=FAILED",
        detail,
        reverse("dashboard:running"),
        reverse("dashboard:workers"),
        health,
        health + "?part=schedules",
        health + "?part=table",
        reverse("dashboard:benchmarks"),
        reverse("dashboard:retry_matching") + "?status=FAILED",
    ]


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def failed_task() -> Task:
    make_task(Status.RUNNING)  # something for the running page to show
    return make_task(Status.FAILED, args=["secret-argument"], kwargs={"token": "secret-kwarg"})


def post_every_action(client: Client, task: Task) -> list[int]:
    ready = make_task(Status.READY)
    return [
        client.post(reverse("dashboard:retry", args=[task.pk])).status_code,
        client.post(reverse("dashboard:cancel", args=[ready.pk])).status_code,
        client.post(reverse("dashboard:bulk"), {"action": "retry", "ids": [task.pk]}).status_code,
        client.post(reverse("dashboard:bulk"), {"action": "cancel", "ids": [ready.pk]}).status_code,
        client.post(reverse("dashboard:retry_matching"), {"status": "FAILED"}).status_code,
    ]


def test_staff_without_ox_permissions_see_nothing(failed_task):
    client = client_for(staff_user("nobody"))
    assert client.get(reverse("admin:ox_task_changelist")).status_code == 403  # the reference
    for url in pages(failed_task):
        for headers in ({}, HX):
            response = client.get(url, headers=headers)
            assert response.status_code == 403, (url, headers)
            assert b"secret-argument" not in response.content
    assert client.get("/ox/metrics").status_code == 403
    assert post_every_action(client, failed_task) == [403] * 5
    assert Task.objects.get(pk=failed_task.pk).status == Status.FAILED
    assert not Task.objects.filter(status=Status.CANCELLED).exists()


def test_view_task_sees_every_page_and_partial_but_cannot_act(failed_task):
    client = client_for(staff_user("viewer", "view_task"))
    assert client.get(reverse("admin:ox_task_changelist")).status_code == 200
    for url in pages(failed_task):
        for headers in ({}, HX):
            assert client.get(url, headers=headers).status_code == 200, (url, headers)
    detail = client.get(reverse("dashboard:task", args=[failed_task.pk])).content
    assert b"secret-argument" in detail and b'id="retry-button"' not in detail
    assert client.get("/ox/metrics").status_code == 200
    assert post_every_action(client, failed_task) == [403] * 5
    assert Task.objects.get(pk=failed_task.pk).status == Status.FAILED
    assert not Task.objects.filter(status=Status.CANCELLED).exists()


def test_change_task_sees_and_acts(failed_task):
    # The admin counts change as view too: an account given only change_task is not locked
    # out of the pages it acts from.
    for user in (staff_user("changer", "change_task"), staff_user("operator", "view_task", "change_task")):
        client = client_for(user)
        for url in pages(failed_task):
            assert client.get(url).status_code == 200, (user, url)
        assert b'id="retry-button"' in client.get(reverse("dashboard:task", args=[failed_task.pk])).content
    client = client_for(User.objects.get(username="operator"))
    assert post_every_action(client, failed_task) == [302] * 5
    assert Task.objects.get(pk=failed_task.pk).status == Status.READY
    assert Task.objects.filter(status=Status.CANCELLED).count() == 1


def test_permissions_of_an_inactive_or_non_staff_account_do_not_count(failed_task):
    plain = User.objects.create_user("plain", password="pw")
    plain.user_permissions.add(*staff_user("tmp", "view_task", "change_task").user_permissions.all())
    inactive = staff_user("gone", "view_task", "change_task")
    inactive.is_active = False
    inactive.save()
    client = client_for(plain)
    for url in pages(failed_task):
        assert client.get(url).status_code == 403, url
    assert client.get("/ox/metrics").status_code == 403
    assert post_every_action(client, failed_task) == [403] * 5
    # An inactive account's session is no login at all (ModelBackend refuses it).
    client = client_for(inactive)
    assert client.get(reverse("dashboard:tasks"))["Location"].startswith(reverse("login"))
    assert Task.objects.get(pk=failed_task.pk).status == Status.FAILED


def test_group_permissions_count(failed_task):
    from django.contrib.auth.models import Group, Permission

    group = Group.objects.create(name="operators")
    group.permissions.add(Permission.objects.get(codename="view_task", content_type__app_label="ox"))
    user = staff_user("member")
    user.groups.add(group)
    client = client_for(user)
    assert client.get(reverse("dashboard:task", args=[failed_task.pk])).status_code == 200
    assert client.post(reverse("dashboard:retry", args=[failed_task.pk])).status_code == 403
