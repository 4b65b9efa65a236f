"""Factories, user fixtures and a fixed-clock renderer shared by the dashboard and admin tests
(no tests here)."""

from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.http import HttpResponse
from django.test import RequestFactory
from django.utils import timezone
from django_htmx.middleware import HtmxMiddleware

from ox.models import Status, Task


def make_task(status=Status.READY, queue="default", path="tests.tasks.noop", **fields) -> Task:
    now = timezone.now()
    defaults = {"run_after": now, "enqueued_at": now, "max_attempts": 3}
    if status in (Status.SUCCESSFUL, Status.FAILED, Status.CANCELLED):
        defaults.update(finished_at=now, attempts=1, started_at=now, last_attempted_at=now)
    if status == Status.RUNNING:
        defaults.update(
            attempts=1,
            started_at=now,
            last_attempted_at=now,
            worker_id="w-1",
            lease_expires_at=now + timedelta(seconds=30),
        )
    defaults.update(fields)
    return Task.objects.create(task_path=path, queue=queue, status=status, **defaults)


def render_at(view: Callable[..., HttpResponse], user: User, now: datetime, path: str, htmx: bool = True) -> str:
    """A dashboard view's HTML rendered at a fixed `now` (the views take the clock as an
    argument). The test client cannot hand a view a clock, so this builds the request and
    runs it through the htmx middleware itself; the view's own decorators still apply."""
    request = RequestFactory().get(path, headers={"HX-Request": "true"} if htmx else {})
    request.user = user
    response = HtmxMiddleware(lambda r: view(r, now=now))(request)
    assert response.status_code == 200, response
    return response.content.decode()


def staff_user(username: str, *codenames: str) -> User:
    """An active staff account with the given ox permissions (none: staff who may see nothing)."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="ox"))
    return user


@pytest.fixture(name="staff")
def staff_fixture(client):
    """Staff who may view tasks (ox.view_task) but not act on them."""
    user = staff_user("viewer", "view_task")
    client.force_login(user)
    return user


@pytest.fixture(name="operator")
def operator_fixture(client):
    """Staff with ox.view_task and ox.change_task: may retry and cancel."""
    user = staff_user("operator", "view_task", "change_task")
    client.force_login(user)
    return user
