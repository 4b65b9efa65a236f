"""The kill test: SIGKILL workers again and again while they drain; nothing may be lost.

Size by env: OX_KILL_TASKS (default 2000), OX_KILL_COUNT (default 20)."""

import os
import random
import signal
import statistics
import time

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from ox.db import driver
from ox.models import Attempt, Outcome, Status, Task, Worker
from tests import tasks
from tests.test_durability import options
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TASKS = int(os.environ.get("OX_KILL_TASKS", "2000"))
KILLS = int(os.environ.get("OX_KILL_COUNT", "20"))


def test_kill_workers_while_draining(start_worker):
    from ox import enqueue_many

    enqueue_many(tasks.record_then_sleep, [((f"k{i}", 0.02), {}) for i in range(TASKS)])
    # The workers' lease, heartbeat, rescue interval and liveness grace, passed in so the bound
    # below follows them. SQLite has no liveness lock: rescue waits for the lease, so keep it
    # short there. PostgreSQL runs with the defaults (stated): its rescue must not need the lease.
    lease, heartbeat, rescue_interval = (3.0, 0.5, 0.5) if connection.vendor == "sqlite" else (30.0, 3.0, 1.0)
    liveness_grace = 1.0
    env = options(lease=lease, heartbeat=heartbeat, rescue_interval=rescue_interval, liveness_grace=liveness_grace)
    workers = [start_worker("--concurrency", "2", env=env) for _ in range(3)]
    kills: list[tuple[float, str]] = []  # (wall time of the kill, worker id)
    rng = random.Random(7)
    deadline = time.monotonic() + 240
    while len(kills) < KILLS and time.monotonic() < deadline:
        time.sleep(0.35)
        live = [w for w in workers if w.proc.poll() is None]
        ids = dict(Worker.objects.filter(pid__in=[w.pid for w in live]).values_list("pid", "id"))
        busy = [w for w in live if Task.objects.filter(status=Status.RUNNING, worker_id=ids.get(w.pid, "?")).exists()]
        if not busy:
            if not Task.objects.filter(status__in=[Status.READY, Status.RUNNING]).exists():
                break  # drained before every kill was spent
            continue
        victim = rng.choice(busy)
        victim.signal(signal.SIGKILL)
        victim.wait(timeout=10)
        kills.append((time.time(), ids[victim.pid]))
        workers.remove(victim)
        workers.append(start_worker("--concurrency", "2", env=env))
    while time.monotonic() < deadline and Task.objects.filter(status__in=[Status.READY, Status.RUNNING]).exists():
        time.sleep(0.2)

    statuses = dict(Task.objects.values_list("status").annotate(n=Count("id")))
    runs = Ledger.objects.count()
    keys = Ledger.objects.values("key").distinct().count()
    lost = list(
        Attempt.objects.filter(outcome=Outcome.LOST).values_list("task_id", "number", "worker_id", "finished_at")
    )
    kill_times = dict((w, t) for t, w in kills)
    rescue_s = sorted(f.timestamp() - kill_times[w] for _t, _n, w, f in lost if w in kill_times)
    # When the rescued attempt's successor started: the next Attempt row, or the task row itself.
    starts = {(a, n): s for a, n, s in Attempt.objects.values_list("task_id", "number", "started_at")}
    rows = {t: (n, s) for t, n, s in Task.objects.values_list("id", "attempts", "last_attempted_at")}
    reclaim_s = []
    for task_id, number, w, _f in lost:
        if w in kill_times:
            nxt = starts.get((task_id, number + 1)) or (rows[task_id][1] if rows[task_id][0] == number + 1 else None)
            if nxt is not None:
                reclaim_s.append(nxt.timestamp() - kill_times[w])
    reclaim_s.sort()

    def summary(values):
        return f"median {statistics.median(values):.2f} s max {max(values):.2f} s" if values else "n/a"

    print(
        f"\nkill test on {connection.vendor}: {TASKS} tasks, {len(kills)} SIGKILLs, statuses {statuses}, "
        f"executions {runs}, run twice {runs - keys}, rescued {len(rescue_s)}; "
        f"kill-to-rescue {summary(rescue_s)}; kill-to-claimed-again {summary(reclaim_s)}"
    )
    assert len(kills) >= min(KILLS, 5), "the drain finished before the kills could happen"
    assert statuses == {Status.SUCCESSFUL: TASKS}, statuses
    assert keys == TASKS  # every task's body ran at least once
    assert rescue_s, "no task was rescued"
    if driver(connection).session_locks:
        # A dead worker's advisory lock (PostgreSQL) or named lock (MariaDB) goes with its
        # connection. A surviving worker's rescuer
        # looks every RESCUE_INTERVAL: the first look after the kill finds the lock free, the
        # look LIVENESS_GRACE later declares the worker dead and rescues its tasks, which that
        # worker claims at once. Add one HEARTBEAT for a busy machine delaying a worker's loop
        # (two cores, benchmarks beside the suite): 5 s with the defaults; measured 1-2 s. Without
        # the fast path a task waits for its lease to run out, LEASE - HEARTBEAT (27 s) or more
        # after the kill: the bound must stay below that for this assertion to mean anything.
        fast_path_bound = rescue_interval + liveness_grace + heartbeat
        assert fast_path_bound < lease - heartbeat
        assert statistics.median(reclaim_s) <= fast_path_bound, summary(reclaim_s)
    assert Task.objects.filter(finished_at__gt=timezone.now()).count() == 0
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(timeout=30) == 0
