"""Model-based test of slots (ox.flow.slots): Hypothesis drives random sequences against
real `manage.py runworker` subprocesses serving one queue limited by concurrency alone:
enqueue sync and async tasks short and long, start workers of 1-4 threads, SIGKILL and
SIGTERM them, cancel tasks, lower or raise the limit at run time, let time pass.

Invariants, at quiescence (a live worker, every task final):
  S1  every task ends SUCCESSFUL or CANCELLED (none is lost or left RUNNING)
  S2  no body runs more often than its task's attempts, and a SUCCESSFUL task ran
  S3  at no instant do more bodies run than the largest limit in force during the second
      and a half before (workers read a changed limit within a second; what runs then
      finishes), counting a killed worker's bodies until its kill
  S4  once the workers are idle every slot is free, and the queue has as many slot rows as
      its limit

Run: .venv/bin/python -m pytest tests/test_model_slots.py -q (each database leg: about a
minute). Long mode: OX_MODEL_SLOTS_EXAMPLES=30 OX_MODEL_SLOTS_STEPS=20.
"""

import os
import signal
import time
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from ox import enqueue_many
from ox.flow.queues import set_limits
from ox.models import Slot, Status, Task
from ox.operations import cancel
from tests import flow_tasks as f
from tests.conftest import WorkerProcess
from tests.helpers import wait_until
from tests.test_durability import options
from tests.testapp.models import Span

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("OX_MODEL_SLOTS_EXAMPLES", "3"))
STEPS = int(os.environ.get("OX_MODEL_SLOTS_STEPS", "8"))
SETTLE = 1.5  # seconds: a limit changed reaches every worker (1 s) and what ran then ends
LONGEST = 0.3  # the longest body drawn


class SlotModel(RuleBasedStateMachine):
    env: ClassVar[dict[str, str]] = {}
    log_dir: ClassVar[Path] = Path(".")
    runs: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).runs += 1
        self.procs: list[WorkerProcess] = []
        self.killed_at: dict[int, float] = {}  # pid -> when SIGKILLed
        self.limits: list[tuple[float, int]] = []  # (since, limit)
        self.count = 0
        Task.objects.all().delete()
        Span.objects.all().delete()
        Slot.objects.all().delete()

    # ------------------------------------------------------------------ steps
    @initialize(limit=st.integers(1, 3))
    def begin(self, limit: int) -> None:
        self._limit(limit)
        self._start(2)

    def _limit(self, n: int) -> None:
        set_limits("emails", {"concurrency": n}, by="model")
        self.limits.append((time.time(), n))

    def _alive(self) -> list[WorkerProcess]:
        return [p for p in self.procs if p.proc.poll() is None]

    def _start(self, threads: int) -> None:
        log = self.log_dir / f"slots-{self.runs}-{len(self.procs)}.log"
        args = ["--concurrency", str(threads), "--async-concurrency", "4", "--queues", "emails"]
        proc = WorkerProcess(args, self.env, log)
        self.procs.append(proc)
        # Signals sent before the worker installs its handlers would kill it outright.
        wait_until(lambda: "worker started" in proc.output() or proc.proc.poll() is not None, timeout=60)

    @rule(n=st.integers(1, 15), seconds=st.sampled_from([0.0, 0.02, LONGEST]), is_async=st.booleans())
    def enqueue(self, n: int, seconds: float, is_async: bool) -> None:
        task = f.limited_async if is_async else f.limited
        calls = [((f"m{self.count + i}", seconds), {}) for i in range(n)]
        self.count += n
        enqueue_many(task, calls)

    @precondition(lambda self: len(self._alive()) < 3)
    @rule(threads=st.sampled_from([1, 2, 4]))
    def start(self, threads: int) -> None:
        self._start(threads)

    @precondition(lambda self: self._alive())
    @rule(which=st.integers(0, 2), kill=st.booleans())
    def stop(self, which: int, kill: bool) -> None:
        alive = self._alive()
        proc = alive[which % len(alive)]
        if kill:
            self.killed_at[proc.pid] = time.time()
            proc.signal(signal.SIGKILL)
            proc.wait(timeout=10)
        else:
            proc.signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, proc.output()[-2000:]

    @rule(limit=st.integers(1, 4))
    def change_limit(self, limit: int) -> None:
        self._limit(limit)

    @rule(nth=st.integers(0, 50))
    def cancel_one(self, nth: int) -> None:
        ids = list(Task.objects.filter(status__in=[Status.READY, Status.RUNNING]).values_list("pk", flat=True)[:51])
        if ids:
            cancel([ids[nth % len(ids)]])

    @rule(seconds=st.sampled_from([0.2, 1.0]))
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    # ------------------------------------------------------------------ checks
    def _allowed(self, at: float) -> int:
        """The largest limit in force during the SETTLE + LONGEST seconds before `at`."""
        since = at - SETTLE - LONGEST
        current = [n for t, n in self.limits if t <= since][-1:] or [self.limits[0][1]]
        return max(current + [n for t, n in self.limits if since < t <= at])

    def teardown(self) -> None:
        try:
            if not self._alive():
                self._start(2)
            final = (Status.SUCCESSFUL, Status.CANCELLED, Status.FAILED)
            wait_until(lambda: not Task.objects.exclude(status__in=final).exists(), timeout=120)
            tasks = {t.args[0]: t for t in Task.objects.all()}
            assert all(t.status != Status.FAILED for t in tasks.values()), "S1: a task failed"
            spans = list(Span.objects.all())
            runs: dict[str, int] = {}
            for s in spans:
                runs[s.key] = runs.get(s.key, 0) + 1
            for key, t in tasks.items():
                assert runs.get(key, 0) <= t.attempts, f"S2: {key} ran {runs.get(key)} times in {t.attempts} attempts"
                if t.status == Status.SUCCESSFUL:
                    assert runs.get(key, 0) >= 1, f"S2: {key} succeeded without running"
            edges = []
            for s in spans:
                end = s.ended
                if end is None:  # cancelled mid-run, or its worker was killed
                    t = tasks[s.key]
                    candidates = [self.killed_at.get(s.pid), t.finished_at.timestamp() if t.finished_at else None]
                    end = min((c for c in candidates if c is not None and c >= s.started), default=time.time())
                edges += [(s.started, 1), (end, -1)]
            edges.sort(key=lambda e: (e[0], e[1]))
            open_now = 0
            for at, step in edges:
                open_now += step
                if step > 0:
                    assert open_now <= self._allowed(at), f"S3: {open_now} ran at once, limit {self._allowed(at)}"
            limit = self.limits[-1][1]
            wait_until(lambda: not Slot.objects.exclude(worker_id="").exists(), timeout=15)
            # The rows follow the limit from a worker's first claim under it (a second at most).
            wait_until(lambda: Slot.objects.filter(queue="emails").count() == limit, timeout=15)
        finally:
            for p in self.procs:
                p.stop()


def test_slots_model(worker_env, tmp_path):
    SlotModel.env = {**worker_env, **options(heartbeat=0.5, rescue_interval=0.5, lease=3.0)}
    SlotModel.log_dir = tmp_path
    run_state_machine_as_test(
        SlotModel,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        ),
    )
