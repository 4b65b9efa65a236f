"""Production-safe settings without being told (issue #16): DEBUG off by default, no known
fallback key, placeholder and weak keys refused, `check --deploy` enforced by the entrypoint,
HSTS and proxy trust, private local files, and what DEBUG's error pages may show."""

import json
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.messages import constants
from django.contrib.messages.storage.base import Message
from django.contrib.messages.storage.cookie import CookieStorage
from django.test import RequestFactory, override_settings
from django.utils.safestring import mark_safe

from oxproject.security import key_problem
from tests.conftest import ROOT
from tests.test_production import GOOD_KEY

ENTRYPOINT = ROOT / "scripts" / "docker-entrypoint.sh"
OLD_FALLBACK_KEY = "insecure-development-key-only-for-debug"  # noqa: S105  (what settings used to fall back to)
PAYLOAD = "<img src=x onerror=alert(document.domain)>"


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a process started by an operator who set nothing but `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "OX_", "DATABASE_", "FORWARDED_"))}
    env.update(DJANGO_SETTINGS_MODULE="oxproject.settings", OX_VAR_DIR=str(tmp_path / "var"), **extra)
    return env


def settings_of(env: dict[str, str], *names: str) -> dict:
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        f"print(json.dumps({{n: getattr(s, n, None) for n in {list(names)!r}}}, default=str))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def refused(env: dict[str, str]) -> str:
    command = [sys.executable, str(ROOT / "manage.py"), "check"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, done.stdout
    return done.stderr


# ---------------------------------------------------------------- 1. DEBUG and the key


def test_debug_is_off_unless_asked_for(tmp_path):
    seen = settings_of(
        clean_env(tmp_path, DJANGO_SECRET_KEY=GOOD_KEY),
        "DEBUG",
        "SESSION_COOKIE_SECURE",
        "CSRF_COOKIE_SECURE",
        "SECURE_SSL_REDIRECT",
        "SECURE_HSTS_SECONDS",
        "SECURE_HSTS_INCLUDE_SUBDOMAINS",
        "SECURE_PROXY_SSL_HEADER",
        "STORAGES",
    )
    assert seen["DEBUG"] is False
    assert seen["SESSION_COOKIE_SECURE"] is seen["CSRF_COOKIE_SECURE"] is seen["SECURE_SSL_REDIRECT"] is True
    assert seen["SECURE_HSTS_SECONDS"] == 31536000 and seen["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is False
    # Who may say "this came over HTTPS" is gunicorn's --forwarded-allow-ips, not any client.
    assert seen["SECURE_PROXY_SSL_HEADER"] is None
    assert seen["STORAGES"]["staticfiles"]["BACKEND"] == "whitenoise.storage.CompressedManifestStaticFilesStorage"
    # Without a key it does not start at all, rather than fall back to one.
    assert "DJANGO_SECRET_KEY must be set when DJANGO_DEBUG is off" in refused(clean_env(tmp_path))


def test_debug_without_a_key_keeps_a_private_random_one(tmp_path):
    env = clean_env(tmp_path, DJANGO_DEBUG="1")
    first = settings_of(env, "SECRET_KEY", "DEBUG")
    again = settings_of(env, "SECRET_KEY")["SECRET_KEY"]
    assert first["DEBUG"] is True and first["SECRET_KEY"] == again  # local logins survive a restart
    assert first["SECRET_KEY"] != OLD_FALLBACK_KEY and key_problem(first["SECRET_KEY"]) is None
    key_file = tmp_path / "var" / "secret_key"
    assert key_file.read_text().strip() == again
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "var").stat().st_mode) == 0o700
    other = settings_of(clean_env(tmp_path / "elsewhere", DJANGO_DEBUG="1"), "SECRET_KEY")["SECRET_KEY"]
    assert other != again  # every checkout has its own
    # No key is built into the source any more.
    settings_source = (ROOT / "oxproject" / "settings.py").read_text()
    assert OLD_FALLBACK_KEY not in settings_source


@pytest.mark.django_db
def test_a_cookie_signed_with_the_old_public_key_is_rejected(client, settings):
    # Issue #16: with the published fallback key anyone could sign a `messages` cookie marked
    # safe, and /workers/ rendered its <img onerror=...> raw.
    from tests.test_dashboard_support import staff_user

    client.force_login(staff_user("viewer", "view_task"))

    def forged(key: str) -> str:
        with override_settings(SECRET_KEY=key):
            storage = CookieStorage(RequestFactory().get("/"))
            return storage._encode([Message(constants.ERROR, mark_safe(PAYLOAD))])  # noqa: S308

    client.cookies["messages"] = forged(OLD_FALLBACK_KEY)
    body = client.get("/workers/").content.decode()
    assert PAYLOAD not in body
    # The check can fail: a cookie signed with the key in use is rendered, as marked.
    client.cookies["messages"] = forged(settings.SECRET_KEY)
    assert PAYLOAD in client.get("/workers/").content.decode()


# ---------------------------------------------------------------- 2. weak keys


@pytest.mark.parametrize(
    "key",
    [
        "change-me-to-a-long-random-string",  # .env.example's placeholder
        OLD_FALLBACK_KEY,
        "django-insecure-" + secrets.token_urlsafe(40),  # startproject's development key
        "CHANGE-ME-" + secrets.token_urlsafe(40),
        secrets.token_urlsafe(20),  # too short
        "x" * 60,  # one character
        "abcde" * 12,  # five distinct
        "q7Fz2!" * 10,  # a pattern
    ],
)
def test_placeholder_short_and_simple_keys_are_refused(key):
    assert key_problem(key)


def test_random_keys_are_accepted():
    for _ in range(200):
        assert key_problem(secrets.token_urlsafe(50)) is None
        assert key_problem(secrets.token_hex(32)) is None
    assert key_problem(GOOD_KEY) is None


def test_settings_refuse_the_env_example_placeholder_with_debug_off(tmp_path):
    example = (ROOT / ".env.example").read_text()
    placeholder = next(line.split("=", 1)[1] for line in example.splitlines() if line.startswith("DJANGO_SECRET_KEY="))
    error = refused(clean_env(tmp_path, DJANGO_SECRET_KEY=placeholder))
    assert "DJANGO_SECRET_KEY is not a usable secret: it is a published placeholder" in error
    assert "not a usable secret" in refused(clean_env(tmp_path, DJANGO_SECRET_KEY="short-but-not-secret"))
    # With DEBUG on (local use) a placeholder is the developer's business.
    assert settings_of(clean_env(tmp_path, DJANGO_DEBUG="1", DJANGO_SECRET_KEY=placeholder), "DEBUG")["DEBUG"]


# ---------------------------------------------------------------- check --deploy in the entrypoint


def run_entrypoint_web(env: dict[str, str]) -> subprocess.CompletedProcess:
    """`docker-entrypoint.sh web` with settings that `check --deploy` warns about: it must stop at
    the check, before migrate or gunicorn (the bind address is loopback in any case)."""
    env = {**env, "PYTHON": sys.executable, "OX_BIND": "127.0.0.1:1", "OX_MIGRATE_ON_START": "0"}
    return subprocess.run([str(ENTRYPOINT), "web"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_entrypoint_refuses_to_serve_what_check_deploy_warns_about(tmp_path):
    debug_on = run_entrypoint_web(clean_env(tmp_path, DJANGO_DEBUG="1", DJANGO_SECRET_KEY=GOOD_KEY))
    assert debug_on.returncode != 0 and "security.W018" in debug_on.stderr, debug_on.stderr
    plain_http = run_entrypoint_web(clean_env(tmp_path, DJANGO_SECRET_KEY=GOOD_KEY, DJANGO_SECURE="0"))
    assert plain_http.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in plain_http.stderr, plain_http.stderr
    assert "Listening at" not in debug_on.stderr + plain_http.stderr  # gunicorn never started


def test_warnings_are_accepted_only_by_id(tmp_path):
    base = clean_env(tmp_path, DJANGO_SECRET_KEY=GOOD_KEY, DJANGO_SECURE="0")

    def deploy_check(env):
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "check", "--deploy", "--fail-level", "WARNING"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    some = deploy_check({**base, "DJANGO_SILENCED_CHECKS": "security.W004,security.W008"})
    assert some.returncode != 0 and "security.W012" in some.stderr and "security.W004" not in some.stderr
    every = "security.W004,security.W008,security.W012,security.W016"
    assert deploy_check({**base, "DJANGO_SILENCED_CHECKS": every}).returncode == 0
    # The production defaults pass with nothing silenced by the operator.
    assert deploy_check(clean_env(tmp_path, DJANGO_SECRET_KEY=GOOD_KEY)).returncode == 0


def test_hsts_include_subdomains_and_preload_are_options(tmp_path):
    default = settings_of(clean_env(tmp_path, DJANGO_SECRET_KEY=GOOD_KEY), "SILENCED_SYSTEM_CHECKS")
    # Off by default (they bind every subdomain; preload is slow to undo): their "not set"
    # warnings are silenced while they are off, and only then.
    assert set(default["SILENCED_SYSTEM_CHECKS"]) == {"security.W005", "security.W021"}
    on = settings_of(
        clean_env(tmp_path, DJANGO_SECRET_KEY=GOOD_KEY, DJANGO_HSTS_INCLUDE_SUBDOMAINS="1", DJANGO_HSTS_PRELOAD="1"),
        "SECURE_HSTS_INCLUDE_SUBDOMAINS",
        "SECURE_HSTS_PRELOAD",
        "SILENCED_SYSTEM_CHECKS",
    )
    assert on == {"SECURE_HSTS_INCLUDE_SUBDOMAINS": True, "SECURE_HSTS_PRELOAD": True, "SILENCED_SYSTEM_CHECKS": []}


def test_trusted_proxies_are_addresses_or_networks_never_everyone(tmp_path):
    env = clean_env(tmp_path, DJANGO_SECRET_KEY=GOOD_KEY, FORWARDED_ALLOW_IPS="127.0.0.1, 10.1.0.0/16")
    assert settings_of(env, "OX_TRUSTED_PROXIES")["OX_TRUSTED_PROXIES"] == ["127.0.0.1/32", "10.1.0.0/16"]
    assert "FORWARDED_ALLOW_IPS: '*' is not an address or network" in refused({**env, "FORWARDED_ALLOW_IPS": "*"})


# ---------------------------------------------------------------- 7. private local files


def test_var_and_the_sqlite_file_are_private_under_a_permissive_umask(tmp_path):
    import sqlite3

    var = tmp_path / "var"
    env = clean_env(tmp_path, DJANGO_DEBUG="1")
    old = os.umask(0o022)
    try:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        db = var / "db.sqlite3"
        assert stat.S_IMODE(var.stat().st_mode) == 0o700
        assert stat.S_IMODE(db.stat().st_mode) == 0o600
        # SQLite gives its -wal and -shm files the database's mode: written to while open here
        # (under umask 022, which alone would make them 0644), they are private too.
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("INSERT INTO django_session VALUES ('k', 'd', '2999-01-01')")
        conn.commit()
        for side in ("db.sqlite3-wal", "db.sqlite3-shm"):
            assert stat.S_IMODE((var / side).stat().st_mode) == 0o600, side
        conn.close()
        # A world-readable file and folder left by an older version are made private.
        db.chmod(0o644)
        var.chmod(0o755)
        subprocess.run([sys.executable, str(ROOT / "manage.py"), "check"], cwd=ROOT, env=env, check=True, timeout=60)
        assert stat.S_IMODE(var.stat().st_mode) == 0o700 and stat.S_IMODE(db.stat().st_mode) == 0o600
    finally:
        os.umask(old)


# ---------------------------------------------------------------- DEBUG's error pages


def request_with_a_database_url() -> object:
    request = RequestFactory().get("/boom/")
    # runserver hands the whole environment to a request as META. The password is made here,
    # not written in the source: the technical page shows the source lines of the traceback.
    request.META["DATABASE_URL"] = f"postgres://ox:{secrets.token_hex(8)}@db.internal/oxproject"
    return request


def fail() -> None:
    raise RuntimeError("boom")


def test_debug_error_pages_hide_database_urls():
    from django.views.debug import technical_500_response

    request = request_with_a_database_url()
    try:
        fail()
    except RuntimeError:
        response = technical_500_response(request, *sys.exc_info())
    body = response.content.decode()
    password = request.META["DATABASE_URL"].split(":")[2].split("@")[0]
    assert "DATABASE_URL" in body and password not in body
