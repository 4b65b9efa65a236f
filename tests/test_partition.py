"""A network partition: a worker cut from PostgreSQL without its TCP connection closing.

Worker A runs in its own network namespace, joined to this one by a veth pair, and reaches
PostgreSQL over it. Setting A's end of the pair down stops every packet and sends nothing:
no FIN, no RST, as when a cable is pulled or a host freezes. The system PostgreSQL listens
on 127.0.0.1 only, so the test brings its own throwaway cluster, listening on 127.0.0.1 and
on this namespace's veth address, and keeps everything (schema, tasks, checks) on it. A real
server rather than a TCP proxy: what is asserted is the server's own view of A's session
(pg_stat_activity, pg_locks), which a proxy would hide.

Needs root (ip netns, veth) and the PostgreSQL server binaries; skips otherwise, except with
CI=true, where it fails and says what is missing.
"""

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from glob import glob
from pathlib import Path

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from ox import sql
from ox.connection import open_worker_connection
from ox.db.postgresql.session import keepalive_settings
from tests.conftest import ROOT
from tests.helpers import wait_until

# ox's default keepalives: silent for 5 s, then 3 probes 2 s apart (tcp_user_timeout 11 s).
KEEPALIVE_BOUND = 5 + 2 * 3
SHORT = {"LEASE": 3, "HEARTBEAT": 0.5, "RESCUE_INTERVAL": 0.3}
TASK_SECONDS = 4  # A's body ends inside the partition: its outcome waits, then is fenced out


# ---------------------------------------------------------------- the keepalive settings


def test_keepalive_defaults_and_the_databases_own_options():
    assert keepalive_settings({}) == {
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": 11_000,
    }
    # Theirs win key by key (DATABASE_URL query strings give strings); the timeout follows.
    assert keepalive_settings({"keepalives_idle": "30", "keepalives_count": 5}) == {
        "keepalives_idle": 30,
        "keepalives_interval": 2,
        "keepalives_count": 5,
        "tcp_user_timeout": 40_000,
    }
    assert keepalive_settings({"tcp_user_timeout": 2500})["tcp_user_timeout"] == 2500
    assert keepalive_settings({"keepalives": "0", "keepalives_idle": 30}) is None
    with pytest.raises(ImproperlyConfigured, match="keepalives_idle"):
        keepalive_settings({"keepalives_idle": "soon"})


def server_settings(conn) -> dict[str, str]:
    with conn.cursor() as cursor:
        cursor.execute("SELECT name, setting FROM pg_settings WHERE name LIKE 'tcp%%'")
        return dict(cursor.fetchall())


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only: keepalives of worker connections")
def test_worker_connections_have_keepalives_on_both_ends():
    conn = open_worker_connection("default")
    try:
        if conn.connection.info.host.startswith("/"):
            pytest.skip("needs a TCP connection: over a Unix socket keepalives do not apply")
        params = conn.connection.info.get_parameters()
        assert {
            k: params.get(k) for k in ("keepalives", "keepalives_idle", "keepalives_count", "tcp_user_timeout")
        } == {
            "keepalives": "1",
            "keepalives_idle": "5",
            "keepalives_count": "3",
            "tcp_user_timeout": "11000",
        }
        expected = {
            "tcp_keepalives_idle": "5",
            "tcp_keepalives_interval": "2",
            "tcp_keepalives_count": "3",
            "tcp_user_timeout": "11000",
        }
        assert server_settings(conn) == expected
        conn.close()
        conn.connect()  # a reconnect of the same wrapper gets them again
        assert server_settings(conn) == expected
    finally:
        conn.close()


OVERRIDDEN = """
import json, django
django.setup()
from ox.connection import open_worker_connection
conn = open_worker_connection("default")
with conn.cursor() as cursor:
    cursor.execute("SELECT name, setting FROM pg_settings WHERE name LIKE 'tcp%'")
    server = dict(cursor.fetchall())
print(json.dumps({"server": server, "client": conn.connection.info.get_parameters()}))
"""


@pytest.mark.django_db
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only: keepalives of worker connections")
def test_the_databases_own_keepalive_options_win_on_both_ends(worker_env):
    url = worker_env["DATABASE_URL"] + "?keepalives_idle=30&tcp_user_timeout=1234"
    out = subprocess.run(
        [sys.executable, "-c", OVERRIDDEN],
        cwd=ROOT,
        env={**worker_env, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["server"]["tcp_keepalives_idle"] == "30" and seen["server"]["tcp_user_timeout"] == "1234"
    assert seen["server"]["tcp_keepalives_count"] == "3"  # ox's default where theirs is unset
    assert (seen["client"]["keepalives_idle"], seen["client"]["tcp_user_timeout"]) == ("30", "1234")


# ---------------------------------------------------------------- the partition


def require(ok: bool, why: str) -> None:
    """Skip without what the partition test needs; with CI=true, fail and say so."""
    if ok:
        return
    if os.environ.get("CI") == "true":
        needs = "root with CAP_NET_ADMIN, iproute2 (.ci/run installs it), the PostgreSQL server binaries"
        pytest.fail(f"{why}; with CI=true this test must run: it needs {needs}")
    pytest.skip(why)


def run(*cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


@dataclass
class Netns:
    """A network namespace joined to this one by a veth pair: host_ip here, ns_ip in it."""

    name: str
    host_dev: str
    ns_dev: str
    host_ip: str
    ns_ip: str

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def set_link(self, state: str) -> None:
        out = run(*self.exec_prefix(), "ip", "link", "set", "dev", self.ns_dev, state)
        assert out.returncode == 0, out.stderr


@pytest.fixture
def netns() -> Iterator[Netns]:
    require(os.geteuid() == 0, "needs root: it makes a network namespace and a veth pair")
    require(shutil.which("ip") is not None, "needs `ip` (iproute2) for `ip netns`")
    pid = os.getpid()
    # One /30 per test process, so concurrent runs on one machine do not collide.
    base = 4 * (pid % 16384)
    prefix = f"10.213.{base // 256}.{base % 256}"
    host_ip, ns_ip = f"10.213.{base // 256}.{base % 256 + 1}", f"10.213.{base // 256}.{base % 256 + 2}"
    ns = Netns(f"oxpart{pid}", f"oxh{pid}", f"oxw{pid}", host_ip, ns_ip)
    added = run("ip", "netns", "add", ns.name)
    require(added.returncode == 0, f"`ip netns add` failed (needs CAP_NET_ADMIN): {added.stderr.strip()}")
    try:
        steps = [
            ["ip", "link", "add", ns.host_dev, "type", "veth", "peer", "name", ns.ns_dev],
            ["ip", "link", "set", ns.ns_dev, "netns", ns.name],
            ["ip", "addr", "add", f"{host_ip}/30", "dev", ns.host_dev],
            ["ip", "link", "set", ns.host_dev, "up"],
            [*ns.exec_prefix(), "ip", "addr", "add", f"{ns_ip}/30", "dev", ns.ns_dev],
            [*ns.exec_prefix(), "ip", "link", "set", ns.ns_dev, "up"],
            [*ns.exec_prefix(), "ip", "link", "set", "lo", "up"],
        ]
        for step in steps:
            out = run(*step)
            require(out.returncode == 0, f"`{' '.join(step)}` failed: {out.stderr.strip()} ({prefix}/30)")
        yield ns
    finally:
        run("ip", "link", "del", ns.host_dev)  # takes its peer with it
        run("ip", "netns", "del", ns.name)


def postgres_bin() -> Path | None:
    found = sorted(glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3].split(".")[0]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    port: int
    log: Path
    dbname: str = "ox_partition"

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def url(self, host: str) -> str:
        return f"postgres://postgres@{host}:{self.port}/{self.dbname}"

    def connect(self, dbname: str | None = None) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=dbname or self.dbname, autocommit=True
        )


@pytest.fixture
def cluster(netns: Netns) -> Iterator[Cluster]:
    """A throwaway PostgreSQL cluster listening on 127.0.0.1 and on the veth's host end, its
    database migrated. The server's keepalive settings are left at their defaults (the OS's:
    two hours): any shorter bound comes from what ox's worker connections set themselves."""
    bindir = postgres_bin()
    require(bindir is not None, "needs the PostgreSQL server binaries (initdb, pg_ctl)")
    try:
        owner = pwd.getpwnam("postgres")
    except KeyError:
        owner = None
    require(owner is not None, "needs a `postgres` OS user to run initdb as (it refuses root)")
    assert bindir is not None and owner is not None
    top = Path(tempfile.mkdtemp(prefix="ox-partition-pg-"))
    os.chown(top, owner.pw_uid, owner.pw_gid)
    data, log = top / "data", top / "server.log"

    def as_postgres(*cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run("runuser", "-u", "postgres", "--", *cmd, timeout=timeout)

    port = free_port()
    started = False
    try:
        out = as_postgres(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-N", "-E", "UTF8")
        assert out.returncode == 0, out.stdout + out.stderr
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1,{netns.host_ip}'\nport = {port}\n"
                f"unix_socket_directories = '{top}'\nfsync = off\nsynchronous_commit = off\n"
                "full_page_writes = off\nlog_connections = on\nlog_disconnections = on\n"
            )
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all postgres {netns.ns_ip}/32 trust\n")
        out = as_postgres(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "30", "start")
        started = out.returncode == 0
        assert started, out.stdout + out.stderr + (log.read_text() if log.exists() else "")
        c = Cluster(port, log)
        with c.connect("postgres") as admin:
            admin.execute(f"CREATE DATABASE {c.dbname}")
        env = {**os.environ, "DATABASE_URL": c.url("127.0.0.1"), "DJANGO_SETTINGS_MODULE": "tests.settings"}
        out = subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        yield c
    finally:
        if started:  # the postmaster this fixture started (pg_ctl signals the pid in its data dir)
            as_postgres(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop")
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def db(cluster: Cluster) -> Iterator[psycopg.Connection]:
    """This test's own session on the private cluster, to look at rows and at the server."""
    with cluster.connect() as conn:
        yield conn


def wait_for(predicate: Callable[[], object], timeout: float, context: Callable[[], str]) -> object:
    """wait_until, and what went on (worker logs...) when it times out."""
    try:
        return wait_until(predicate, timeout=timeout, interval=0.1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{context()}") from None


def enqueue(url: str, call: str) -> str:
    """Enqueue on the private cluster from a subprocess (this process's Django database is
    the suite's test database); returns the task id."""
    code = f"import django\ndjango.setup()\nfrom tests import tasks\nprint(tasks.{call}.id)"
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="runs in the PostgreSQL leg only (it brings its own PostgreSQL cluster: once is enough)",
)
def test_partitioned_worker_is_rescued_fenced_out_and_dropped_by_the_server(netns, cluster, db, start_worker):
    def one(query: str, *params: object) -> tuple | None:
        return db.execute(query, params).fetchone()

    def task(task_id: str) -> tuple | None:
        return one("SELECT status, worker_id, fence, finished_at, return_value FROM ox_task WHERE id = %s", task_id)

    def worker_row(pid: int) -> tuple | None:
        return one("SELECT id, lock_key FROM ox_worker WHERE pid = %s AND stopped_at IS NULL", pid)

    short = {"OX_TEST_OPTIONS": json.dumps(SHORT)}
    # Worker A, in the namespace: it reaches the server only over the veth pair.
    a = start_worker(
        "--concurrency", "1", env={"DATABASE_URL": cluster.url(netns.host_ip), **short}, prefix=netns.exec_prefix()
    )
    t1 = enqueue(cluster.url("127.0.0.1"), f"record_then_sleep.enqueue('partition', {TASK_SECONDS})")
    started = "SELECT 1 FROM testapp_ledger WHERE key = 'partition' AND pid = %s"
    wait_for(lambda: one(started, a.pid), 30, a.output)  # A's body is running
    a_id, a_key = worker_row(a.pid)
    assert task(t1)[:2] == ("RUNNING", a_id)
    # A's sessions as the server sees them: the claims session holds the liveness lock, the
    # other LISTENs; both come from the namespace's address.
    lock = (
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND classid = %s::oid AND objid = %s::oid"
        " AND objsubid = 2"
    )
    (holder,) = one(lock, sql.LOCK_NAMESPACE, a_key)
    listening = wait_until(
        lambda: one(
            "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN ox_task' AND client_addr = %s", netns.ns_ip
        ),
        timeout=10,
    )
    sessions = [holder, listening[0]]
    assert one(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND client_addr = %s", sessions, netns.ns_ip
    ) == (2,)

    netns.set_link("down")  # silent: no FIN, no RST; A's sockets stay open on both ends
    cut = time.monotonic()
    seen: dict[str, float] = {}  # event -> seconds after the cut

    def observe() -> bool:
        after = time.monotonic() - cut
        if "dropped" not in seen and one("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", sessions) == (0,):
            seen["dropped"] = after
        if "finished" not in seen and task(t1)[0] == "SUCCESSFUL":
            seen["finished"] = after
        return len(seen) == 2

    try:
        b = start_worker("--concurrency", "1", env={"DATABASE_URL": cluster.url("127.0.0.1"), **short})
        # Both while the link is down: A's lease (3 s) runs out, B's rescuer takes the task back
        # and B runs it to the end; and the server ends A's dead sessions by itself (the
        # keepalives ox set on them), with them A's liveness lock, not after the OS's 2 hours.
        bound = KEEPALIVE_BOUND + TASK_SECONDS + 20
        wait_for(observe, bound, lambda: f"{seen}\n{a.output()}\n{b.output()}\n{cluster.log_tail()}")
        assert one(lock, sql.LOCK_NAMESPACE, a_key) is None
    finally:
        netns.set_link("up")
    done = task(t1)
    assert done[1] == worker_row(b.pid)[0], (done, a.output(), b.output())
    # Nothing told the server before the keepalives gave up (the partition is silent), and
    # it did not wait much longer than they allow.
    assert 3 < seen["dropped"] < KEEPALIVE_BOUND + 6, (seen, cluster.log_tail())

    # A comes back: its lease was taken, so its late outcome is fenced out and it says so.
    wait_for(lambda: "fenced out" in a.output(), 30, a.output)
    assert task(t1) == done  # B's result, B's fence, B's finish time
    assert db.execute("SELECT worker_id, outcome FROM ox_attempt WHERE task_id = %s", [t1]).fetchall() == [
        (a_id, "lost")
    ]
    ran = {pid for (pid,) in db.execute("SELECT pid FROM testapp_ledger WHERE key = 'partition'").fetchall()}
    assert ran == {a.pid, b.pid}  # at least once: A's body ran too, only B's outcome counts

    # ...and A keeps working: with B gone, A runs the next task.
    b.signal(signal.SIGTERM)
    assert b.wait(timeout=30) == 0, b.output()
    t2 = enqueue(cluster.url("127.0.0.1"), "record.enqueue('after')")
    wait_for(lambda: task(t2)[0] == "SUCCESSFUL", 30, a.output)
    assert task(t2)[1] == a_id
    back = one(f"SELECT host(client_addr) FROM pg_stat_activity WHERE pid = ({lock})", sql.LOCK_NAMESPACE, a_key)
    assert back == (netns.ns_ip,)  # A holds its liveness lock again, on a new session
    a.signal(signal.SIGTERM)
    assert a.wait(timeout=30) == 0, a.output()
    print(f"after the cut: finished by B at {seen['finished']:.1f} s, A's sessions dropped at {seen['dropped']:.1f} s")
