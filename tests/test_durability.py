"""Leases, rescue, fencing, timeouts, cancellation, shutdown: real worker subprocesses."""

import json
import signal
import time

import pytest
from django.db import connection
from django.tasks import TaskResultStatus, task_backends
from django.utils import timezone

import ox
from ox import clock, sql
from ox.db import driver
from ox.models import Attempt, Outcome, Status, Task, Worker
from tests import gated_tasks, tasks
from tests.helpers import wait_until
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)
postgres_only = pytest.mark.skipif("connection.vendor != 'postgresql'")


def options(**values):
    return {"OX_TEST_OPTIONS": json.dumps({k.upper(): v for k, v in values.items()})}


def status_of(r):
    return Task.objects.get(pk=r.id).status


def test_heartbeat_renews_leases_and_worker_row(start_worker, tmp_path):
    # A lease a busy machine cannot run out by stalling a worker loop for a second, renewed
    # often (HEARTBEAT <= LEASE / 3, ox.W003); the task holds its slot until the gate opens.
    lease, heartbeat = 6.0, 0.5
    gate = tmp_path / "gate"
    r = gated_tasks.hold.enqueue("held", str(gate))
    worker = start_worker(env=options(lease=lease, heartbeat=heartbeat))
    wait_until(lambda: status_of(r) == Status.RUNNING, timeout=20)
    first = Task.objects.get(pk=r.id).lease_expires_at
    beat = Worker.objects.get(pid=worker.pid).heartbeat_at
    # Wait for the renewals themselves (within a lease), not a sleep and a guess.
    wait_until(lambda: Task.objects.get(pk=r.id).lease_expires_at > first, timeout=lease)
    wait_until(lambda: Worker.objects.get(pid=worker.pid).heartbeat_at > beat, timeout=lease)
    assert status_of(r) == Status.RUNNING  # renewed, not rescued
    gate.touch()
    wait_until(lambda: status_of(r) == Status.SUCCESSFUL, timeout=20)
    assert not Attempt.objects.filter(task_id=r.id).exists()  # the lease held throughout


def test_expired_lease_is_rescued_with_a_lost_attempt():
    # A RUNNING row whose lease ran out (its worker vanished without trace).
    r = tasks.echo.enqueue(1)
    now = clock.db_now(connection)
    (claimed,) = sql.claim(connection, "ghost", ["default"], 1, now, now + timezone.timedelta(seconds=1))
    assert sql.rescue(connection, now) == []  # lease still valid
    rescued = sql.rescue(connection, now + timezone.timedelta(seconds=2))
    assert [(t, w, s) for t, w, s in rescued] == [(claimed.id, "ghost", "READY")]
    row = Task.objects.get(pk=r.id)
    assert row.status == Status.READY and row.fence == claimed.fence + 1
    (attempt,) = Attempt.objects.filter(task_id=r.id)
    assert attempt.outcome == Outcome.LOST and attempt.worker_id == "ghost" and "ghost" in attempt.traceback
    assert task_backends["default"].get_result(r.id).errors[0].exception_class_path == "ox.exceptions.WorkerLost"


def test_lost_attempts_do_not_spend_the_budget_until_max_lost():
    # max_attempts=1: a worker dying under it must not fail a task that may never have run...
    r = tasks.fails_once_only.enqueue()
    now = clock.db_now(connection)
    for lost in range(1, 4):
        (claimed,) = sql.claim(connection, f"ghost{lost}", ["default"], 1, now, now)
        # Its body started each time (unstarted losses after the first do not count:
        # tests/test_start_marks.py).
        assert sql.mark_started(connection, claimed, now)
        now += timezone.timedelta(seconds=1)
        (rescued,) = sql.rescue(connection, now, max_lost=3)
        row = Task.objects.get(pk=r.id)
        assert row.attempts == lost and row.max_attempts == lost + 1
        if lost < 3:
            assert rescued[2] == "READY" and row.status == Status.READY
    # ...but a task lost max_lost times (it may be what kills its workers) is FAILED.
    assert rescued[2] == "FAILED" and row.status == Status.FAILED and row.finished_at is not None
    assert list(Attempt.objects.filter(task_id=r.id).values_list("outcome", flat=True)) == [Outcome.LOST] * 3


def test_fenced_writes_match_nothing_after_a_rescue():
    r = tasks.echo.enqueue(1)
    now = clock.db_now(connection)
    (old,) = sql.claim(connection, "old", ["default"], 1, now, now)
    sql.rescue(connection, now + timezone.timedelta(seconds=1))
    later = now + timezone.timedelta(seconds=1)
    (new,) = sql.claim(connection, "new", ["default"], 1, later, later + timezone.timedelta(minutes=1))
    assert new.fence > old.fence
    late = timezone.now()
    assert sql.complete(connection, [sql.Completion(old.id, old.fence, '"late"', late, late)]) == set()
    assert sql.renew(connection, [(old.id, old.fence, None)], late) == {}
    failure = sql.Failure(old.id, old.fence, 1, "old", late, late, "failed", "x.Y", "tb", None)
    assert sql.fail(connection, failure) is None
    row = Task.objects.get(pk=r.id)
    assert row.status == Status.RUNNING and row.worker_id == "new"
    # One batch holding the old and the new run of the task: only the new claim is written.
    both = [
        sql.Completion(old.id, old.fence, '"late"', late, late),
        sql.Completion(new.id, new.fence, '"ok"', late, late),
    ]
    assert sql.complete(connection, both) == {(new.id, new.fence)}


def test_paused_worker_is_fenced_out_after_rescue(start_worker):
    r = tasks.sleep_for.enqueue(2.5)
    # Short enough to rescue within seconds, long enough that the rescuing worker b does not
    # lose its own lease when a busy machine stalls it for a second (the kill test's values).
    short = options(lease=3, heartbeat=0.5, rescue_interval=0.5)
    a = start_worker(env=short)
    # Its body started (the start mark comes with the heartbeat after it): claimed alone, the
    # task could still wait in a's inbox when a froze, and a task that never started is
    # dropped without a word once its lease is gone (a CI run on a loaded machine saw that).
    wait_until(lambda: Task.objects.filter(pk=r.id, status=Status.RUNNING, started_at__isnull=False).exists(), 20)
    a.signal(signal.SIGSTOP)  # a long GC pause, a frozen VM: the lease runs out
    try:
        b = start_worker(env=short)
        wait_until(lambda: Task.objects.filter(pk=r.id, status=Status.SUCCESSFUL).exists(), timeout=30)
        done = Task.objects.get(pk=r.id)
        assert done.worker_id != Worker.objects.get(pid=a.pid).id
    finally:
        a.signal(signal.SIGCONT)
    wait_until(lambda: "fenced out" in a.output(), timeout=20)
    after = Task.objects.get(pk=r.id)
    assert (after.status, after.fence, after.worker_id, after.finished_at) == (
        done.status,
        done.fence,
        done.worker_id,
        done.finished_at,
    )
    assert Attempt.objects.get(task_id=r.id).outcome == Outcome.LOST
    b.signal(signal.SIGTERM)
    a.signal(signal.SIGTERM)


@pytest.mark.skipif(not driver(connection).session_locks, reason="liveness is the lease here")
def test_killed_worker_is_rescued_fast_where_liveness_is_a_session_lock(start_worker):
    # Default lease (30 s): only the fast path (PostgreSQL's advisory lock, MariaDB's named
    # lock: free when the session dies) can rescue this in seconds.
    lease, heartbeat, rescue_interval, grace = 30.0, 3.0, 1.0, 1.0  # the defaults, stated: the bound follows them
    env = options(lease=lease, heartbeat=heartbeat, rescue_interval=rescue_interval, liveness_grace=grace)
    r = tasks.record.enqueue("k")
    slow = tasks.sleep_for.enqueue(60)
    victim = start_worker("--concurrency", "1", "--queues", "default", env=env)
    wait_until(lambda: status_of(slow) == Status.RUNNING, timeout=20)
    # The rescuer is up and idle before the kill: its start-up (seconds on a busy machine) is
    # not part of what is timed.
    rescuer = start_worker("--concurrency", "2", env=env)
    wait_until(lambda: Worker.objects.filter(pid=rescuer.pid).exists(), timeout=30)
    victim.signal(signal.SIGKILL)
    victim.wait(timeout=10)
    killed_at = time.monotonic()
    wait_until(lambda: Task.objects.filter(pk=slow.id, attempts=2, status=Status.RUNNING).exists(), timeout=lease / 2)
    # A rescue round finds the lock free, the round LIVENESS_GRACE later rescues, the rescuer
    # claims at once; plus a heartbeat for a busy machine: 5 s, well under the
    # LEASE - HEARTBEAT (27 s) a rescue by lease expiry would take.
    assert time.monotonic() - killed_at < rescue_interval + grace + heartbeat
    assert status_of(r) in (Status.SUCCESSFUL, Status.RUNNING, Status.READY)
    assert Attempt.objects.get(task_id=slow.id).outcome == Outcome.LOST


def test_sync_timeout_interrupts_the_thread(start_worker):
    r = tasks.times_out.enqueue()
    ok = tasks.echo.enqueue("after")
    worker = start_worker("--batch")
    assert worker.wait(timeout=30) == 0, worker.output()
    assert status_of(r) == Status.FAILED and status_of(ok) == Status.SUCCESSFUL
    (attempt,) = Attempt.objects.filter(task_id=r.id)
    assert attempt.outcome == Outcome.TIMED_OUT and attempt.exception_class_path == "ox.exceptions.TaskTimeout"
    assert (attempt.finished_at - attempt.started_at).total_seconds() < 5


def test_queue_timeout_applies_to_tasks_without_their_own(start_worker):
    r = tasks.busy_for.enqueue(30)  # no @task(timeout=...)
    other = tasks.other_queue.enqueue()
    worker = start_worker("--batch", env=options(queue_timeouts={"default": 0.3}))
    assert worker.wait(timeout=60) == 0, worker.output()
    outcomes = list(Attempt.objects.filter(task_id=r.id).values_list("outcome", flat=True))
    assert outcomes == [Outcome.TIMED_OUT] * 3 and status_of(r) == Status.FAILED  # default budget: 3
    assert status_of(other) == Status.SUCCESSFUL  # its queue has no timeout


def test_async_timeout_cancels_the_coroutine(start_worker):
    r = tasks.async_times_out.enqueue()
    worker = start_worker("--batch")
    assert worker.wait(timeout=30) == 0, worker.output()
    (attempt,) = Attempt.objects.filter(task_id=r.id)
    assert attempt.outcome == Outcome.TIMED_OUT
    assert (attempt.finished_at - attempt.started_at).total_seconds() < 5


def test_thread_that_ignores_its_interrupt_makes_the_worker_exit_nonzero(start_worker):
    stuck = tasks.ignores_interrupt.enqueue()
    others = [tasks.sleep_for.enqueue(0.5) for _ in range(2)]
    worker = start_worker("--concurrency", "3", env=options(interrupt_grace=1.0))
    code = worker.wait(timeout=30)
    assert code == 3, worker.output()
    assert "ignored its interrupt" in worker.output()
    assert all(status_of(o) == Status.SUCCESSFUL for o in others)
    assert status_of(stuck) == Status.RUNNING  # left for the rescuer


def test_cancel_running_task_is_interrupted_at_next_heartbeat(start_worker):
    r = tasks.busy_for.enqueue(60)
    worker = start_worker(env=options(heartbeat=0.3))
    wait_until(lambda: status_of(r) == Status.RUNNING, timeout=20)
    changed = ox.cancel(r.id)
    assert changed.cancel_requested == 1 and changed.cancelled == 0
    wait_until(lambda: status_of(r) == Status.CANCELLED, timeout=10)
    (attempt,) = Attempt.objects.filter(task_id=r.id)
    assert attempt.outcome == Outcome.CANCELLED
    fetched = task_backends["default"].get_result(r.id)
    assert fetched.status == TaskResultStatus.FAILED
    assert fetched.errors[-1].exception_class_path == "ox.exceptions.TaskCancelled"
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 0


def test_cancel_ready_task_never_runs(start_worker):
    r = tasks.record.enqueue("never")
    assert ox.cancel(r.id).cancelled == 1
    assert not ox.cancel(r.id)  # already finished: nothing changes
    worker = start_worker("--batch")
    assert worker.wait(timeout=20) == 0
    assert status_of(r) == Status.CANCELLED and not Ledger.objects.exists()


def test_manual_retry_keeps_history_and_runs_again(start_worker):
    r = tasks.always_fails.enqueue("x")
    assert start_worker("--batch").wait(timeout=30) == 0
    assert status_of(r) == Status.FAILED and Attempt.objects.filter(task_id=r.id).count() == 4
    assert ox.retry(r.id).retried == 1
    row = Task.objects.get(pk=r.id)
    assert row.status == Status.READY and row.max_attempts == 8 and row.attempts == 4
    assert not ox.retry(r.id)  # READY: not retryable
    assert start_worker("--batch").wait(timeout=30) == 0
    assert list(Attempt.objects.filter(task_id=r.id).values_list("number", flat=True)) == list(range(1, 9))
    cancelled = tasks.echo.enqueue(5)
    ox.cancel(cancelled.id)
    ox.retry(cancelled.id)
    assert start_worker("--batch").wait(timeout=30) == 0
    assert status_of(cancelled) == Status.SUCCESSFUL


def test_sigterm_hands_back_claimed_unstarted_tasks(start_worker, tmp_path):
    # The running task holds its slot until the hand-back is done: with a 1.5 s sleep, a busy
    # machine could let it finish before the SIGTERM and the worker start the prefetched ones.
    gate = tmp_path / "gate"
    running = gated_tasks.hold.enqueue("started", str(gate))
    waiting = [tasks.echo.enqueue(i) for i in range(5)]
    worker = start_worker("--concurrency", "1", env=options(prefetch=5, prefetch_window=None))
    wait_until(lambda: Ledger.objects.filter(key="started").exists(), timeout=20)
    wait_until(lambda: Task.objects.filter(status=Status.RUNNING).count() == 6, timeout=20)
    worker.signal(signal.SIGTERM)
    wait_until(lambda: "handed back" in worker.output(), timeout=20)
    gate.touch()
    assert worker.wait(timeout=20) == 0, worker.output()
    assert status_of(running) == Status.SUCCESSFUL
    for w in waiting:
        row = Task.objects.get(pk=w.id)
        assert row.status == Status.READY and row.attempts == 0 and row.worker_id == ""
    assert Worker.objects.get(pid=worker.pid).stopped_at is not None
    assert "handed back" in worker.output()


def test_second_signal_exits_at_once(start_worker):
    r = tasks.record_then_sleep.using(priority=10).enqueue("started", 30)
    spare = tasks.echo.enqueue("spare")  # claimed ahead (PREFETCH=1); the first signal hands it back
    worker = start_worker("--concurrency", "1", env=options(prefetch=1, prefetch_window=None))
    wait_until(lambda: Ledger.objects.filter(key="started").exists(), timeout=20)
    wait_until(lambda: status_of(spare) == Status.RUNNING, timeout=20)
    worker.signal(signal.SIGTERM)
    # Two signals in quick succession can merge into one (a busy machine may not run the
    # worker between them): send the second once the first has visibly been handled.
    wait_until(lambda: "handed back" in worker.output(), timeout=20)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=5) == 1
    assert status_of(r) == Status.RUNNING  # the rescuer will take it back


def test_supervisor_in_batch_mode_exits_when_its_children_are_done(start_worker):
    results = [tasks.echo.enqueue(i) for i in range(20)]
    supervisor = start_worker("--processes", "2", "--batch")
    assert supervisor.wait(timeout=60) == 0, supervisor.output()
    assert all(status_of(r) == Status.SUCCESSFUL for r in results)
    assert Worker.objects.count() == 2  # finished children were not restarted


def test_supervisor_restarts_a_killed_child(start_worker):
    supervisor = start_worker("--processes", "2", env=options(heartbeat=0.3))
    wait_until(lambda: Worker.objects.filter(stopped_at__isnull=True).count() == 2, timeout=30)
    victim = Worker.objects.filter(stopped_at__isnull=True).first()
    import os

    os.kill(victim.pid, signal.SIGKILL)
    wait_until(lambda: Worker.objects.exclude(pid=victim.pid).filter(stopped_at__isnull=True).count() == 2, timeout=30)
    results = [tasks.echo.enqueue(i) for i in range(10)]
    wait_until(lambda: all(status_of(r) == Status.SUCCESSFUL for r in results), timeout=30)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0, supervisor.output()
    assert not Worker.objects.filter(stopped_at__isnull=True).exclude(pid=victim.pid).exists()
