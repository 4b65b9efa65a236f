"""The soak's subprocesses: how they are started and stopped (by pid only), and what the producer
and worker subprocesses run (scripts/soak.py `produce`, `worker`)."""

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Child:
    """A subprocess whose output goes to a log file; stopped by its pid only."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT)  # noqa: S603  (argv built here)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self, timeout: float) -> int | None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._out.close()

    def text(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")


def read_count(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0  # not written yet (the producer replaces it atomically, so never half a number)


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)


def produce(rate: float, seconds: float, count_file: Path, tick: float = 0.02) -> int:
    """Enqueue tests.tasks.noop at `rate` per second for `seconds`, on an absolute schedule (a
    stall is caught up afterwards, so every window gets its share); writes the running count."""
    import django

    django.setup()
    from ox import enqueue_many
    from tests.tasks import noop

    started = time.monotonic()
    sent, written_at = 0, 0.0
    while True:
        now = time.monotonic()
        elapsed = min(now - started, seconds)
        due = int(rate * elapsed) - sent
        if due == 1:
            noop.enqueue()
        elif due > 1:
            # At most a second's worth per statement: a long stall is caught up over a few ticks.
            due = min(due, max(2, int(rate)))
            enqueue_many(noop, [((), {})] * due)
        sent += max(due, 0)
        if now - written_at >= 0.2 or elapsed >= seconds:
            tmp = count_file.with_suffix(".tmp")
            tmp.write_text(str(sent))
            os.replace(tmp, count_file)  # atomic: the driver never reads half a number
            written_at = now
        if elapsed >= seconds and sent >= int(rate * seconds):
            break
        time.sleep(max(0.0, tick - (time.monotonic() - now)))
    print(f"enqueued {sent} in {time.monotonic() - started:.1f} s")
    return 0


def run_worker(args: list[str]) -> None:
    """`manage.py runworker ARGS`, the same command through the same entry point, with DEBUG
    off: Django reads settings.DEBUG at each cursor, so flipping it after setup is enough."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import execute_from_command_line

    settings.DEBUG = False
    execute_from_command_line([str(ROOT / "manage.py"), "runworker", *args])
