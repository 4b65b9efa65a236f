"""Database time, not worker clocks (issue #10): workers whose host clocks are 30 s off, one
ahead and one behind, run beside each other against one PostgreSQL. Their clocks are really
skewed: each runs under libfaketime (Debian's `faketime`), which moves the wall clock the
process reads (time.time(), datetime.now()), as a misconfigured host would, and leaves the
monotonic clock alone (tests/faketime_shim says how time.sleep copes with libfaketime).

With the host's clock in charge, the worker behind would write leases that are already 20 s
past (the other worker would rescue its live tasks at once) and the worker ahead would claim
a task scheduled 8 s from now at once, and stamp times 30 s in the future. ox.clock reads the
database's clock instead.
"""

import glob
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ox import clock
from ox.models import Attempt, Status, Task, Worker
from tests import tasks
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

FAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
SHIM = Path(__file__).resolve().parent / "faketime_shim"
SKEW = float(os.environ.get("OX_SKEW", "30"))


def skewed(seconds: float) -> dict[str, str]:
    if not FAKETIME:
        if os.environ.get("CI") == "true":
            pytest.fail("libfaketime is missing (apt-get install faketime); CI runs every test")
        pytest.skip("libfaketime is not installed (Debian package faketime): cannot skew a worker's clock")
    return {
        "LD_PRELOAD": FAKETIME[0],
        "FAKETIME": f"{seconds:+.0f}s",
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": str(SHIM),  # time.sleep without clock_nanosleep (see the shim)
    }


def host_skew(env: dict[str, str]) -> float:
    """How far a process started with env sees the wall clock from ours."""
    out = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return float(out.stdout) - time.time()


def test_the_clock_is_read_once_and_counted_forward():
    clock.forget(connection)
    with CaptureQueriesContext(connection) as first:
        a = clock.db_now(connection)
    with CaptureQueriesContext(connection) as second:
        b = clock.db_now(connection)
    expected = 0 if connection.vendor == "sqlite" else 1  # SQLite's clock is this process's
    assert len(first.captured_queries) == expected and len(second.captured_queries) == 0
    assert timedelta(0) <= b - a < timedelta(seconds=1)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement_timestamp()")
            server = cursor.fetchone()[0]
        assert abs((clock.db_now(connection) - server).total_seconds()) < 0.5


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite runs inside the worker: its clock is the host's")
def test_workers_with_skewed_clocks_neither_claim_early_nor_rescue_live_tasks(start_worker):
    ahead, behind = skewed(+SKEW), skewed(-SKEW)
    assert abs(host_skew(ahead) - SKEW) < 2 and abs(host_skew(behind) + SKEW) < 2, "faketime did not skew"
    options = '{"LEASE": 10, "HEARTBEAT": 1, "RESCUE_INTERVAL": 0.2, "LIVENESS_GRACE": 1}'
    env = {"OX_TEST_OPTIONS": options, "PYTHONFAULTHANDLER": "1"}
    workers = [
        start_worker("--concurrency", "2", "--interval", "0.1", env={**env, **ahead}),
        start_worker("--concurrency", "2", "--interval", "0.1", env={**env, **behind}),
    ]
    try:
        wait_until(lambda: Worker.objects.filter(pid__in=[w.pid for w in workers]).count() == 2, timeout=60)
    except AssertionError:
        raise AssertionError("workers did not start:\n" + "\n".join(w.output()[-1500:] for w in workers)) from None
    # Long enough that a lease written 20 s in the past would be rescued many times over.
    long = [tasks.sleep_for.enqueue(3.0) for _ in range(4)]
    db_now = clock.db_now(connection)
    due = db_now + timedelta(seconds=8)
    scheduled = tasks.record.using(run_after=due).enqueue("scheduled")
    time.sleep(2.0)
    assert Task.objects.get(pk=scheduled.id).status == Status.READY, "claimed 6 s before it was due"
    ids = [r.id for r in long] + [scheduled.id]
    try:
        wait_until(lambda: Task.objects.filter(pk__in=ids, status=Status.SUCCESSFUL).count() == len(ids), timeout=60)
    except AssertionError:
        states = list(Task.objects.filter(pk__in=ids).values_list("status", "attempts", "worker_id", "run_after"))
        import signal

        for w in workers:
            w.signal(signal.SIGABRT)
        time.sleep(1)
        logs = "\n".join(w.output()[-6000:] for w in workers)
        from ox import sql

        now = clock.db_now(connection)
        logs += f"\nearliest {sql.earliest_ready(connection, ['default'])} now {now}"
        logs += f"\nworkers {list(Worker.objects.values_list('id', 'heartbeat_at', 'stopped_at'))}"
        raise AssertionError(f"not all finished: {states}\n{logs}") from None
    rows = {str(t.id): t for t in Task.objects.filter(pk__in=ids)}
    assert not Attempt.objects.filter(task_id__in=ids).exists(), "a live task was rescued"
    assert all(t.attempts == 1 for t in rows.values())
    started = rows[scheduled.id].started_at
    assert due <= started < due + timedelta(seconds=5), (due, started)
    # Times stamped by either worker are the database's, not 30 s off.
    for t in rows.values():
        assert abs((t.finished_at - clock.db_now(connection)).total_seconds()) < 20, t.finished_at
    # Both ran long tasks: the one behind wrote leases for its, the one ahead rescued around them.
    pids = dict(Worker.objects.filter(pid__in=[w.pid for w in workers]).values_list("id", "pid"))
    ran = {pids.get(rows[r.id].worker_id) for r in long}
    assert ran == {w.pid for w in workers}, (ran, pids)
    for worker in workers:
        assert worker.proc.poll() is None, worker.output()[-2000:]
