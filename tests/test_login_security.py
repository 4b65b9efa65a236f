"""Logging in: throttled (django-axes) per username and client address, the client address
believed from X-Forwarded-For only when a configured proxy sends it, no public password-reset
views; and the Content-Security-Policy every page is served with."""

import re

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client, override_settings
from django.urls import NoReverseMatch, reverse

from oxproject.security import networks
from tests.test_dashboard_support import make_task, staff_user

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
PASSWORD = "a long enough password"  # noqa: S105  (a test account)
ATTACKER = "203.0.113.7"
COLLEAGUE = "198.51.100.9"


@pytest.fixture
def admin_user() -> User:
    return User.objects.create_superuser("admin", password=PASSWORD)


def attempt(client: Client, password: str, xff: str | None = None, address: str = ATTACKER):
    """A login POST for "admin" from `address`, with an X-Forwarded-For header when given."""
    headers = {"X-Forwarded-For": xff} if xff is not None else {}
    return client.post(LOGIN, {"username": "admin", "password": password}, REMOTE_ADDR=address, headers=headers)


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_forty_wrong_passwords_lock_the_pair_out(client, admin_user, settings):
    limit = settings.AXES_FAILURE_LIMIT
    codes = [attempt(client, f"guess-{i}").status_code for i in range(40)]
    # Wrong passwords re-show the form (200) until the limit; from then on the pair is refused.
    assert codes[: limit - 1] == [200] * (limit - 1)
    assert set(codes[limit:]) == {429}
    locked = attempt(client, PASSWORD)  # the right password no longer helps
    assert locked.status_code == 429 and b'id="locked-out"' in locked.content
    assert not logged_in(client)
    # The admin's own login form is the same authentication: refused too.
    admin_login = client.post(
        "/admin/login/", {"username": "admin", "password": PASSWORD}, REMOTE_ADDR=ATTACKER, follow=False
    )
    assert admin_login.status_code == 429 and not logged_in(client)


def test_a_lockout_is_the_attackers_not_the_accounts(client, admin_user, settings):
    for i in range(settings.AXES_FAILURE_LIMIT):
        attempt(client, f"guess-{i}")
    assert attempt(client, PASSWORD).status_code == 429
    # The owner, elsewhere, still logs in: nobody can lock a colleague out by guessing at them.
    colleague = Client()
    response = attempt(colleague, PASSWORD, address=COLLEAGUE)
    assert response.status_code == 302 and logged_in(colleague)
    # An administrator clears a lockout by hand.
    call_command("axes_reset_username", "admin", verbosity=0)
    assert attempt(client, PASSWORD).status_code == 302 and logged_in(client)


def test_a_success_before_the_limit_resets_the_count(client, admin_user, settings):
    for i in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(client, f"typo-{i}")
    assert attempt(client, PASSWORD).status_code == 302
    client.logout()
    for i in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(client, f"typo-again-{i}").status_code == 200
    assert attempt(client, PASSWORD).status_code == 302


def test_x_forwarded_for_from_a_client_is_not_believed(client, admin_user, settings):
    # The attacker makes up a new address for every guess: it is no proxy of ours, so the
    # header is ignored and every guess counts against its own address.
    for i in range(settings.AXES_FAILURE_LIMIT + 3):
        attempt(client, f"guess-{i}", xff=f"10.0.0.{i}")
    assert attempt(client, PASSWORD, xff="10.9.9.9").status_code == 429


@override_settings(OX_TRUSTED_PROXIES=networks("127.0.0.1, 10.1.0.0/16"))
def test_behind_a_trusted_proxy_the_forwarded_client_is_throttled(client, admin_user, settings):
    proxy = "10.1.2.3"
    for i in range(settings.AXES_FAILURE_LIMIT):
        # A client that prepends its own made-up hop: the proxy appends the real address last.
        attempt(client, f"guess-{i}", xff=f"1.2.3.{i}, {ATTACKER}", address=proxy)
    assert attempt(client, PASSWORD, xff=ATTACKER, address=proxy).status_code == 429
    # Another client through the same proxy is someone else.
    colleague = Client()
    response = attempt(colleague, PASSWORD, xff=COLLEAGUE, address=proxy)
    assert response.status_code == 302 and logged_in(colleague)


def test_password_reset_and_change_views_are_not_routed(client, admin_user):
    # Issue #16: anyone could have reset mail sent to any address, and tell known addresses
    # from unknown ones by timing.
    for path in (
        "/accounts/password_reset/",
        "/accounts/password_reset/done/",
        "/accounts/reset/MQ/set-password/",
        "/accounts/password_change/",
    ):
        assert client.get(path).status_code == 404, path
        assert client.post(path, {"email": "admin@example.com"}).status_code == 404, path
    for name in ("password_reset", "password_change"):
        with pytest.raises(NoReverseMatch):
            reverse(name)
    assert b"Forgotten your password" not in client.get("/admin/login/").content
    # Log in and out still work.
    assert attempt(client, PASSWORD, address=COLLEAGUE).status_code == 302
    assert client.post(reverse("logout")).status_code == 200 and not logged_in(client)


def test_every_page_is_served_with_a_strict_content_security_policy(client):
    client.force_login(staff_user("viewer", "view_task", "change_task"))
    task = make_task()
    paths = [
        LOGIN,
        "/",
        "/tasks/",
        f"/tasks/{task.pk}/",
        "/running/",
        "/workers/",
        "/health/",
        "/benchmarks/",
        "/tasks/retry-matching/",
        "/admin/",
        "/admin/ox/task/",
        f"/admin/ox/task/{task.pk}/change/",
    ]
    for path in paths:
        response = client.get(path)
        assert response.status_code == 200, path
        policy = dict(
            part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";") if part.strip()
        )
        assert policy["script-src"] == "'self'" and policy["style-src"] == "'self'", path
        assert policy["object-src"] == "'none'" and policy["frame-ancestors"] == "'none'", path
        assert "unsafe" not in response["Content-Security-Policy"]
        body = response.content.decode()
        # What the policy would block: inline scripts (JSON data blocks are not run), inline
        # styles and event-handler attributes. (The browser test sees the pages work under it.)
        inline = [s for s in re.findall(r"<script\b[^>]*>", body) if "src=" not in s and "application/json" not in s]
        assert not inline, (path, inline)
        assert not re.search(r"\sstyle=", body), path
        assert not re.search(r"<[^>]+\son[a-z]+=", body), path
