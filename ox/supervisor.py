"""`runworker --processes N`: start N worker processes, restart any that die, pass signals on."""

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

logger = logging.getLogger("ox.supervisor")


class Supervisor:
    def __init__(self, command: Sequence[str], processes: int, grace: float) -> None:
        self.command = list(command)
        self.processes = processes
        self.grace = grace
        self.children: list[subprocess.Popen[bytes]] = []
        self.stopping = False
        self.signals_seen = 0

    def _spawn(self) -> subprocess.Popen[bytes]:
        child = subprocess.Popen(self.command)  # noqa: S603  (our own interpreter and manage.py)
        logger.info("supervisor started a worker process pid=%s", child.pid)
        return child

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals_seen += 1
        self.stopping = True
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signum if self.signals_seen == 1 else signal.SIGKILL)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.children = [self._spawn() for _ in range(self.processes)]
        restarts: list[float] = []
        done: set[int] = set()  # children that finished their work (--batch, --max-tasks)
        while not self.stopping and len(done) < len(self.children):
            for i, child in enumerate(self.children):
                code = child.poll()
                if code is None or self.stopping or i in done:
                    continue
                if code == 0:
                    # A worker exits 0 only when it chose to: its batch is drained or its
                    # --max-tasks are done. Only a death or a failure is restarted.
                    logger.info("supervisor: worker pid=%s finished", child.pid)
                    done.add(i)
                    continue
                logger.warning("supervisor: worker pid=%s exited with %s; restarting", child.pid, code)
                restarts = [t for t in restarts if time.monotonic() - t < 10] + [time.monotonic()]
                if len(restarts) > 3 * self.processes:
                    time.sleep(1.0)  # a crash loop: do not spin
                self.children[i] = self._spawn()
            time.sleep(0.1)
        deadline = time.monotonic() + self.grace + 5
        codes = []
        for child in self.children:
            try:
                codes.append(child.wait(timeout=max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                child.kill()
                codes.append(child.wait())
        logger.info("supervisor stopped; worker exit codes %s", codes)
        return 0 if all(c == 0 for c in codes) else 1


def child_command(argv: Sequence[str]) -> list[str]:
    """This same command line without --processes."""
    out: list[str] = [sys.executable]
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--processes":
            skip = True
            continue
        if arg.startswith("--processes="):
            continue
        out.append(arg)
    return out
