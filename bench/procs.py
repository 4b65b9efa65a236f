"""Worker processes: start, measure (from /proc), stop. Only processes this harness started
are ever signalled, always by pid."""

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path
    label: str
    # Filled when the process is measured: the last /proc reading of it and its descendants.
    cpu_s: float = 0.0
    hwm_kb: int = 0
    # Descendants seen so far, each with its start time (clock ticks after boot): a pid is
    # counted or signalled only while the process under it is the one seen, never a later
    # process the kernel gave the same pid once ours had exited.
    children: dict[int, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None


def spawn(argv: Sequence[str], env: dict[str, str], log: Path, label: str, cwd: Path) -> Proc:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        # A process group of its own: a peer whose supervisor forks workers (dj-queue) leaves
        # them running when the supervisor alone is killed, each holding connections (37 such
        # orphans once used up the server's max_connections for the cells after them).
        popen = subprocess.Popen(  # noqa: S603  (our own interpreter and module)
            list(argv),
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return Proc(popen=popen, log=log, label=label)


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, utime+stime seconds, start time in clock ticks after boot) from
    /proc/<pid>/stat, None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces: split after its closing parenthesis.
    rest = raw[raw.rindex(")") + 2 :].split()
    ppid = int(rest[1])
    utime, stime = int(rest[11]), int(rest[12])
    return ppid, (utime + stime) / CLOCK_TICKS, int(rest[19])


def _status_kb(pid: int, field: str) -> int:
    """A KiB figure of /proc/<pid>/status (VmHWM, VmRSS, ...), 0 if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _hwm_kb(pid: int) -> int:
    return _status_kb(pid, "VmHWM")


def descendants(pid: int) -> set[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                parents.setdefault(st[0], []).append(int(entry))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _look(proc: Proc) -> list[int]:
    """The process's pid and those of its descendants: the ones alive now (remembered with
    their start times) and the ones seen before that still run as the same process."""
    for pid in descendants(proc.pid):
        st = _stat(pid)
        if st is not None:  # a descendant now: ours, whatever held the pid before
            proc.children[pid] = st[2]
    return [proc.pid, *_still_ours(proc)]


def _still_ours(proc: Proc) -> list[int]:
    """The remembered descendants still running as the process seen; the rest forgotten."""
    for pid, started in list(proc.children.items()):
        st = _stat(pid)
        if st is None or st[2] != started:
            del proc.children[pid]
    return list(proc.children)


def measure(procs: Iterable[Proc]) -> tuple[float, int]:
    """Total CPU seconds (user+system) and summed peak RSS (VmHWM, KiB) of the processes and
    their descendants, now. A process keeps its last reading once it is gone."""
    total_cpu, total_hwm = 0.0, 0
    for proc in procs:
        if proc.alive():
            cpu, hwm = 0.0, 0
            for pid in _look(proc):
                st = _stat(pid)
                if st is not None:
                    cpu += st[1]
                    hwm += _hwm_kb(pid)
            proc.cpu_s, proc.hwm_kb = cpu, max(proc.hwm_kb, hwm)
        total_cpu += proc.cpu_s
        total_hwm += proc.hwm_kb
    return total_cpu, total_hwm


def rss_kb(procs: Iterable[Proc]) -> int:
    """Summed resident memory now (VmRSS, KiB) of the live processes and their descendants, as
    measure() sums peak RSS: pages a forked child shares with its parent count in each."""
    total = 0
    for proc in procs:
        if proc.alive():
            total += sum(_status_kb(pid, "VmRSS") for pid in _look(proc))
    return total


def wait_idle(
    procs: Sequence[Proc],
    timeout: float,
    ready: Callable[[], bool] | None = None,
    quiet: float = 0.6,
    min_wait: float = 1.0,
) -> str:
    """Wait until the workers have booted. Returns "idle" once they are alive and their CPU
    time has not moved by more than two clock ticks for `quiet` seconds; "ready" when the
    arm's own readiness check passes (a worker that burns CPU at rest never goes quiet);
    "busy" if the wait runs out (the caller goes on and says so). Raises if one dies."""
    start = time.monotonic()
    history: list[tuple[float, float]] = []
    while True:
        now = time.monotonic()
        dead = [p for p in procs if not p.alive()]
        if dead:
            raise RuntimeError(f"worker {dead[0].label} exited with {dead[0].popen.returncode}: {tail(dead[0].log)}")
        cpu, _ = measure(procs)
        history.append((now, cpu))
        window = [c for t, c in history if t >= now - quiet]
        if now - start >= min_wait:
            if now - history[0][0] >= quiet and window[-1] - window[0] <= 2 / CLOCK_TICKS:
                return "idle"
            if ready is not None and now - start >= min_wait + quiet and ready():
                return "ready"
        if now - start > timeout:
            return "busy"
        time.sleep(0.1)


def stop(procs: Iterable[Proc], grace: float = 15.0) -> None:
    """SIGTERM each (its own pid), wait up to `grace`, then SIGKILL the stragglers and what
    is left in their process groups."""
    procs = list(procs)
    for proc in procs:
        if proc.alive():
            proc.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.popen.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            kill(proc)
        _kill_group(proc)  # what its exit left behind in its process group (spawn)


def _kill_group(proc: Proc) -> None:
    """SIGKILL the process group `proc` leads (spawn made it a leader). Once the leader is
    reaped its pid is free again only when no process is left in its group: a process holding
    that pid now means the group is empty and the pid someone else's, so nothing is sent."""
    if proc.popen.returncode is not None and Path(f"/proc/{proc.pid}").exists():
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill(proc: Proc) -> None:
    """SIGKILL one process we started, the descendants we saw it start, and whatever else is
    left in the process group it leads (descendants forked after we last looked)."""
    if proc.alive():  # not once reaped: its pid may be another process's by now
        proc.popen.kill()
    for pid in _still_ours(proc):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _kill_group(proc)
    try:
        proc.popen.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def become_subreaper() -> None:
    """Make this process the one its descendants' orphans are handed to (Linux), instead of
    init: a worker that dies leaves what it forked as this process's descendants, where
    descendants() and kill_tree() still find them."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def kill_tree(pid: int) -> None:
    """SIGKILL a process's descendants and every process group one of them leads (a worker
    spawn() started leads its own: what it forked and left behind as an orphan, no longer a
    descendant, is still in that group). The process itself is the caller's to end: stop it
    first (SIGSTOP), so it starts nothing after the look. A bench agent is a subreaper
    (become_subreaper), so the orphans of a worker that died before are its descendants."""
    found = descendants(pid)
    leaders = set()
    for child in found:
        try:
            if os.getpgid(child) == child:
                leaders.add(child)
        except ProcessLookupError:
            pass
    for group in leaders:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for child in found:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def end_agent(agent: subprocess.Popen[bytes]) -> None:
    """End a process that started workers, and all it started: stopped first (SIGSTOP), so it
    starts nothing after the look, then its tree (kill_tree), then itself, reaped."""
    try:
        agent.send_signal(signal.SIGSTOP)
    except ProcessLookupError:
        pass
    kill_tree(agent.pid)
    agent.kill()
    agent.wait()


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
