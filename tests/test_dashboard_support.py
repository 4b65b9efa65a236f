"""Factories and user fixtures shared by the dashboard and admin tests (no tests here)."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.utils import timezone

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


@pytest.fixture(name="staff")
def staff_fixture(client):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    client.force_login(user)
    return user


@pytest.fixture(name="operator")
def operator_fixture(client):
    user = User.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="change_task", content_type__app_label="ox"))
    client.force_login(user)
    return user
