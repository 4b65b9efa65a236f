"""The production path, outside Docker: scripts/docker-entrypoint.sh web (migrate,
collectstatic, gunicorn) and worker (runworker --processes), exactly as the containers run
them, with DEBUG off, against the test database. Plus the settings that guard production."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.tasks import TaskResultStatus, task_backends

from oxproject.logging import JsonFormatter
from tests import production_tasks
from tests.conftest import ROOT, database_url
from tests.helpers import wait_until

ENTRYPOINT = ROOT / "scripts" / "docker-entrypoint.sh"
HTTPS = {"X-Forwarded-Proto": "https"}  # what the TLS-terminating proxy in front adds
GOOD_KEY = "Xq3v-9LrT_a8ZpW2mK7sYc0NdF4hJ6uB1eG5iO8lQwRtUyVxCzAsDfGhJkL"  # 50+ characters, not a pattern


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(url, headers=None, timeout=5.0):
    """(status, headers, body) without following redirects."""
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def production_env(tmp_path: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "OX_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        PYTHON=sys.executable,
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="oxproject.settings",
        DATABASE_URL=database_url(),
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=GOOD_KEY,
        DJANGO_ALLOWED_HOSTS="127.0.0.1",
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
        OX_VAR_DIR=str(tmp_path / "var"),
        OX_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY="1",
        OX_WORKER_PROCESSES="2",
        OX_WORKER_CONCURRENCY="2",
        OX_LOG_FORMAT="json",
    )
    return env


class Process:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._file = log.open("wb")
        self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=self._file, stderr=subprocess.STDOUT)

    def output(self) -> str:
        if not self._file.closed:
            self._file.flush()
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(timeout=10)
        finally:
            self._file.close()


@pytest.fixture
def processes():
    started: list[Process] = []
    yield started
    for p in started:  # each by its own pid, whatever the test did
        if p.proc.poll() is None:
            p.stop(timeout=10)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_gunicorn_and_worker_from_the_entrypoint(tmp_path, processes):
    port = free_port()
    env = production_env(tmp_path, port)
    base = f"http://127.0.0.1:{port}"
    web = Process([str(ENTRYPOINT), "web"], env, tmp_path / "web.log")
    processes.append(web)
    worker = Process([str(ENTRYPOINT), "worker"], env, tmp_path / "worker.log")
    processes.append(worker)

    def web_answers():
        assert web.proc.poll() is None, web.output()
        try:
            return get(f"{base}/accounts/login/", HTTPS, timeout=2)[0] == 200
        except OSError:
            return False

    wait_until(web_answers, timeout=90, interval=0.2)

    # A task enqueued here is run by the worker the entrypoint started.
    result = production_tasks.add.enqueue(2, 3)
    backend = task_backends["default"]
    wait_until(lambda: backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL, timeout=60)
    assert backend.get_result(result.id).return_value == 5

    status, headers, body = get(f"{base}/accounts/login/", HTTPS)
    assert status == 200 and b"csrfmiddlewaretoken" in body
    # A year of HSTS by default; includeSubDomains and preload only when asked for.
    assert headers["Strict-Transport-Security"] == "max-age=31536000"
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    cookie = headers.get("Set-Cookie", "")
    assert "csrftoken" in cookie and "Secure" in cookie

    status, headers, _ = get(f"{base}/accounts/login/")  # plain HTTP: sent to HTTPS
    assert status == 301 and headers["Location"].startswith("https://")

    status, _, body = get(f"{base}/no-such-page/", HTTPS)  # DEBUG is off: no technical page
    assert status == 404 and b"URLconf" not in body and b"Traceback" not in body

    # whitenoise serves collectstatic's content-hashed, compressed files, cacheable forever.
    manifest = json.loads((tmp_path / "static" / "staticfiles.json").read_text())
    hashed = manifest["paths"]["admin/css/base.css"]
    assert hashed != "admin/css/base.css"
    status, headers, body = get(f"{base}/static/{hashed}", {**HTTPS, "Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert "immutable" in headers["Cache-Control"] or "max-age=315360000" in headers["Cache-Control"]

    # The task proves one child worker is up, not both: wait for the second one to have started
    # (on a busy machine it can still be importing Django), or the SIGTERM below would reach a
    # child that has not set its signal handlers yet and the supervisor would not exit 0.
    wait_until(lambda: worker.output().count("worker started") >= 2, timeout=60, interval=0.2)
    assert web.stop() == 0, web.output()
    assert worker.stop() == 0, worker.output()
    # OX_LOG_FORMAT=json: the worker's log lines are JSON a collector can parse.
    lines = [json.loads(line) for line in worker.output().splitlines() if line.strip()]
    started = [entry for entry in lines if entry["message"].startswith("worker started")]
    assert len(started) == 2 and all(entry["logger"] == "ox.worker" for entry in started)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_x_forwarded_proto_is_believed_only_from_the_configured_proxies(tmp_path, processes):
    # Issue #16: Django trusted X-Forwarded-Proto from anyone who could reach the port. Now
    # gunicorn sets the scheme from it only for FORWARDED_ALLOW_IPS; here the proxy is at
    # 192.0.2.10, so the same header from 127.0.0.1 is a client's claim and is ignored.
    port = free_port()
    env = {**production_env(tmp_path, port), "FORWARDED_ALLOW_IPS": "192.0.2.10", "OX_MIGRATE_ON_START": "0"}
    web = Process([str(ENTRYPOINT), "web"], env, tmp_path / "web.log")
    processes.append(web)

    def answers():
        assert web.proc.poll() is None, web.output()
        try:
            return get(f"http://127.0.0.1:{port}/accounts/login/", timeout=2)[0]
        except OSError:
            return None

    wait_until(answers, timeout=90, interval=0.2)
    status, headers, _ = get(f"http://127.0.0.1:{port}/accounts/login/", HTTPS)
    assert status == 301 and headers["Location"].startswith("https://"), (status, web.output())
    assert "Strict-Transport-Security" not in headers  # sent over HTTPS only
    assert web.stop() == 0, web.output()


def run_settings_check(env):
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--deploy", "--fail-level", "ERROR"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_debug_off_without_a_secret_key_refuses_to_start(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "OX_"))}
    env.update(DJANGO_SETTINGS_MODULE="oxproject.settings", DJANGO_DEBUG="0", OX_VAR_DIR=str(tmp_path))
    done = run_settings_check(env)
    assert done.returncode != 0 and "DJANGO_SECRET_KEY must be set when DJANGO_DEBUG is off" in done.stderr
    env["DJANGO_SECRET_KEY"] = GOOD_KEY
    done = run_settings_check(env)
    assert done.returncode == 0, done.stderr


def test_production_settings_from_the_environment(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "OX_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="oxproject.settings",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=GOOD_KEY,
        DJANGO_ALLOWED_HOSTS="ox.example.com,.example.org",
        DJANGO_CSRF_TRUSTED_ORIGINS="https://ox.example.com",
        DATABASE_URL="postgres://ox:pw@db.internal:6543/oxdb",
        OX_VAR_DIR=str(tmp_path),
    )
    code = (
        "from django.conf import settings as s; import json; print(json.dumps({"
        "'debug': s.DEBUG, 'hosts': s.ALLOWED_HOSTS, 'csrf': s.CSRF_TRUSTED_ORIGINS,"
        "'db': [s.DATABASES['default'][k] for k in ('HOST', 'PORT', 'NAME', 'USER')],"
        "'secure': [s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS > 0],"
        "'static': s.STORAGES['staticfiles']['BACKEND']}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["debug"] is False and seen["hosts"] == ["ox.example.com", ".example.org"]
    assert seen["csrf"] == ["https://ox.example.com"]
    assert seen["db"] == ["db.internal", 6543, "oxdb", "ox"]
    assert seen["secure"] == [True, True, True, True]
    assert seen["static"] == "whitenoise.storage.CompressedManifestStaticFilesStorage"


def test_json_log_lines_carry_ox_fields():
    record = logging.LogRecord("ox.worker", logging.WARNING, __file__, 1, "attempt %s", ("failed",), None)
    record.ox_task_id = "0190-abc"
    record.ox_attempt = 2
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "attempt failed" and entry["level"] == "WARNING" and entry["logger"] == "ox.worker"
    assert entry["task_id"] == "0190-abc" and entry["attempt"] == 2 and entry["time"].endswith("+00:00")
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    assert "ValueError: boom" in json.loads(JsonFormatter().format(record))["exception"]


def compose_client() -> list[str] | None:
    import shutil

    if shutil.which("docker-compose"):
        return ["docker-compose"]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    return None


@pytest.mark.skipif(compose_client() is None, reason="no docker compose client on this machine")
def test_compose_file_is_valid_and_runs_the_entrypoint_commands():
    done = subprocess.run(
        [*compose_client(), "--env-file", ".env.example", "-f", "docker-compose.yml", "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    config = done.stdout
    assert "image: postgres:16" in config and "pgdata:/var/lib/postgresql/data" in config
    assert "pg_isready" in config and "condition: service_healthy" in config
    for mode in ("web", "worker"):  # the modes tested above through the same script
        assert f"command:\n    - {mode}\n" in config
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["/app/scripts/docker-entrypoint.sh"]' in dockerfile


def test_env_example_documents_every_variable_the_compose_file_reads():
    import re

    compose = (ROOT / "docker-compose.yml").read_text()
    example = (ROOT / ".env.example").read_text()
    documented = set(re.findall(r"^([A-Z_]+)=", example, re.MULTILINE))
    used = set(re.findall(r"\$\{([A-Z_]+)", compose))
    assert used <= documented, used - documented
