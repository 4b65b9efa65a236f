"""The worker processes of one measurement (a Fleet), and the bounded wait every job uses."""

import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import procs
from bench.arms.base import Arm

REPO = Path(__file__).resolve().parent.parent
Params = dict[str, Any]


class Fleet:
    """The worker processes of one measurement: started, measured and stopped by pid."""

    def __init__(self, arm: Arm, p: Params) -> None:
        self.arm = arm
        self.log_dir = Path(p["log_dir"])
        self.interval = p.get("interval")
        self.queue = p.get("queue", "default")
        self.env = {**os.environ, **{k: str(v) for k, v in p.get("worker_env", {}).items()}}
        self.procs: list[procs.Proc] = []
        self.idents: dict[int, str] = {}
        self.argv: list[list[str]] = []
        self.count_files: list[Path] = []
        self.boot = ""
        self.notes: list[str] = []

    def shape(self, processes: int, concurrency: int) -> list[int]:
        """Per-process concurrency. An arm without threads gets processes x concurrency processes."""
        if self.arm.native_concurrency:
            return [concurrency] * processes
        return [1] * (processes * concurrency)

    def start(self, concurrency: int) -> procs.Proc:
        ident = f"bench-{uuid.uuid4().hex[:12]}"
        argv = [
            sys.executable,
            "-m",
            self.arm.launcher,
            *self.arm.worker_argv(concurrency, ident, self.interval, self.queue),
        ]
        count_file = self.log_dir / f"{ident}.sql.json"
        env = {**self.env, "BENCH_SQL_COUNT_FILE": str(count_file)}
        proc = procs.spawn(argv, env, self.log_dir / f"{ident}.log", ident, REPO)
        self.procs.append(proc)
        self.idents[proc.pid] = ident
        self.argv.append(argv[3:])
        self.count_files.append(count_file)
        return proc

    def start_all(
        self, processes: int, concurrency: int, boot_timeout: float = 60.0, work_waiting: bool = False
    ) -> None:
        """work_waiting: tasks are already there, so the workers start on them at once and are
        never quiet: wait for them to be ready (registered) only."""
        for c in self.shape(processes, concurrency):
            self.start(c)
        pids = [p.pid for p in self.procs]
        self.boot = procs.wait_idle(self.procs, boot_timeout, ready=lambda: bool(self.arm.ready(pids)))
        if self.boot != "idle" and not work_waiting:
            self.notes.append(f"workers never went quiet after boot (CPU busy at rest); started on: {self.boot}")

    def alive(self) -> list[procs.Proc]:
        return [p for p in self.procs if p.alive()]

    def stop(self) -> None:
        procs.stop(self.procs)

    def sql_counts(self) -> dict[str, int] | None:
        """Summed statement counters of the worker processes, None if one did not report."""
        total = {"executes": 0, "begins": 0, "commits": 0}
        for path in self.count_files:
            try:
                counts = json.loads(path.read_text())
            except (OSError, ValueError):
                return None
            for key in total:
                total[key] += counts.get(key, 0)
        return total

    def info(self) -> dict[str, Any]:
        return {
            "workers": len(self.procs),
            "argv": self.argv[0] if self.argv else [],
            "env": _env_info(self.env),
            "boot": self.boot,
            "notes": list(self.notes),
        }


def _env_info(env: dict[str, str]) -> dict[str, str]:
    return {k: env[k] for k in ("BENCH_CONN_MAX_AGE", "BENCH_POOL", "BENCH_OX_LIMITS") if k in env}


def wait(condition: Callable[[], bool], timeout: float, poll: float, fleet: Fleet | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if fleet is not None and not fleet.alive():
            raise RuntimeError("every worker exited: " + procs.tail(fleet.procs[-1].log))
        time.sleep(poll)
    return condition()
