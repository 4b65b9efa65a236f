"""`ox` on its own: the distribution this repository builds (pyproject.toml) installed into a
bare Django project that has no dashboard, no demo and none of oxproject's settings, where a
task is enqueued and a worker runs it. Also the upgrade path ox/CHANGELOG.md describes: back to
0.1.0's last migration and forward again with `manage.py migrate`.

The wheel is built from this checkout (pip, with setuptools fetched for the build) and
installed with `--target` into a directory of its own; the bare project's processes run with
only that directory on PYTHONPATH and their working directory outside this checkout, so the
`ox` they import is the installed one (checked)."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

SETTINGS = """
SECRET_KEY = "standalone-test-key-not-secret-0123456789abcdef"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django.contrib.admin",
                  "django.contrib.sessions", "django.contrib.messages", "ox", "jobs"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": DB,
                         "OPTIONS": {"init_command": "PRAGMA journal_mode=WAL;"}}}
TASKS = {"default": {"BACKEND": "ox.backend.OxBackend", "QUEUES": ["default"]}}
ROOT_URLCONF = "urls"
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
              "OPTIONS": {"context_processors": ["django.contrib.auth.context_processors.auth",
                                                 "django.contrib.messages.context_processors.messages",
                                                 "django.template.context_processors.request"]}}]
MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware",
              "django.contrib.auth.middleware.AuthenticationMiddleware",
              "django.contrib.messages.middleware.MessageMiddleware"]
"""

JOBS = """
from django.tasks import task

@task
def double(n: int) -> int:
    return 2 * n
"""

SCRIPT = """
import json, sys
import django
django.setup()
import ox
from jobs.tasks import double
if sys.argv[1] == "enqueue":
    print(json.dumps({"id": double.enqueue(21).id, "ox": ox.__file__, "version": ox.__version__}))
else:
    result = double.get_result(sys.argv[2])
    print(json.dumps({"status": result.status, "value": result.return_value}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    # Built from a copy of what the distribution is made of: a build in the checkout would
    # leave build/ and an egg-info behind.
    source = tmp_path_factory.mktemp("source")
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copytree(ROOT / "ox", source / "ox", ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"]
    subprocess.run([*pip, "--target", str(target), str(source)], check=True, timeout=600, cwd=target)
    return target


def project(tmp: Path, site: Path) -> tuple[Path, dict[str, str]]:
    (tmp / "jobs").mkdir()
    (tmp / "jobs" / "__init__.py").write_text("")
    (tmp / "jobs" / "tasks.py").write_text(JOBS)
    (tmp / "settings.py").write_text(f"DB = {str(tmp / 'db.sqlite3')!r}\n" + SETTINGS)
    (tmp / "urls.py").write_text(
        "from django.contrib import admin\nfrom django.urls import path\n"
        "urlpatterns = [path('admin/', admin.site.urls)]\n"
    )
    (tmp / "manage.py").write_text(
        "import sys\nfrom django.core.management import execute_from_command_line\n"
        "execute_from_command_line(sys.argv)\n"
    )
    (tmp / "script.py").write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PYTHONPATH", "OX_TEST_OPTIONS")}
    env |= {"PYTHONPATH": f"{tmp}{os.pathsep}{site}", "DJANGO_SETTINGS_MODULE": "settings"}
    return tmp, env


def run(tmp: Path, env: dict[str, str], *args: str, timeout: float = 120) -> str:
    done = subprocess.run([sys.executable, *args], cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_package_holds_ox_alone_with_its_migrations_templates_and_changelog(installed):
    names = sorted(p.name for p in installed.iterdir() if not p.name.endswith((".dist-info", "__pycache__")))
    assert names == ["ox"], names  # no dashboard, demo, oxproject or tests
    for part in (
        "migrations/0016_mysql_unique.py",
        "templates/admin/ox/task/actions.html",
        "static/ox/admin.css",
        "CHANGELOG.md",
        "management/commands/runworker.py",
        "db/mysql/wake.py",
    ):
        assert (installed / "ox" / part).is_file(), part
    (meta,) = installed.glob("ox_tasks-*.dist-info")
    import ox

    assert meta.name == f"ox_tasks-{ox.__version__}.dist-info"
    assert f"## {ox.__version__} " in (installed / "ox" / "CHANGELOG.md").read_text()


def test_a_bare_project_runs_a_task_with_the_installed_ox(installed, tmp_path):
    tmp, env = project(tmp_path, installed)
    run(tmp, env, "manage.py", "check", "--fail-level", "WARNING")
    run(tmp, env, "manage.py", "migrate", "--no-input")
    enqueued = json.loads(run(tmp, env, "script.py", "enqueue"))
    assert enqueued["ox"].startswith(str(installed)), enqueued  # not this checkout's ox
    run(tmp, env, "manage.py", "runworker", "--batch", timeout=120)
    result = json.loads(run(tmp, env, "script.py", "result", enqueued["id"]))
    assert result == {"status": "SUCCESSFUL", "value": 42}


def test_an_upgrade_from_0_1_0_is_manage_py_migrate(installed, tmp_path):
    """0.1.0's schema is ox's migrations up to 0006 (ox/CHANGELOG.md): from there `migrate`
    applies the rest, and a task runs. Going back to 0006 first (every later migration
    reversed) is part of the test."""
    tmp, env = project(tmp_path, installed)
    run(tmp, env, "manage.py", "migrate", "--no-input")
    run(tmp, env, "manage.py", "migrate", "ox", "0006", "--no-input")
    shown = run(tmp, env, "manage.py", "showmigrations", "ox")
    assert "[X] 0006_finished_index" in shown and "[ ] 0007_claim_kind_and_liveness" in shown
    out = run(tmp, env, "manage.py", "migrate", "--no-input")
    assert "Applying ox.0016_mysql_unique... OK" in out
    assert "[ ]" not in run(tmp, env, "manage.py", "showmigrations", "ox")
    enqueued = json.loads(run(tmp, env, "script.py", "enqueue"))
    run(tmp, env, "manage.py", "runworker", "--batch", timeout=120)
    assert json.loads(run(tmp, env, "script.py", "result", enqueued["id"]))["status"] == "SUCCESSFUL"
