"""An adversarial review of the worker's promises (commit ed42ad9): each test is a
reproduction that fails while the defect it names is there. Real worker subprocesses on
SQLite and PostgreSQL, no mocks; every wait bounded."""

import json
import os
import signal
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.tasks import TaskResultStatus, task_backends

import ox
from ox import sql
from ox.models import Attempt, Outcome, Status, Task, Worker
from tests import attack_tasks, tasks
from tests.helpers import wait_until
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)
postgres_only = pytest.mark.skipif("connection.vendor != 'postgresql'")


def options(**values):
    return {"OX_TEST_OPTIONS": json.dumps({k.upper(): v for k, v in values.items()})}


def status(r):
    # Only the status column: some rows here hold values the ORM itself cannot decode.
    return Task.objects.filter(pk=r.id).values_list("status", flat=True).get()


def statuses(results):
    return [status(r) for r in results]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_share(pid: int, seconds: float) -> float:
    """The share of one CPU a process uses over the next `seconds`."""
    before, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - t0)


def stop(worker, timeout=30):
    worker.signal(signal.SIGTERM)
    return worker.wait(timeout=timeout)


# ---------------------------------------------------------------- --batch


def test_batch_worker_runs_the_tasks_it_handed_back(start_worker):
    # noop becomes known-short after the first claim; sleep_for is claimed with the
    # prefetch but not known yet, so it goes straight back. The worker must still run it
    # before --batch lets it exit ("Exit once no task is due and none is running").
    noops = [tasks.noop.enqueue() for _ in range(30)]
    later = [tasks.sleep_for.enqueue(0.01) for _ in range(3)]
    worker = start_worker("--batch")
    code = worker.wait(timeout=60)
    assert code == 0, worker.output()
    assert statuses(noops) == [Status.SUCCESSFUL] * 30
    assert statuses(later) == [Status.SUCCESSFUL] * 3, worker.output()


def test_a_retry_an_hour_away_does_not_keep_a_batch_worker_running(start_worker):
    # After the first attempt nothing is due (the retry is an hour away) and nothing runs:
    # --batch should exit. (A backoff of 10**400 is "capped at ten years": same story.)
    r = attack_tasks.fails_and_retries_in_an_hour.enqueue()
    worker = start_worker("--batch")
    wait_until(lambda: Attempt.objects.filter(task_id=r.id).exists(), timeout=30)
    try:
        code = worker.wait(timeout=15)
    except Exception:  # noqa: BLE001
        code = None
    assert code == 0, ("still running 15 s after its last task", status(r), worker.output()[-2000:])


# ---------------------------------------------------------------- rows and results the database refuses


@postgres_only
def test_a_row_whose_arguments_nest_too_deep_fails_alone(start_worker):
    # jsonb stores 10,000 nested arrays; Python's json.loads gives up (RecursionError, not
    # ValueError) below that. "A row that does not decode fails alone" (README).
    poison = tasks.echo.enqueue(0)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE ox_task SET args = (repeat('[', 10000) || repeat(']', 10000))::jsonb WHERE id = %s", [poison.id]
        )
    fine = [tasks.echo.enqueue(i) for i in range(5)]
    worker = start_worker(env=options(heartbeat=0.5))
    try:
        wait_until(lambda: statuses(fine) == [Status.SUCCESSFUL] * 5 and status(poison) == Status.FAILED, 20)
    except AssertionError:
        fences = Task.objects.filter(pk=poison.id).values_list("fence", flat=True).get()
        raise AssertionError(
            f"poison {status(poison)} (claimed {fences} times), others {statuses(fine)}\n{worker.output()[-1500:]}"
        ) from None
    stop(worker)


@postgres_only
def test_a_return_value_too_big_for_jsonb_fails_alone(start_worker):
    # 2**28 characters: one byte over what a jsonb string holds. PostgreSQL refuses it with
    # program_limit_exceeded, which Django raises as OperationalError, which the worker
    # takes for a lost connection: reconnect, write the same batch again, forever.
    big = attack_tasks.huge_string.enqueue(2**28)
    after = [tasks.echo.enqueue(i) for i in range(3)]
    worker = start_worker(env=options(heartbeat=0.5))
    try:
        wait_until(lambda: status(big) == Status.FAILED and statuses(after) == [Status.SUCCESSFUL] * 3, 90)
    except AssertionError:
        out = worker.output()
        raise AssertionError(
            f"big {status(big)}, after {statuses(after)}; reconnects: {out.count('reconnecting')}\n{out[-1200:]}"
        ) from None
    assert Task.objects.filter(pk=big.id).values_list("attempts", flat=True).get() == 1
    stop(worker)


@postgres_only
def test_an_exception_with_a_long_class_path_fails_alone(start_worker):
    # ox_attempt.exception_class_path is varchar(255): the failure cannot be written, not
    # even on the "keep what can be stored" second try, and it stays first in line. Every
    # claim flushes failures first: the worker never claims again.
    bad = attack_tasks.raises_long_named.enqueue()
    after = [tasks.echo.enqueue(i) for i in range(3)]
    worker = start_worker()
    try:
        wait_until(lambda: status(bad) == Status.FAILED and statuses(after) == [Status.SUCCESSFUL] * 3, 20)
    except AssertionError:
        raise AssertionError(f"bad {status(bad)}, after {statuses(after)}\n{worker.output()[-1500:]}") from None
    stop(worker)


# ---------------------------------------------------------------- async prefetch


def _async_prefetch_setup(start_worker, env):
    """A worker with one async slot learns async_nap is short, then claims a long one with
    five short ones prefetched behind it."""
    teach = attack_tasks.async_nap.enqueue(0.0)
    long = attack_tasks.async_nap.enqueue(6.0)
    shorts = [attack_tasks.async_nap.enqueue(0.0) for _ in range(5)]
    worker = start_worker("--async-concurrency", "1", env=env)
    wait_until(lambda: status(teach) == Status.SUCCESSFUL, timeout=20)
    wait_until(lambda: Task.objects.filter(pk=long.id, last_attempted_at__isnull=False).exists(), timeout=20)
    return long, shorts, worker


def test_prefetched_async_tasks_behind_a_long_one_are_given_back(start_worker):
    long, shorts, a = _async_prefetch_setup(start_worker, options(heartbeat=0.3))
    b = start_worker("--async-concurrency", "5")  # idle, and ready for them
    wait_until(lambda: Worker.objects.filter(pid=b.pid).exists(), timeout=20)
    # "prefetched tasks waiting behind tasks that run past the 50 ms window are given
    # back": the sync executor does it; async ones wait on the semaphore until the long
    # one ends, while b sits idle.
    try:
        wait_until(lambda: statuses(shorts) == [Status.SUCCESSFUL] * 5, timeout=3.0)
    except AssertionError:
        held = Task.objects.filter(pk__in=[r.id for r in shorts], status=Status.RUNNING).count()
        raise AssertionError(f"{held} of 5 short async tasks still held by a behind the 6 s task") from None
    finally:
        stop(a)
        stop(b)


def test_a_cancelled_prefetched_async_task_does_not_spin_the_loop(start_worker):
    env = options(heartbeat=0.3, interrupt_grace=0.3)
    long, shorts, worker = _async_prefetch_setup(start_worker, env)
    ox.cancel(shorts[0].id)
    time.sleep(1.0)  # the heartbeat delivers the cancel; the interrupt grace runs out
    share = cpu_share(worker.pid, 2.0)
    # The cancelled task waits (unstarted) behind the long one; its interrupt deadline
    # (interrupted_at + INTERRUPT_GRACE) is in the past, so _wait_time() returns 0.
    assert share < 0.3, f"the idle worker loop used {share:.0%} of a CPU"
    wait_until(lambda: status(shorts[0]) == Status.CANCELLED, timeout=20)
    stop(worker)


def test_a_prefetched_async_task_cancelled_before_it_started_reads_as_never_started(start_worker):
    # PREFETCH_WINDOW None: prefetch regardless of durations, so the shorts stay claimed
    # (unstarted) behind the long one instead of being given back.
    long, shorts, worker = _async_prefetch_setup(start_worker, options(heartbeat=0.3, prefetch_window=None))
    assert ox.cancel(shorts[0].id).cancel_requested == 1
    wait_until(lambda: status(shorts[0]) == Status.CANCELLED, timeout=30)
    result = task_backends["default"].get_result(shorts[0].id)
    # Its body never ran: no start time (as when a cancelled claim is handed back).
    assert (result.started_at, result.last_attempted_at) == (None, None), worker.output()[-1500:]
    stop(worker)


def test_no_claim_and_hand_back_spin_for_async_tasks_enqueued_before_0007(start_worker):
    # Rows from before migration 0007 have is_async false (0007 adds the column with
    # db_default false and fills nothing): async tasks claimed under the sync limit. With
    # the async slots full, each claim takes one, finds no async room, hands it back, and
    # claims it again at once (more_waiting: "got all it asked for").
    naps = [attack_tasks.async_nap.enqueue(3.0) for _ in range(7)]
    Task.objects.filter(pk__in=[r.id for r in naps]).update(is_async=False)
    worker = start_worker("--async-concurrency", "5")
    wait_until(lambda: Task.objects.filter(last_attempted_at__isnull=False, status=Status.RUNNING).count() == 5, 20)
    before = sum(Task.objects.filter(pk__in=[r.id for r in naps]).values_list("fence", flat=True))
    time.sleep(2.0)
    after = sum(Task.objects.filter(pk__in=[r.id for r in naps]).values_list("fence", flat=True))
    # A mis-hinted task that finds no room goes back and is tried again once a poll
    # interval (1 s) or when a slot frees: a few fence bumps, not thousands.
    assert after - before <= 6, (before, after, worker.output()[-1500:])
    stop(worker)


@postgres_only
def test_an_enqueue_notify_wakes_the_worker_for_async_tasks_too(start_worker):
    # "on PostgreSQL an enqueue's commit NOTIFYs idle workers": the NOTIFY wakes the loop,
    # but until a first async task has been seen the claim asks for async tasks only once a
    # poll interval (next_async_probe), so an async task waits the whole interval.
    worker = start_worker("--interval", "15")
    wait_until(lambda: Worker.objects.filter(pid=worker.pid).exists(), timeout=20)
    time.sleep(1.0)
    sync_one = tasks.echo.enqueue("sync")
    wait_until(lambda: status(sync_one) == Status.SUCCESSFUL, timeout=5)  # the NOTIFY works
    async_one = attack_tasks.async_nap.enqueue(0.0)
    try:
        wait_until(lambda: status(async_one) == Status.SUCCESSFUL, timeout=5)
    except AssertionError:
        raise AssertionError(f"the async task is still {status(async_one)} 5 s after its NOTIFY") from None
    finally:
        stop(worker)


@postgres_only
def test_an_async_task_due_a_moment_after_its_notify_is_not_left_for_the_poll(start_worker):
    # The NOTIFY wakes the loop and the claim looks for async tasks, but this one is not due
    # yet (scheduled 0.5 s ahead; the same happens when the producer's reading of the
    # database clock is a few ms ahead of the worker's): the worker must come back when it
    # is due, not at its next async probe a poll interval (15 s) later. Found by CI.
    worker = start_worker("--interval", "15")
    wait_until(lambda: Worker.objects.filter(pid=worker.pid).exists(), timeout=20)
    time.sleep(1.0)
    soon = attack_tasks.async_nap.using(run_after=timedelta(seconds=0.5)).enqueue(0.0)
    try:
        wait_until(lambda: status(soon) == Status.SUCCESSFUL, timeout=5)
    except AssertionError:
        raise AssertionError(f"the async task is still {status(soon)} 4.5 s after it was due") from None
    finally:
        stop(worker)


# ---------------------------------------------------------------- idle loop


@postgres_only
def test_an_idle_worker_does_not_spin_through_the_liveness_grace_after_a_reconnect(start_worker):
    # After a reconnect, until LIVENESS_GRACE has passed, the rescue is skipped without
    # moving next_rescue, which stays in the past: _wait_time() is 0 the whole grace.
    worker = start_worker(env=options(liveness_grace=6.0))
    wait_until(lambda: Worker.objects.filter(pid=worker.pid).exists(), timeout=20)
    time.sleep(1.0)
    assert cpu_share(worker.pid, 1.0) < 0.3, "busy before the reconnect already"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s AND granted",
            [sql.LOCK_NAMESPACE, Worker.objects.get(pid=worker.pid).lock_key],
        )
        (backend_pid,) = cursor.fetchone()
        cursor.execute("SELECT pg_terminate_backend(%s)", [backend_pid])
    wait_until(lambda: "reconnected" in worker.output(), timeout=20)
    share = cpu_share(worker.pid, 2.0)
    assert share < 0.2, f"an idle worker used {share:.0%} of a CPU after reconnecting"
    assert stop(worker) == 0


# ---------------------------------------------------------------- operations and signals


def test_cancel_reports_what_it_did_for_a_filtered_queryset():
    # The admin's action gets the changelist's queryset, filtered by status when the
    # operator filtered the list (list_filter = ("status", ...)).
    for i in range(3):
        tasks.echo.enqueue(i)
    changed = ox.cancel(Task.objects.filter(status=Status.READY))
    assert set(Task.objects.values_list("status", flat=True)) == {Status.CANCELLED}
    assert (changed.cancelled, changed.cancel_requested) == (3, 0), changed


def test_task_finished_is_sent_when_the_arguments_no_longer_fit(start_worker):
    # Django's backends send task_finished (FAILED) when the call raises TypeError; ox
    # records the misfit without a TaskResult, so no receiver ever hears of it.
    ok = attack_tasks.takes_one.enqueue(1)
    misfit = attack_tasks.takes_one.enqueue(1, 2)
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert status(ok) == Status.SUCCESSFUL and status(misfit) == Status.FAILED
    assert Ledger.objects.filter(key=f"finished:{ok.id}:{TaskResultStatus.SUCCESSFUL}").exists()
    assert task_backends["default"].get_result(misfit.id).status == TaskResultStatus.FAILED
    heard = Ledger.objects.filter(key__startswith=f"finished:{misfit.id}:").count()
    assert heard == 1, worker.output()


def test_a_backoff_that_calls_sys_exit_falls_back_to_the_default_delay(start_worker):
    # A backoff raising Exception is "handled" (default delay, a note); one raising
    # SystemExit escapes decide_retry, the attempt is reported as the worker's own crash
    # (retryable=True, but retry_in stays None) and the task is FAILED after one attempt.
    r = attack_tasks.backoff_exits.enqueue()
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    row = Task.objects.get(pk=r.id)
    assert (row.status, row.attempts) == (Status.FAILED, 3), worker.output()[-1500:]


def test_a_task_finished_receiver_that_exits_does_not_silence_later_signals(start_worker):
    # FinishedSignals._run catches Exception: a receiver's SystemExit ends the ox-signals
    # thread, and no task_finished is sent again for the worker's life.
    first = attack_tasks.upsets_a_receiver.enqueue()
    later = [attack_tasks.takes_one.enqueue(i) for i in range(3)]
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert statuses([first, *later]) == [Status.SUCCESSFUL] * 4
    heard = [Ledger.objects.filter(key=f"finished:{r.id}:{TaskResultStatus.SUCCESSFUL}").exists() for r in later]
    assert heard == [True] * 3, worker.output()[-1500:]


def test_an_async_task_that_swallows_its_timeout_is_not_recorded_successful(start_worker):
    # "a sync task past its timeout is interrupted inside its thread, an async one is
    # cancelled; both are recorded as timed_out" (a sync one that ignores it makes the
    # worker exit 3). An async one that swallows the CancelledError runs on 10x past its
    # timeout, unnoticed, and asyncio.timeout() raises nothing when the body then returns.
    r = attack_tasks.async_ignores_its_timeout.enqueue(3.0)
    worker = start_worker("--batch")
    worker.wait(timeout=60)
    row = Task.objects.get(pk=r.id)
    outcomes = list(Attempt.objects.filter(task_id=r.id).values_list("outcome", flat=True))
    assert (row.status, outcomes) == (Status.FAILED, [Outcome.TIMED_OUT]), (row.status, outcomes, row.return_value)
