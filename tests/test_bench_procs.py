"""The harness's process handling (bench.procs, bench.producer): only what it started is
counted or signalled, and every wait is bounded."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench import procs, producer


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pids: list[int], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_remembered_pid_now_held_by_another_process_is_neither_counted_nor_killed(tmp_path):
    # A descendant seen once exits and the kernel gives its pid to an unrelated process: the
    # harness must not add that process's memory to the arm's, nor SIGKILL it when the arm stops.
    worker = procs.spawn(
        [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), tmp_path / "w", "w", tmp_path
    )
    stranger = subprocess.Popen([sys.executable, "-c", "b = bytearray(64 << 20); import time; time.sleep(60)"])  # noqa: S603
    try:
        deadline = time.monotonic() + 10
        while procs._status_kb(stranger.pid, "VmRSS") < 60_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        own = procs.rss_kb([worker])
        started = procs._stat(stranger.pid)[2]
        worker.children[stranger.pid] = started - 1  # seen once, as a process that started earlier
        assert procs.rss_kb([worker]) < own + 30_000
        assert stranger.pid not in worker.children  # forgotten once found to be another process
        worker.children[stranger.pid] = started - 1
        procs.kill(worker)
        assert not worker.alive()
        time.sleep(0.2)
        assert stranger.poll() is None, "a process the harness never started was killed"
    finally:
        stranger.kill()
        stranger.wait()
        procs.kill(worker)


def test_a_remembered_descendant_still_running_is_counted_and_killed(tmp_path):
    # The other side: a descendant that is still the process seen stays counted and is ended.
    script = "import os, time\nif os.fork() == 0:\n    b = bytearray(64 << 20); time.sleep(60)\ntime.sleep(60)\n"
    worker = procs.spawn([sys.executable, "-c", script], dict(os.environ), tmp_path / "w", "w", tmp_path)
    deadline = time.monotonic() + 10
    while procs.rss_kb([worker]) < 70_000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs.rss_kb([worker]) >= 70_000
    (child,) = worker.children
    procs.kill(worker)
    _wait_gone([child])
    assert not _alive(child)


def test_kill_tree_ends_an_orphan_left_in_a_workers_process_group(tmp_path):
    # An agent that timed out: its worker (a group of its own, as spawn() makes it) left a
    # double-forked orphan behind, which is no longer anyone's descendant but is still in the
    # worker's group. Killing the agent's descendants alone left such orphans running.
    pidfile = tmp_path / "orphan"
    worker_code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    if os.fork() == 0:\n"
        f"        open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    agent_code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {worker_code!r}], start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    agent = subprocess.Popen([sys.executable, "-c", agent_code])  # noqa: S603
    try:
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        orphan = int(pidfile.read_text())
        assert orphan not in procs.descendants(agent.pid)
        procs.kill_tree(agent.pid)
        _wait_gone([orphan])
        assert not _alive(orphan)
    finally:
        agent.kill()
        agent.wait()
        _kill_recorded(pidfile)


def test_a_producer_reads_a_go_file_written_late_and_gives_up_on_one_that_never_parses(tmp_path):
    go = tmp_path / "go-0.json"
    go.write_text('{"start_at": 1')  # caught mid-write

    def finish() -> None:
        time.sleep(0.3)
        go.write_text(json.dumps({"start_at": 1.0, "seconds": 2}))

    writer = threading.Thread(target=finish)
    writer.start()
    assert producer.read_go(go, limit=5) == {"start_at": 1.0, "seconds": 2}
    writer.join()
    for bad in ('{"start_at": 1', "[1, 2]", '{"start_at": "soon", "seconds": 2}'):
        go.write_text(bad)
        began = time.monotonic()
        with pytest.raises(RuntimeError, match="unreadable for"):
            producer.read_go(go, limit=0.3)
        assert time.monotonic() - began < 3


def _pids_in(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_recorded(path: Path) -> None:
    """SIGKILL what a test's processes wrote to `path` and is still alive: only what the test
    started, by pid, should the test have failed before ending it."""
    for pid in _pids_in(path):
        if _alive(pid):
            os.kill(pid, 9)


def test_an_agent_ended_on_timeout_starts_no_worker_after_the_look(tmp_path):
    # An agent that keeps starting workers (each a session of its own, as spawn() makes them):
    # looked at while it still ran, the workers it started after the look outlived it.
    pids = tmp_path / "pids"
    agent_code = (
        "import subprocess, sys, time\n"
        "while True:\n"
        "    p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
        f"    open({str(pids)!r}, 'a').write(f'{{p.pid}} ')\n"
        "    time.sleep(0.005)\n"
    )
    agent = subprocess.Popen([sys.executable, "-c", agent_code])  # noqa: S603
    try:
        deadline = time.monotonic() + 10
        while len(_pids_in(pids)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        procs.end_agent(agent)
        started = _pids_in(pids)
        _wait_gone(started)
        assert started and not [p for p in started if _alive(p)]
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        _kill_recorded(pids)


def test_the_orphans_of_a_worker_that_died_are_ended_with_its_agent(tmp_path):
    # The worker (a group leader) died first; what it forked is left in its group, a group no
    # live process leads. The agent is a subreaper, so they are its descendants and end with it.
    pidfile = tmp_path / "orphan"
    worker_code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        f"    open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(60)\n"
        "os._exit(0)\n"
    )
    agent_code = (
        "import subprocess, sys, time\n"
        "from bench.procs import become_subreaper\n"
        "become_subreaper()\n"
        f"subprocess.Popen([sys.executable, '-c', {worker_code!r}], start_new_session=True).wait()\n"
        "time.sleep(60)\n"
    )
    agent = subprocess.Popen([sys.executable, "-c", agent_code], cwd=Path(__file__).parent.parent)  # noqa: S603
    try:
        deadline = time.monotonic() + 10
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        orphan = int(pidfile.read_text())
        deadline = time.monotonic() + 10
        while orphan not in procs.descendants(agent.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert orphan in procs.descendants(agent.pid)  # handed to the agent, not to init
        procs.end_agent(agent)
        _wait_gone([orphan])
        assert not _alive(orphan)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        _kill_recorded(pidfile)


def test_a_pid_seen_before_and_now_held_by_a_descendant_is_counted(tmp_path):
    # The pid was remembered for another process; a descendant holds it now: it is ours.
    script = "import os, time\nif os.fork() == 0:\n    b = bytearray(64 << 20); time.sleep(60)\ntime.sleep(60)\n"
    worker = procs.spawn([sys.executable, "-c", script], dict(os.environ), tmp_path / "w", "w", tmp_path)
    try:
        deadline = time.monotonic() + 10
        while procs.rss_kb([worker]) < 70_000 and time.monotonic() < deadline:
            time.sleep(0.05)
        (child,) = worker.children
        worker.children[child] -= 1  # as if remembered for an earlier process of that pid
        assert procs.rss_kb([worker]) >= 70_000
    finally:
        procs.kill(worker)


def test_stopping_a_reaped_worker_spares_a_process_now_holding_its_pid(tmp_path):
    # Once a worker is reaped its pid may be given to another process, a group leader as our
    # own workers are: kill() and stop() must send nothing to that pid or its group.
    for end in (procs.kill, lambda p: procs.stop([p], grace=0.5)):
        worker = procs.spawn([sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "w", "w", tmp_path)
        worker.popen.wait(10)
        stranger = subprocess.Popen(  # noqa: S603
            [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
        )
        try:
            worker.popen.pid = stranger.pid  # the kernel gave the reaped worker's pid away
            end(worker)
            time.sleep(0.2)
            assert stranger.poll() is None, "a process the harness never started was killed"
        finally:
            stranger.kill()
            stranger.wait()
