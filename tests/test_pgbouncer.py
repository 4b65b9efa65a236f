"""ox behind a real PgBouncer (/usr/sbin/pgbouncer) in transaction mode, started per test in
front of the test database.

In transaction mode a server session belongs to a client for one transaction only. Whatever a
client leaves on a session outside a transaction (a session advisory lock, LISTEN, a
`set_config(..., false)`, a prepared statement) stays with the pooler's server connection and
is seen by the next client handed that connection. With OPTIONS POOLER = "transaction" the
worker keeps none of it: no liveness lock (rescue waits for the lease), no LISTEN (it polls,
unless LISTEN_DATABASE names a direct alias), no server-side keepalive settings, no prepared
statements. These tests run real workers and producers through PgBouncer and look at what
the shared server session holds.

Needs PostgreSQL as the test database (skips on the SQLite leg) and PgBouncer: without it
the tests skip, except with CI=true, where they fail and say so (.ci/run installs pgbouncer).
"""

import signal
import statistics
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import ProgrammingError, connections
from django.db.models import Count
from django.utils import timezone

from ox.models import Attempt, Outcome, Status, Task, Tick, Worker
from tests import tasks
from tests.conftest import WorkerProcess, database_url
from tests.helpers import wait_until
from tests.pgbouncer import (  # noqa: F401  (the fixtures "pgbouncer" and "through")
    POOLED,
    Bouncer,
    listening_sessions,
    live,
    pgbouncer_fixture,
    produce,
    through_fixture,
    worker_locks,
)
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


# ---------------------------------------------------------------- enqueue and drain


def test_enqueue_and_a_worker_through_pgbouncer_drain_retry_fail_tick_and_prune(pgbouncer, through, worker_env):
    # A pool of 2 server sessions for the worker's own connection, its 2 task threads and the
    # producer: they take turns on the same sessions, as behind a busy pooler.
    bouncer = pgbouncer(pool_size=2)
    old = tasks.echo.enqueue("old")  # a finished task past its retention, for the worker's pruner
    Task.objects.filter(pk=old.id).update(status=Status.CANCELLED, finished_at=timezone.now() - timedelta(days=3))
    produce(
        bouncer,
        "import ox\n"
        "from django.db import transaction\n"
        "from tests import tasks\n"
        "ox.enqueue_many(tasks.record, [((f'bulk{i}',), {}) for i in range(200)], batch_size=80)\n"  # COPY
        "for i in range(10):\n"
        "    tasks.record.enqueue(f'one{i}')\n"
        "    with transaction.atomic():\n"
        "        tasks.record.enqueue(f'atomic{i}')\n"
        "for i in range(3):\n"
        "    tasks.fail_until_third.enqueue(f'flaky{i}')\n"
        "tasks.always_fails.enqueue('no')\n",
        worker_env,
    )
    assert live(Status.READY) == 224
    before = bouncer.transactions()
    options = {
        **POOLED,
        "SCHEDULES": {"beat": {"task": "tests.tasks.record", "every": 1, "args": ["beat"]}},
        "PRUNE": {"CANCELLED": "1d"},
    }
    worker = through(bouncer, "--concurrency", "2", options=options)

    def drained() -> bool:
        done = Task.objects.exclude(task_path="tests.tasks.record", args=["beat"])
        return not done.filter(status__in=[Status.READY, Status.RUNNING]).exists() and Tick.objects.count() >= 3

    try:
        wait_until(drained, timeout=90, interval=0.2)
    except AssertionError:
        left = list(
            Task.objects.exclude(status__in=[Status.SUCCESSFUL, Status.FAILED]).values_list("task_path", "status")
        )
        raise AssertionError(f"not drained: {left[:10]}, ticks {Tick.objects.count()}\n{worker.output()[-3000:]}")
    assert worker_locks() == []  # no liveness lock anywhere on the server (see the leak test)
    row = Worker.objects.get(pid=worker.pid)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    assert "a worker step failed" not in worker.output() and "database error" not in worker.output()

    assert row.lock_key == 0
    keys = set(Ledger.objects.values_list("key", flat=True))
    assert {f"bulk{i}" for i in range(200)} | {f"one{i}" for i in range(10)} | {f"atomic{i}" for i in range(10)} <= keys
    flaky = Task.objects.filter(task_path="tests.tasks.fail_until_third")
    assert sorted(flaky.values_list("status", "attempts")) == [(Status.SUCCESSFUL, 3)] * 3
    failed = Task.objects.get(task_path="tests.tasks.always_fails")
    assert (failed.status, failed.attempts) == (Status.FAILED, 4)
    assert Attempt.objects.filter(task_id=failed.id, outcome=Outcome.FAILED).count() == 4
    assert not Attempt.objects.filter(outcome=Outcome.LOST).exists()
    assert not Task.objects.filter(pk=old.id).exists(), "the worker's pruner did not run"
    ticks = list(Tick.objects.values_list("task_id", flat=True))
    assert len(ticks) >= 3 and Task.objects.filter(pk__in=ticks).count() == len(ticks)
    # It all went through PgBouncer (the test's own connection is direct).
    assert bouncer.transactions() - before > 100


# ---------------------------------------------------------------- session state left behind


def session_state(bouncer: Bouncer) -> dict[str, object]:
    """What a plain client handed the pool's (one) server session sees on it."""
    with bouncer.connect() as conn:
        settings = dict(conn.execute("SELECT name, setting FROM pg_settings").fetchall())
        return {
            "backend": conn.execute("SELECT pg_backend_pid()").fetchone()[0],
            "settings": settings,
            "listening": [r[0] for r in conn.execute("SELECT pg_listening_channels()")],
            "locks": conn.execute(
                "SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
            ).fetchall(),
            "prepared": conn.execute("SELECT name FROM pg_prepared_statements").fetchall(),
        }


def differences(before: dict[str, object], after: dict[str, object]) -> dict[str, object]:
    changed: dict[str, object] = {
        name: (value, after["settings"][name])  # type: ignore[index]
        for name, value in before["settings"].items()  # type: ignore[attr-defined]
        if after["settings"].get(name) != value  # type: ignore[attr-defined]
    }
    for key in ("listening", "locks", "prepared"):
        if after[key] != before[key]:
            changed[key] = after[key]
    return changed


def drain_on_one_session(bouncer: Bouncer, through, options: dict[str, object]) -> tuple[WorkerProcess, dict]:
    """Run a worker through a pool of ONE server session, so every statement of the worker
    (its loop, its task threads, a listener) and the probing client share that session; drain
    tasks and idle-poll every 0.1 s (the same statements many times over: psycopg would
    prepare them after 5 if it prepared anything); return the worker, still running, and what
    the session holds. The tasks are enqueued first: a NOTIFY reaching a LISTEN left on an
    idle pooled session makes PgBouncer drop that session, which would hide the leak."""
    baseline = session_state(bouncer)
    for i in range(40):
        tasks.record.enqueue(f"k{i}")
    worker = through(bouncer, "--concurrency", "2", options={**options, "POLL_INTERVAL": 0.1})
    wait_until(lambda: live() == 0 and Ledger.objects.count() == 40, timeout=60)
    time.sleep(1.5)  # idle: polls, heartbeats and rescue rounds on the session too
    after = session_state(bouncer)
    assert after["backend"] == baseline["backend"], "the pool of one handed out another server session"
    return worker, differences(baseline, after)


def test_a_pooled_worker_leaves_nothing_on_the_shared_server_session(pgbouncer, through):
    bouncer = pgbouncer(pool_size=1)
    worker, changed = drain_on_one_session(bouncer, through, POOLED)
    # Nothing: no keepalive setting (or any other), no LISTEN, no advisory lock, no prepared
    # statement. Django's own connection setup (SET TIME ZONE 'UTC') is a parameter PgBouncer
    # tracks per client and sets back for each, so it does not show either.
    assert changed == {}
    assert worker_locks() == []
    assert Worker.objects.get(pid=worker.pid).lock_key == 0
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()


def test_the_leak_test_sees_a_worker_not_told_about_the_pooler(pgbouncer, through):
    # The same run without POOLER: the worker sets the server's keepalives, takes its liveness
    # lock and LISTENs, each on whatever server session the pooler gave it for that statement,
    # and leaves them there for the next client. This is what the test above would see if ox
    # kept session state behind a pooler: it can fail.
    bouncer = pgbouncer(pool_size=1)
    worker, changed = drain_on_one_session(bouncer, through, {})
    lock_key = Worker.objects.get(pid=worker.pid).lock_key
    assert lock_key > 0
    # ox's defaults, meant for the worker's own session, now on the next client's
    assert (changed["tcp_keepalives_idle"][1], changed["tcp_user_timeout"][1]) == ("5", "11000"), changed
    assert changed["listening"] == ["ox_task"]
    assert changed["locks"] == [(lock_key,)]
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    # The worker is gone; its "liveness" lock is not: it stays with the pooler's server session,
    # so through a transaction pooler the lock says nothing about the worker's life (and a
    # server session the pooler closes would free it under a live worker).
    assert [objid for _pid, objid in worker_locks()] == [lock_key]


# ---------------------------------------------------------------- the kill test


def test_kill_a_pooled_worker_mid_drain_and_its_tasks_are_rescued_by_lease(pgbouncer, through):
    # Behind a transaction pooler there is no liveness lock: a SIGKILLed worker's tasks come
    # back when their lease runs out. Short leases so that takes seconds. (Had the worker taken
    # its lock through the pooler, the lock would outlive it on the pooler's server session and
    # rescue would still wait for the lease; that lock is what lock_key == 0 and the leak tests
    # rule out.)
    lease, heartbeat, rescue_interval = 3.0, 0.5, 0.5
    bouncer = pgbouncer(pool_size=4)
    total = 400
    from ox import enqueue_many

    enqueue_many(tasks.record_then_sleep, [((f"k{i}", 0.05), {}) for i in range(total)])
    options = {**POOLED, "LEASE": lease, "HEARTBEAT": heartbeat, "RESCUE_INTERVAL": rescue_interval}
    victim = through(bouncer, "--concurrency", "2", options=options)
    survivor = through(bouncer, "--concurrency", "2", options=options)
    victim_id = wait_until(lambda: Worker.objects.filter(pid=victim.pid).values_list("id", flat=True).first())
    wait_until(lambda: Task.objects.filter(status=Status.RUNNING, worker_id=victim_id).exists(), timeout=60)
    assert live(Status.READY) > 100, "drained before the kill"
    victim.signal(signal.SIGKILL)
    killed_at = time.time()
    victim.wait(timeout=10)
    held = set(Task.objects.filter(status=Status.RUNNING, worker_id=victim_id).values_list("id", flat=True))
    assert held, "the victim held no task when killed"
    second = through(bouncer, "--concurrency", "2", options=options)  # the replacement
    wait_until(lambda: live() == 0, timeout=120, interval=0.2)

    statuses = dict(Task.objects.values_list("status").annotate(n=Count("id")))
    assert statuses == {Status.SUCCESSFUL: total}, statuses  # none stuck RUNNING, none lost
    assert Ledger.objects.values("key").distinct().count() == total  # every body ran
    lost = list(Attempt.objects.filter(outcome=Outcome.LOST).values_list("task_id", "worker_id", "finished_at"))
    assert {task_id for task_id, _w, _f in lost} == held and {w for _t, w, _f in lost} == {victim_id}
    rescue_s = sorted(f.timestamp() - killed_at for _t, _w, f in lost)
    print(
        f"\nkill through PgBouncer: {total} tasks, {len(held)} held by the victim, kill-to-rescue"
        f" median {statistics.median(rescue_s):.2f} s max {max(rescue_s):.2f} s (lease {lease} s)"
    )
    # By lease: the victim's last renewal was at most one heartbeat before the kill, so its
    # leases ran out between LEASE - HEARTBEAT and LEASE after it (0.2 s for the two clocks'
    # reads); the survivor's rescuer looks every RESCUE_INTERVAL, plus slack for a busy machine.
    # A lock-based rescue would come about LIVENESS_GRACE (1 s) after the kill.
    assert min(rescue_s) >= lease - heartbeat - 0.2, rescue_s
    assert max(rescue_s) <= lease + rescue_interval + 5.0, rescue_s
    assert set(Worker.objects.values_list("lock_key", flat=True)) == {0}
    assert worker_locks() == []
    for w in (survivor, second):
        w.signal(signal.SIGTERM)
    for w in (survivor, second):
        assert w.wait(timeout=30) == 0, w.output()


# ---------------------------------------------------------------- waking up: poll, or LISTEN elsewhere


def test_listen_database_wakes_a_pooled_worker_the_poll_would_not(pgbouncer, through):
    bouncer = pgbouncer(pool_size=2)
    slow_poll = {**POOLED, "POLL_INTERVAL": 30}  # far longer than the waits below
    worker = through(bouncer, options={**slow_poll, "LISTEN_DATABASE": "direct"}, OX_TEST_DIRECT_URL=database_url())
    wait_until(lambda: listening_sessions() == 1, timeout=30)
    latencies = []
    for i in range(3):
        time.sleep(0.3)  # idle again, asleep on its 30 s poll
        r = tasks.echo.enqueue(i)
        wait_until(lambda r=r: Task.objects.get(pk=r.id).status == Status.SUCCESSFUL, timeout=5, interval=0.01)
        row = Task.objects.get(pk=r.id)
        latencies.append((row.finished_at - row.enqueued_at).total_seconds())
    print(f"\nenqueue to done through PgBouncer, woken by LISTEN on the direct alias: {latencies}")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()

    # Without LISTEN_DATABASE a pooled worker does not LISTEN (it would be on a pooled session)
    # and finds the task at its next poll only: the wake-up above came from the listener.
    worker = through(bouncer, options=slow_poll)
    wait_until(lambda: Worker.objects.filter(pid=worker.pid).exists(), timeout=30)
    time.sleep(0.5)
    r = tasks.echo.enqueue("late")
    time.sleep(3)
    assert Task.objects.get(pk=r.id).status == Status.READY
    assert listening_sessions() == 0
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()


# ---------------------------------------------------------------- prepared statements


@pytest.fixture
def bouncer_alias(pgbouncer, monkeypatch) -> Callable[[dict[str, object]], str]:
    """make(OPTIONS): the alias "default", for connections opened from now on (not this test's
    own), through a pool of one server session with those OPTIONS. ("default" because a
    Django test may only open aliases it declared.)"""
    from django.db import connections

    bouncer = pgbouncer(pool_size=1)
    direct = connections.settings["default"]

    def make(options: dict[str, object]) -> str:
        routed = {**direct, "NAME": bouncer.dbname, "HOST": "127.0.0.1", "PORT": bouncer.port, "OPTIONS": options}
        monkeypatch.setitem(connections.settings, "default", routed)
        return "default"

    return make


def prepared_after_repeats(conn) -> int:
    with conn.cursor() as cursor:
        for i in range(10):  # psycopg prepares a query executed prepare_threshold times
            cursor.execute("SELECT %s::int + 1", [i])
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        return cursor.fetchone()[0]


def test_prepared_statements_through_pgbouncer_1_18_and_the_worker_connection(bouncer_alias):
    from ox.connection import open_worker_connection

    # Django's defaults (client-side binding, prepare_threshold None) prepare nothing.
    conn = open_worker_connection(bouncer_alias({}), pooled=True)
    try:
        assert prepared_after_repeats(conn) == 0
    finally:
        conn.close()
    # Server-side binding with a prepare_threshold: psycopg prepares, on whatever server
    # session the pooler lent it, and the next client on that session fails, here already in
    # Django's connection setup (its SET TIME ZONE is prepared too): PgBouncer 1.18 does not
    # track prepared statements. What ox.W005 warns of.
    # (Django's own connections here: a worker connection not told it is pooled turns
    # psycopg's automatic preparing off, tests/test_prepared_claim.py.)
    risky = {"server_side_binding": True, "prepare_threshold": 0}
    first = connections.create_connection(bouncer_alias(risky))
    try:
        assert prepared_after_repeats(first) > 0
        with pytest.raises(ProgrammingError, match=r'prepared statement "_pg3_0" already exists'):
            second = connections.create_connection(bouncer_alias(risky))
            try:
                prepared_after_repeats(second)
            finally:
                second.close()
    finally:
        first.close()
    # The worker's own connection, told it is pooled, prepares nothing whatever OPTIONS say.
    conn = open_worker_connection(bouncer_alias(risky), pooled=True)
    try:
        conn.connection.execute("DEALLOCATE ALL")  # what the two above left on the session
        assert prepared_after_repeats(conn) == 0
    finally:
        conn.close()


def test_an_undeclared_pooler_makes_enqueue_stop_preparing(bouncer_alias):
    # Producers told nothing of the pooler (no POOLER): each connection's first enqueue reads
    # the server's process id, which is not the one PgBouncer gave the connection, and that
    # connection prepares nothing from then on. Three clients through one server session: had
    # they prepared, psycopg's _pg3_0 of one would have been run by another.
    from ox import clock
    from ox.db.postgresql.prepared import UNPREPARED_ATTR
    from ox.enqueue import insert_or_find, new_task

    alias = bouncer_alias({})
    clients = [connections.create_connection(alias) for _ in range(3)]
    try:
        for conn in [*clients, clients[0], clients[1], clients[0], clients[2], clients[1]]:
            row = new_task(tasks.noop.get_backend(), tasks.noop, (), {}, clock.db_now(conn))
            assert insert_or_find(conn, row, True) is None
        assert [getattr(conn, UNPREPARED_ATTR, False) for conn in clients] == [True, True, True]
        with clients[0].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements")
            assert cursor.fetchone()[0] == 0
        assert Task.objects.filter(task_path="tests.tasks.noop").count() == 8
    finally:
        for conn in clients:
            conn.close()


# ---------------------------------------------------------------- session mode


def test_session_mode_keeps_the_liveness_lock_and_the_fast_rescue(pgbouncer, through):
    # In session mode a server session is the worker's until it disconnects; PgBouncer then
    # runs its server_reset_query (DISCARD ALL, the default), which drops the session's
    # advisory locks and LISTEN before anyone else gets it. So workers need no POOLER there,
    # and a dead worker is rescued by its lock, long before its lease (30 s) runs out.
    bouncer = pgbouncer(pool_mode="session", pool_size=8)
    rescue_interval, liveness_grace, heartbeat = 0.5, 1.0, 3.0
    options = {"RESCUE_INTERVAL": rescue_interval, "LIVENESS_GRACE": liveness_grace}
    r = tasks.record_then_sleep.enqueue("held", 6.0)  # still running when the survivor is up
    victim = through(bouncer, options=options)
    wait_until(lambda: Ledger.objects.filter(key="held").exists(), timeout=30)
    victim_row = Worker.objects.get(pid=victim.pid)
    assert victim_row.lock_key > 0 and victim_row.lock_key in [objid for _pid, objid in worker_locks()]
    survivor = through(bouncer, options=options)
    wait_until(lambda: listening_sessions() == 2, timeout=30)  # each worker's listener, its own session
    victim.signal(signal.SIGKILL)
    killed_at = time.time()
    victim.wait(timeout=10)
    wait_until(lambda: Attempt.objects.filter(task_id=r.id, outcome=Outcome.LOST).exists(), timeout=20)
    lost = Attempt.objects.get(task_id=r.id, outcome=Outcome.LOST)
    rescue_s = lost.finished_at.timestamp() - killed_at
    print(f"\nsession-mode PgBouncer: kill-to-rescue {rescue_s:.2f} s (lease 30 s)")
    assert lost.worker_id == victim_row.id
    # The lock-based path: found free at a rescue round, dead LIVENESS_GRACE later; a busy
    # machine may delay the survivor's loop by up to a heartbeat.
    assert rescue_s <= rescue_interval + liveness_grace + heartbeat, rescue_s
    wait_until(lambda: Task.objects.get(pk=r.id).status == Status.SUCCESSFUL, timeout=30)
    survivor.signal(signal.SIGTERM)
    assert survivor.wait(timeout=30) == 0, survivor.output()
