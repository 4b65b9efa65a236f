"""./run as a developer runs it: DEBUG on because ./run says so (the settings default it off),
its files private (issue #16: var/db.sqlite3 was 0644 and another local user read a session
key from it), and a warning when OX_ADDR would expose the DEBUG server. Loopback only: the
warning is proven with an address of TEST-NET-1 that this machine does not have, so runserver
fails to bind and nothing listens beyond 127.0.0.1."""

import os
import signal
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

NOT_OURS = "192.0.2.1"  # TEST-NET-1 (RFC 5737): documentation only, never a local address


def run_env(tmp_path: Path, addr: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "OX_", "DATABASE_", "FORWARDED_"))}
    env.update(
        OX_ADDR=addr,
        OX_VAR_DIR=str(tmp_path / "var"),
        DJANGO_STATIC_ROOT=str(tmp_path / "static"),
        PYTHONUNBUFFERED="1",
    )
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class RunScript:
    """./run as a child process, stopped by its pid with the Ctrl-C it expects."""

    def __init__(self, env: dict[str, str], log: Path, tree: Path = ROOT) -> None:
        self.log = log
        self._file = log.open("wb")
        command = [str(tree / "run")]
        self.proc = subprocess.Popen(  # noqa: S603  (the project's own script)
            command,
            cwd=tree,
            env=env,
            stdout=self._file,
            stderr=subprocess.STDOUT,
            # As a terminal starts it: SIGINT at its default. A test run started in the
            # background (`cmd &` in a script) inherits SIGINT ignored, and a shell that starts
            # with a signal ignored cannot trap it: ./run would never see the Ctrl-C sent below.
            preexec_fn=_default_sigint,  # noqa: PLW1509  (only resets a signal, before exec)
        )
        self.seen_children: set[int] = set()

    def output(self) -> str:
        if not self._file.closed:
            self._file.flush()
        return self.log.read_text(errors="replace")

    def note_children(self) -> None:
        self.seen_children |= set(children(self.proc.pid))

    def stop(self) -> int | None:
        self.note_children()
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)  # what Ctrl-C sends; ./run stops its two servers
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait(timeout=10)
        for pid in self.seen_children:  # anything ./run started and left behind, by its pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._file.close()
        return code


@pytest.fixture
def started():
    runs: list[RunScript] = []
    yield runs
    for run in runs:
        if run.proc.poll() is None or not run._file.closed:
            run.stop()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:  # noqa: S310  (a local URL)
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for_login_page(run: RunScript, port: int) -> None:
    deadline = time.monotonic() + 240  # a fresh clone's first ./run installs the requirements
    while True:
        assert run.proc.poll() is None, run.output()
        assert time.monotonic() < deadline, run.output()
        run.note_children()
        try:
            status, _ = get(f"http://127.0.0.1:{port}/accounts/login/")
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)


def test_run_serves_debug_on_loopback_with_private_files(tmp_path, started):
    port = free_port()
    run = RunScript(run_env(tmp_path, f"127.0.0.1:{port}"), tmp_path / "run.log")
    started.append(run)
    wait_for_login_page(run, port)
    # DEBUG is on because ./run turned it on: a 404 is DEBUG's page, listing the URLconf.
    status, body = get(f"http://127.0.0.1:{port}/no-such-page/")
    assert status == 404 and b"URLconf" in body
    assert "WARNING: OX_ADDR" not in run.output()  # loopback: nothing to warn about
    var = tmp_path / "var"
    assert stat.S_IMODE(var.stat().st_mode) == 0o700
    for name in ("db.sqlite3", "secret_key"):
        assert stat.S_IMODE((var / name).stat().st_mode) == 0o600, name
    for side in var.glob("db.sqlite3-*"):  # WAL and shared memory while the servers run
        assert stat.S_IMODE(side.stat().st_mode) == 0o600, side.name
    assert "staff login: admin / " in run.output()
    # The demo's trickle (demo/apps.py: under ./run only): the overview's chart keeps moving.
    import sqlite3
    import time

    def trickled() -> int:
        with sqlite3.connect(var / "db.sqlite3") as conn:
            query = "SELECT count(*) FROM ox_task WHERE task_path = ? AND status = 'SUCCESSFUL'"
            return conn.execute(query, ["demo.tasks.trickle"]).fetchone()[0]

    deadline = time.monotonic() + 30
    while trickled() < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert trickled() >= 2, run.output()

    # The demo's workflows (demo_setup): the album's group called back once, the chain ran through.
    def published() -> list[tuple[str, str]]:
        with sqlite3.connect(var / "db.sqlite3") as conn:
            query = "SELECT task_path, status FROM ox_task WHERE task_path IN (?, ?) AND status = 'SUCCESSFUL'"
            return conn.execute(query, ["demo.tasks.publish", "demo.tasks.fetch_album"]).fetchall()

    deadline = time.monotonic() + 30
    while len(published()) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ("demo.tasks.publish", "SUCCESSFUL") in published(), run.output()
    assert run.stop() == 0, run.output()


@pytest.mark.parametrize(
    "addr",
    [
        f"{NOT_OURS}:{{port}}",  # runserver cannot bind an address this machine lacks
        "0.0.0.0",  # the example; without a port runserver refuses it before binding
    ],
)
def test_run_warns_when_the_debug_server_would_be_reachable_from_elsewhere(tmp_path, started, addr):
    addr = addr.format(port=free_port())
    run = RunScript(run_env(tmp_path, addr), tmp_path / "run.log")
    started.append(run)
    try:
        run.proc.wait(timeout=240)  # runserver gives up at once, and ./run ends with it
    except subprocess.TimeoutExpired:
        pytest.fail(run.output())
    output = run.output()
    assert f"WARNING: OX_ADDR={addr} exposes a DEBUG development server" in output, output
    assert "Error" in output  # and nothing ever listened
