"""What README "What the worker promises" and docs/deployment.md say about shutdown, exit codes,
connections and tasks blocked in C calls, proved on real `runworker` subprocesses."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from django.db import connection

from ox.models import Attempt, Outcome, Status, Task, Worker
from tests import gated_tasks, tasks
from tests.conftest import ROOT
from tests.helpers import wait_until
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def options(**values):
    return {"OX_TEST_OPTIONS": json.dumps({k.upper(): v for k, v in values.items()})}


def status_of(r):
    return Task.objects.get(pk=r.id).status


# ---------------------------------------------------------------- exit codes


def test_sigterm_with_a_task_past_the_grace_exits_1_and_the_task_is_rescued(start_worker, tmp_path):
    gate = tmp_path / "gate"
    r = gated_tasks.hold.enqueue("started", str(gate))
    # A short lease so that SQLite (no liveness lock) rescues within the test too.
    env = options(shutdown_grace=0.5, lease=2.0, heartbeat=0.5)
    first = start_worker("--concurrency", "1", env=env)
    wait_until(lambda: Ledger.objects.filter(key="started").exists(), timeout=30)
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=30) == 1, first.output()
    assert "worker left a task running" in first.output()
    assert status_of(r) == Status.RUNNING  # until a rescuer takes it back
    gate.touch()  # the second run finishes at once
    second = start_worker("--concurrency", "1", env=env)
    wait_until(lambda: status_of(r) == Status.SUCCESSFUL, timeout=60)
    assert list(Attempt.objects.filter(task_id=r.id).values_list("outcome", flat=True)) == [Outcome.LOST]
    second.signal(signal.SIGTERM)
    assert second.wait(timeout=30) == 0, second.output()


def test_supervisor_exits_1_when_a_child_exits_nonzero(start_worker, tmp_path):
    gate = tmp_path / "gate"
    r = gated_tasks.hold.enqueue("started", str(gate))
    supervisor = start_worker("--processes", "2", env=options(shutdown_grace=0.5))
    wait_until(lambda: Ledger.objects.filter(key="started").exists(), timeout=30)
    wait_until(lambda: Worker.objects.filter(stopped_at__isnull=True).count() == 2, timeout=30)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 1, supervisor.output()
    assert "worker exit codes [" in supervisor.output() and "1" in supervisor.output().split("worker exit codes")[1]
    assert status_of(r) == Status.RUNNING
    gate.touch()


STUBBORN_CHILD = textwrap.dedent(
    """
    import signal, sys, time
    if sys.argv[1] == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print("child ready", flush=True)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        time.sleep(0.05)
    """
)


def run_supervisor(tmp_path: Path, modes: list[str], grace: float) -> tuple[int, float, str]:
    """ox.supervisor.Supervisor over stand-in children (one per mode): SIGTERM once they are
    up, return (exit code, seconds from the signal to the exit, output)."""
    child = tmp_path / "child.py"
    child.write_text(STUBBORN_CHILD)
    # Each child gets its own mode: the supervisor passes one command to all, so a tiny
    # launcher picks the mode by the order the children start in.
    launcher = tmp_path / "launcher.py"
    launcher.write_text(
        textwrap.dedent(
            f"""
            import os, sys
            counter = {str(tmp_path / "count")!r}
            with open(counter, "a") as f:
                f.write("x")
            n = len(open(counter).read()) - 1
            modes = {modes!r}
            os.execv(sys.executable, [sys.executable, {str(child)!r}, modes[min(n, len(modes) - 1)]])
            """
        )
    )
    script = (
        "import logging, sys; logging.basicConfig(level=logging.INFO);"
        "from ox.supervisor import Supervisor;"
        f"sys.exit(Supervisor([sys.executable, {str(launcher)!r}], {len(modes)}, {grace}).run())"
    )
    log = tmp_path / "supervisor.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: log.read_text().count("child ready") == len(modes), timeout=30)
            sent = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            code = proc.wait(timeout=grace + 30)
            return code, time.monotonic() - sent, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def test_supervisor_exits_0_when_every_child_exits_0(tmp_path):
    code, elapsed, output = run_supervisor(tmp_path, ["obey", "obey"], grace=0.5)
    assert code == 0, output
    assert elapsed < 5, output


def test_supervisor_kills_a_child_still_running_grace_plus_5_s_after_the_signal(tmp_path):
    code, elapsed, output = run_supervisor(tmp_path, ["obey", "ignore"], grace=0.5)
    assert code == 1, output
    assert "-9" in output.split("worker exit codes")[1], output  # SIGKILLed
    assert 0.5 + 5 - 0.2 <= elapsed < 0.5 + 5 + 5, (elapsed, output)


# ---------------------------------------------------------------- tasks blocked in C


def test_a_task_blocked_in_a_c_call_is_interrupted_only_when_the_call_returns(start_worker):
    r = tasks.blocks_in_sleep.enqueue(2.0)  # timeout 0.3 s; no bytecode runs until the sleep returns
    worker = start_worker("--batch", env=options(interrupt_grace=10))
    assert worker.wait(timeout=60) == 0, worker.output()
    (attempt,) = Attempt.objects.filter(task_id=r.id)
    assert attempt.outcome == Outcome.TIMED_OUT and status_of(r) == Status.FAILED
    assert (attempt.finished_at - attempt.started_at).total_seconds() >= 1.9  # not 0.3


def test_a_task_blocked_past_the_interrupt_grace_makes_the_worker_exit_3(start_worker):
    r = tasks.blocks_in_sleep.enqueue(20.0)
    worker = start_worker(env=options(interrupt_grace=1.0))
    started = time.monotonic()
    assert worker.wait(timeout=60) == 3, worker.output()
    assert time.monotonic() - started < 15  # it did not wait for the sleep to return
    assert status_of(r) == Status.RUNNING  # left for the rescuer


# ---------------------------------------------------------------- connections


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _local_tcp_ports(pid: int) -> set[int]:
    """Local ports of the TCP sockets process `pid` has open (Linux /proc)."""
    inodes = _socket_inodes(pid)
    ports = set()
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def postgres_sessions_of(pid: int) -> int:
    ports = _local_tcp_ports(pid)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT client_port FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return sum(1 for (port,) in cursor.fetchall() if port in ports)


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="counts a process's sockets through Linux /proc")
@pytest.mark.parametrize(("conn_max_age", "after_a_task"), [("0", 2), ("60", 3)])
def test_an_idle_worker_holds_two_postgres_sessions(start_worker, conn_max_age, after_a_task):
    worker = start_worker("--concurrency", "4", env={"CONN_MAX_AGE": conn_max_age})
    wait_until(lambda: "worker started" in worker.output(), timeout=30)
    assert postgres_sessions_of(worker.pid) == 2, worker.output()  # its own and the LISTEN one
    # A task that writes opens its thread's own Django connection, which Django's usual
    # CONN_MAX_AGE rule closes after the task (0) or keeps for the thread's next task (60).
    tasks.record.enqueue("warm")
    wait_until(lambda: Task.objects.filter(status=Status.SUCCESSFUL).exists(), timeout=30)
    time.sleep(1.5)  # idle: a few polls, heartbeats and rescue rounds
    seen = set()
    for _ in range(5):
        seen.add(postgres_sessions_of(worker.pid))
        time.sleep(0.2)
    assert seen == {after_a_task}, (seen, worker.output())
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()


@pytest.mark.skipif("connection.vendor != 'postgresql'")
@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="counts a process's sockets through Linux /proc")
def test_the_supervisor_holds_no_session_of_its_own(start_worker):
    supervisor = start_worker("--processes", "2")
    wait_until(lambda: Worker.objects.filter(stopped_at__isnull=True).count() == 2, timeout=30)
    children = list(Worker.objects.values_list("pid", flat=True))
    wait_until(lambda: [postgres_sessions_of(pid) for pid in children] == [2, 2], timeout=10)
    assert postgres_sessions_of(supervisor.pid) == 0
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0, supervisor.output()
