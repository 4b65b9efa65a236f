"""A real PgBouncer for tests/test_pgbouncer.py: a fixture that starts one (by pid, on a free
port of 127.0.0.1) in front of the test database, workers and producers connected through it,
and what the tests read off the server."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from ox import sql
from ox.models import Status, Task
from tests.conftest import ROOT, WorkerProcess

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
SETTINGS = "tests.settings_pgbouncer"
POOLED = {"POOLER": "transaction"}
# The worker's liveness lock is (LOCK_NAMESPACE, lock_key > 0); the rescuer's and the pruner's
# transaction locks use the second keys 0 and -1 (as an oid, 2**32 - 1).
WORKER_LOCKS_SQL = (
    "SELECT pid, objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2"
    f" AND classid = {sql.LOCK_NAMESPACE} AND objid::bigint NOT IN (0, 4294967295)"
    # this test's database only: other test runs share the server
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def require(ok: bool, why: str) -> None:
    """Skip without PgBouncer or PostgreSQL; with CI=true, fail and say so."""
    if ok:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}; with CI=true this test must run: it needs pgbouncer (.ci/run installs it) and PostgreSQL")
    pytest.skip(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Bouncer:
    port: int
    dbname: str
    user: str
    proc: subprocess.Popen[bytes]
    log: Path
    workdir: Path

    @property
    def url(self) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{self.dbname}"

    def connect(self, dbname: str | None = None) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user=self.user, dbname=dbname or self.dbname, autocommit=True
        )

    def admin(self, command: str) -> list[dict[str, object]]:
        """A SHOW command on PgBouncer's admin console."""
        with self.connect("pgbouncer") as conn, conn.cursor() as cur:
            cur.execute(command)
            names = [d.name for d in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def transactions(self) -> int:
        """Transactions PgBouncer has passed to the test database so far."""
        rows = [r for r in self.admin("SHOW STATS") if r["database"] == self.dbname]
        return int(rows[0]["total_xact_count"]) if rows else 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: PgBouncer's fast exit
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _write_config(workdir: Path, port: int, pool_mode: str, pool_size: int) -> Path:
    s = connection.settings_dict
    host, server_port, user = s.get("HOST") or "127.0.0.1", s.get("PORT") or 5432, s["USER"]
    password = f" password={s['PASSWORD']}" if s.get("PASSWORD") else ""
    (workdir / "users.txt").write_text(f'"{user}" ""\n')
    ini = workdir / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"{s['NAME']} = host={host} port={server_port} dbname={s['NAME']} user={user}{password}"
        f" pool_size={pool_size}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {workdir / 'users.txt'}\nadmin_users = {user}\n"
        f"pool_mode = {pool_mode}\nmax_client_conn = 200\n"
        # Clients wait for a free server connection rather than fail (pools are tiny here).
        "query_wait_timeout = 60\n"
    )
    return ini


@pytest.fixture(name="pgbouncer")
def pgbouncer_fixture(tmp_path) -> Iterator[Callable[..., Bouncer]]:
    """Start PgBouncer in front of the test database: start(pool_mode=..., pool_size=...).
    Each one is stopped (by its pid) at teardown."""
    if connection.vendor != "postgresql":
        # Not a failure under CI either: ./test's SQLite leg; the PostgreSQL leg runs these.
        pytest.skip("PgBouncer tests need PostgreSQL as the test database")
    require(os.access(PGBOUNCER, os.X_OK), f"{PGBOUNCER} is not installed")
    started: list[Bouncer] = []

    def start(pool_mode: str = "transaction", pool_size: int = 4) -> Bouncer:
        # Its own folder, readable by the user PgBouncer drops to when run as root (it refuses
        # to run as root itself).
        workdir = Path(tempfile.mkdtemp(prefix="ox-pgbouncer-"))
        workdir.chmod(0o755)
        for _try in range(3):  # a free port can be taken between the probe and the bind
            port = free_port()
            ini = _write_config(workdir, port, pool_mode, pool_size)
            log = tmp_path / f"pgbouncer-{len(started)}.log"
            user = ["-u", "nobody"] if os.geteuid() == 0 else []
            with log.open("wb") as out:
                proc = subprocess.Popen([PGBOUNCER, *user, str(ini)], stdout=out, stderr=subprocess.STDOUT)
            s = connection.settings_dict
            bouncer = Bouncer(port, s["NAME"], s["USER"], proc, log, workdir)
            deadline = time.monotonic() + 10
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    with bouncer.connect() as conn:
                        conn.execute("SELECT 1")
                    started.append(bouncer)
                    return bouncer
                except psycopg.OperationalError:
                    time.sleep(0.1)
            bouncer.stop()
        pytest.fail(f"PgBouncer did not answer: {log.read_text(errors='replace')[-2000:]}")

    yield start
    for bouncer in started:
        bouncer.stop()


@pytest.fixture(name="through")
def through_fixture(worker_env, start_worker) -> Callable[..., WorkerProcess]:
    """Start a worker whose every connection (its own, its task threads') goes through `bouncer`."""

    def start(bouncer: Bouncer, *args: str, options: dict[str, object] | None = None, **env: str) -> WorkerProcess:
        return start_worker(
            *args,
            env={
                "DATABASE_URL": bouncer.url,
                "DJANGO_SETTINGS_MODULE": SETTINGS,
                "OX_TEST_OPTIONS": json.dumps(options if options is not None else POOLED),
                **env,
            },
        )

    return start


def produce(bouncer: Bouncer, code: str, worker_env: dict[str, str]) -> str:
    """Run `code` in a fresh Django process (a producer: a web process, a script) connected
    through `bouncer`."""
    env = {**worker_env, "DATABASE_URL": bouncer.url, "DJANGO_SETTINGS_MODULE": SETTINGS}
    done = subprocess.run(
        [sys.executable, "-c", "import django\ndjango.setup()\n" + code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def worker_locks() -> list[tuple[int, int]]:
    with connection.cursor() as cursor:
        cursor.execute(WORKER_LOCKS_SQL)
        return list(cursor.fetchall())


def live(*statuses: str) -> int:
    return Task.objects.filter(status__in=statuses or (Status.READY, Status.RUNNING)).count()


def listening_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN ox_task'"
        )
        return cursor.fetchone()[0]
