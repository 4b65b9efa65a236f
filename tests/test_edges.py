"""Trust at the edges: odd values, async tasks that raise what a loop fears, misbehaving
policies, cancels racing failures, prefetch and claim sizing, outages. Real worker
subprocesses on SQLite and PostgreSQL."""

import json
import signal
import time

import psycopg
import pytest
from django.db import connection
from django.tasks import TaskResultStatus, task_backends
from django.utils import timezone

import ox
from ox import clock, sql
from ox.completer import Completer
from ox.conf import OxOptions
from ox.execution import SUCCESSFUL, Finished
from ox.models import Attempt, Outcome, Status, Task, Worker
from tests import tasks
from tests.helpers import wait_until
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)
postgres_only = pytest.mark.skipif("connection.vendor != 'postgresql'")


def options(**values):
    return {"OX_TEST_OPTIONS": json.dumps({k.upper(): v for k, v in values.items()})}


def row(r):
    return Task.objects.get(pk=r.id)


def drain(start_worker, *args, env=None, timeout=60):
    worker = start_worker("--batch", *args, env=env)
    code = worker.wait(timeout=timeout)
    assert code == 0, worker.output()
    return worker


# ---------------------------------------------------------------- odd values


def test_lone_surrogates_in_results_and_errors_fail_alone(start_worker):
    fine = [tasks.echo.enqueue(i) for i in range(20)]
    bad_result = tasks.returns_lone_surrogate.enqueue()
    bad_error = tasks.raises_lone_surrogate.enqueue()
    more = [tasks.echo.enqueue(i) for i in range(20)]
    worker = drain(start_worker, "--concurrency", "2")
    assert all(row(r).status == Status.SUCCESSFUL for r in fine + more), worker.output()
    # Not storable as text on any database: failed once, not retried (the body would
    # return the same value again), with a reason that says so.
    r = row(bad_result)
    assert (r.status, r.attempts) == (Status.FAILED, 1)
    assert "lone surrogate" in Attempt.objects.get(task_id=r.id).traceback
    # The exception's message is kept, its surrogate written out as an escape.
    e = row(bad_error)
    assert e.status == Status.FAILED
    (attempt,) = Attempt.objects.filter(task_id=e.id)
    assert "cannot open file-\\udcff" in attempt.traceback and attempt.exception_class_path == "builtins.ValueError"


def test_return_values_stored_as_django_normalises_them(start_worker):
    keys = tasks.returns_int_keys.enqueue()
    drain(start_worker)
    result = task_backends["default"].get_result(keys.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == {"1": "a", "b": [1, 2]}
    assert row(keys).attempts == 1


def test_arguments_with_lone_surrogates_refused_at_enqueue():
    with pytest.raises(ox.exceptions.ArgumentsNotJSON, match="lone surrogate"):
        tasks.echo.enqueue("file-\udcff")
    with pytest.raises(ox.exceptions.ArgumentsNotJSON, match="lone surrogate"):
        tasks.echo.enqueue({"\udcff": 1})
    with pytest.raises(ox.exceptions.ArgumentsNotJSON, match="too long"):
        tasks.echo.enqueue(10**5000)
    assert not Task.objects.exists()


@postgres_only
def test_a_batch_the_database_refuses_is_split_until_the_poison_row_is_found():
    # The mechanism behind the above, with a row only PostgreSQL's jsonb refuses: the
    # other completions of the batch are written, the poison one fails with the reason.
    for i in range(7):
        tasks.echo.enqueue(i)
    now = clock.db_now(connection)
    claimed = sql.claim(connection, "w", ["default"], 7, now, now + timezone.timedelta(minutes=1))
    completer = Completer("w", OxOptions(), object)
    for i, c in enumerate(claimed):
        value = '"\\udcff"' if i == 4 else str(i)  # an escape jsonb rejects
        completer.add(Finished(c, SUCCESSFUL, now, now, return_json=value))
    completer.isolate(connection, lambda batch: sql.complete(connection, batch))
    statuses = [Task.objects.get(pk=c.id).status for c in claimed]
    assert statuses == [Status.SUCCESSFUL] * 4 + [Status.FAILED] + [Status.SUCCESSFUL] * 2
    assert "refused" in Attempt.objects.get(task_id=claimed[4].id).traceback
    assert not completer


# ---------------------------------------------------------------- async tasks


@pytest.mark.parametrize("kind", ["cancelled", "exit", "interrupt", "subtask-exit"])
def test_async_task_raising_what_a_loop_fears_fails_alone(start_worker, kind):
    bad = tasks.async_raises.enqueue(kind)
    worker = start_worker("--async-concurrency", "10", env=options(heartbeat=0.3, lease=3))
    wait_until(lambda: row(bad).status in (Status.FAILED, Status.SUCCESSFUL), timeout=30)
    assert row(bad).status == Status.FAILED and row(bad).attempts == 2, worker.output()
    # The loop survived: later async and sync tasks still run.
    later = [tasks.async_echo.enqueue(i) for i in range(5)] + [tasks.echo.enqueue("sync")]
    wait_until(lambda: all(row(r).status == Status.SUCCESSFUL for r in later), timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()


# ---------------------------------------------------------------- policies, signals


def test_a_backoff_returning_inf_or_sleeping_does_not_hurt_the_worker(start_worker):
    inf = tasks.backoff_inf.enqueue()
    slow = tasks.backoff_slow.enqueue()
    long = tasks.sleep_for.enqueue(4)
    worker = start_worker("--concurrency", "3", env=options(lease=1.5, heartbeat=0.3, rescue_interval=0.3))
    wait_until(lambda: all(row(r).status != Status.READY and row(r).finished_at for r in (inf, slow, long)), 60)
    assert row(inf).status == Status.FAILED and row(inf).attempts == 2, worker.output()
    assert "used the default delay" in Attempt.objects.filter(task_id=inf.id).first().traceback
    assert row(slow).status == Status.FAILED and row(slow).attempts == 2
    # The slow backoff ran in the task's thread: the loop kept renewing every lease.
    assert row(long).status == Status.SUCCESSFUL
    assert not Attempt.objects.filter(outcome=Outcome.LOST).exists(), worker.output()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_failure_signal_carries_its_traceback_to_djangos_log(start_worker):
    tasks.fails_once_only.enqueue()
    worker = drain(start_worker)
    out = worker.output()
    line = next(i for i, text in enumerate(out.splitlines()) if "state=FAILED" in text)
    assert "Traceback" in "\n".join(out.splitlines()[line : line + 3]), out


# ---------------------------------------------------------------- cancels


def test_cancel_of_a_running_task_holds_when_its_attempt_fails_first(start_worker):
    r = tasks.fails_after.enqueue(1.0)
    # A long heartbeat: the attempt fails before any heartbeat could deliver the cancel.
    worker = start_worker(env=options(heartbeat=20, lease=60))
    wait_until(lambda: row(r).status == Status.RUNNING and row(r).last_attempted_at is not None, timeout=20)
    assert ox.cancel(r.id).cancel_requested == 1
    wait_until(lambda: row(r).status not in (Status.RUNNING, Status.READY), timeout=20)
    done = row(r)
    assert (done.status, done.attempts) == (Status.CANCELLED, 1), worker.output()
    assert task_backends["default"].get_result(r.id).status == TaskResultStatus.FAILED
    worker.signal(signal.SIGTERM)
    worker.wait(timeout=30)


def test_cancel_requested_survives_rescue_and_hand_back():
    a, b = tasks.echo.enqueue(1), tasks.echo.enqueue(2)
    now = clock.db_now(connection)
    ca, cb = sql.claim(connection, "ghost", ["default"], 2, now, now)
    assert ox.cancel([a.id, b.id]).cancel_requested == 2
    later = now + timezone.timedelta(seconds=1)
    assert {s for _t, _w, s in sql.rescue(connection, later, liveness_grace=1.0)} == {"CANCELLED"}
    c = tasks.echo.enqueue(3)
    (cc,) = sql.claim(connection, "w", ["default"], 1, later, later + timezone.timedelta(minutes=1))
    ox.cancel(c.id)
    assert sql.hand_back(connection, [cc.key], later) == 1
    assert {t.status for t in Task.objects.all()} == {Status.CANCELLED}
    assert ca.fence and cb.fence  # claimed once each


# ---------------------------------------------------------------- claim sizing and prefetch


def test_no_claim_and_hand_back_spin_with_async_slots_free(start_worker):
    tasks.async_echo.enqueue(1)
    waiting = [tasks.sleep_for.enqueue(1.5) for _ in range(4)]
    worker = start_worker("--concurrency", "1", env=options(heartbeat=0.5))
    wait_until(lambda: Task.objects.filter(status=Status.SUCCESSFUL).count() >= 2, timeout=30)
    time.sleep(1.0)
    # While one long sync task runs and async slots sit free, the others stay unclaimed:
    # a claim/hand-back loop would bump their fences thousands of times a second. (A
    # prefetched task of a path not yet known to be short goes back once: fence 2.)
    fences = [row(r).fence for r in waiting if row(r).status == Status.READY]
    assert fences and max(fences) <= 2, (fences, worker.output())
    worker.signal(signal.SIGTERM)
    worker.wait(timeout=30)


@pytest.mark.parametrize("first", ["noop", "same-path"])
def test_prefetch_never_hoards_long_tasks(start_worker, first):
    short = [tasks.noop.enqueue() if first == "noop" else tasks.sleep_for.enqueue(0.0) for _ in range(200)]
    long = [tasks.sleep_for.enqueue(2.0) for _ in range(10)]
    worker = start_worker("--concurrency", "1")
    wait_until(lambda: all(row(r).status == Status.SUCCESSFUL for r in short), timeout=60)
    wait_until(lambda: Task.objects.filter(status=Status.RUNNING).exists(), timeout=20)
    # Past the prefetch window and a heartbeat, one long task runs; the others are READY
    # for any worker (given back, or never claimed ahead).
    time.sleep(1.0)
    running = Task.objects.filter(pk__in=[r.id for r in long], status=Status.RUNNING).count()
    assert running == 1, worker.output()
    worker.signal(signal.SIGTERM)
    worker.wait(timeout=30)


def test_prefetched_task_reads_ready_until_its_body_starts(start_worker):
    tasks.sleep_for.enqueue(0.0)  # teaches the worker that sleep_for is short...
    blocker = tasks.sleep_for.using(priority=5).enqueue(3.0)  # ...then one is not
    worker = start_worker("--concurrency", "1")
    behind = tasks.sleep_for.enqueue(0.0)
    wait_until(lambda: task_backends["default"].get_result(blocker.id).status == TaskResultStatus.RUNNING, 20)
    fetched = task_backends["default"].get_result(behind.id)
    assert fetched.status == TaskResultStatus.READY and fetched.started_at is None
    wait_until(lambda: row(behind).status == Status.SUCCESSFUL, timeout=30)
    done = task_backends["default"].get_result(behind.id)
    assert done.started_at >= task_backends["default"].get_result(blocker.id).finished_at - timezone.timedelta(
        seconds=0.05
    ), worker.output()
    worker.signal(signal.SIGTERM)
    worker.wait(timeout=30)


def test_handed_back_tasks_read_as_never_started():
    r = tasks.echo.enqueue(1)
    now = clock.db_now(connection)
    (c,) = sql.claim(connection, "w", ["default"], 1, now, now + timezone.timedelta(minutes=1))
    sql.hand_back(connection, [c.key], now)
    back = row(r)
    assert (back.status, back.attempts, back.started_at, back.last_attempted_at) == (Status.READY, 0, None, None)


# ---------------------------------------------------------------- outages and liveness


def _admin_url():
    s = connection.settings_dict
    return f"postgresql://{s['USER']}@{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/postgres"


def _terminate(pids):
    with psycopg.connect(_admin_url(), autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])


def _worker_lock_pid(worker_row):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s AND objid = %s AND granted",
            [sql.LOCK_NAMESPACE, worker_row.lock_key],
        )
        found = cursor.fetchone()
    return found[0] if found else None


@postgres_only
def test_a_live_worker_that_reconnects_keeps_its_tasks(start_worker):
    r = tasks.record_sleep.enqueue("blip", 3.0)
    env = options(heartbeat=0.5, rescue_interval=0.2)
    a = start_worker(env=env)
    wait_until(lambda: Ledger.objects.filter(key="blip").exists(), timeout=20)
    b = start_worker(env=env)  # its rescuer watches a's liveness lock
    wait_until(lambda: Worker.objects.filter(pid=b.pid).exists(), timeout=20)
    holder = Worker.objects.get(pid=a.pid)
    _terminate([_worker_lock_pid(holder)])  # a's connection drops; a is alive
    wait_until(lambda: row(r).status == Status.SUCCESSFUL, timeout=30)
    assert Ledger.objects.filter(key="blip").count() == 1, (a.output(), b.output())
    assert not Attempt.objects.filter(task_id=r.id).exists()
    assert "reconnected" in a.output()
    for w in (a, b):
        w.signal(signal.SIGTERM)
        assert w.wait(timeout=30) == 0


@postgres_only
def test_outcomes_finished_during_an_outage_longer_than_the_lease_are_written_not_rerun(start_worker):
    r = tasks.record_sleep.enqueue("outage", 1.0)
    worker = start_worker(env=options(lease=1.5, heartbeat=0.3, rescue_interval=0.2))
    wait_until(lambda: Ledger.objects.filter(key="outage").exists(), timeout=20)
    name = connection.settings_dict["NAME"]
    with psycopg.connect(_admin_url(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
                " AND application_name <> 'pytest-keep'",
                [name],
            )
            time.sleep(3.0)  # the task finishes meanwhile; its lease (1.5 s) runs out
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    connection.close()
    wait_until(lambda: row(r).status == Status.SUCCESSFUL, timeout=30)
    assert Ledger.objects.filter(key="outage").count() == 1, worker.output()
    assert not Attempt.objects.filter(task_id=r.id).exists(), worker.output()
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


@postgres_only
def test_a_worker_whose_idle_connections_are_cut_keeps_every_task_moving(start_worker):
    # idle_session_timeout (or a proxy) closes any session idle for a second: the worker's
    # own connection between retries, its listener. Retried tasks read their history after
    # the claim; nothing that fails after a claim may leave tasks claimed but never run.
    name = connection.settings_dict["NAME"]
    with psycopg.connect(_admin_url(), autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE \"{name}\" SET idle_session_timeout = '700ms'")
    try:
        retried = [tasks.fail_until_third.enqueue(f"k{i}") for i in range(3)]
        worker = start_worker("--concurrency", "2", env=options(backoff_base=1.5, backoff_max=2.0))
        wait_until(lambda: all(row(r).status == Status.SUCCESSFUL for r in retried), timeout=60)
    finally:
        with psycopg.connect(_admin_url(), autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" RESET idle_session_timeout')
    assert all(row(r).attempts == 3 for r in retried), worker.output()
    later = tasks.echo.enqueue("after")
    wait_until(lambda: row(later).status == Status.SUCCESSFUL, timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()


# ---------------------------------------------------------------- Django's contract


def test_get_result_task_keeps_its_run_after_through_failures_and_retries():
    later = clock.db_now(connection) + timezone.timedelta(seconds=1)
    task = tasks.fail_until_third.using(run_after=later)
    r = task.enqueue("deferred")
    now = later + timezone.timedelta(seconds=1)
    (c,) = sql.claim(connection, "w", ["default"], 1, now, now + timezone.timedelta(minutes=1))
    retry_at = now + timezone.timedelta(seconds=30)
    sql.fail(connection, sql.Failure(c.id, c.fence, 1, "w", now, now, "failed", "x.Y", "tb", retry_at))
    assert row(r).run_after == retry_at  # the row's next due time moved...
    fetched = task_backends["default"].get_result(r.id)
    assert fetched.task.run_after == later and fetched.task == task  # ...the task's run_after did not
    ox.cancel(r.id)
    ox.retry(r.id)
    assert task_backends["default"].get_result(r.id).task == task


def test_validate_task_checks_supports_defer_for_a_timedelta_too():
    from ox.backend import OxBackend

    class NoDefer(OxBackend):
        supports_defer = False

    backend = NoDefer("nodefer", {"QUEUES": ["default"], "OPTIONS": {}})
    with pytest.raises(ox.exceptions.InvalidTask, match="run_after"):
        backend.validate_task(tasks.echo.using(run_after=timezone.timedelta(minutes=1)))
