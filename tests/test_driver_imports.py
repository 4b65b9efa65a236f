"""A worker on SQLite or MariaDB never loads psycopg: libpq, libssl and Kerberos with it cost
~12 MiB of resident memory (bench's `mariadb_dispatch` idle_rss: 56.7 MiB before, ~45 after),
and nothing of them is used off PostgreSQL. ox.db.postgresql builds its psycopg cursor on
first use (ox/db/postgresql/prepared.py); this pins it over the whole of a worker's life, in
a fresh interpreter: the project's settings with every app, a task enqueued, run and read."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import sys
import django
django.setup()
from django.core.management import call_command
from django.tasks import task_backends, TaskResultStatus
import ox.admin, ox.management.commands.runworker, oxproject.urls  # the worker and the whole site's views
from ox.worker import Worker, WorkerSettings
from tests import tasks
r = tasks.echo.enqueue(7)
Worker(task_backends["default"], WorkerSettings(queues=["default"], batch=True)).run()
done = task_backends["default"].get_result(r.id)
assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 7, done.status
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("psycopg", "psycopg_binary", "psycopg_c", "psycopg_pool"))
print("loaded:", loaded)
"""


@pytest.mark.django_db(transaction=True)
def test_a_worker_off_postgresql_never_loads_psycopg():
    if connection.vendor == "postgresql":
        pytest.skip("on PostgreSQL psycopg is Django's own driver")
    from tests.conftest import database_url

    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded: []" in done.stdout, done.stdout
