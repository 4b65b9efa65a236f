"""Adversarial review of the idle mark (ox.idle, migration 0012) and the vacuum duty (ox.vacuum).

Every test here runs on the real PostgreSQL server, most against real worker subprocesses.
A test that fails names a broken promise; the passing ones are attacks that held up."""

import signal
import threading
import time
import uuid

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

import ox
from ox.connection import open_worker_connection
from ox.idle import IdleMark
from ox.models import Status, Task, Worker
from ox.vacuum import Vacuumer, table_counts
from tests import gated_tasks, tasks
from tests.helpers import wait_until
from tests.test_notify_idle import options
from tests.test_vacuum import make_dead_rows
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)
pg = pytest.mark.skipif(connection.vendor != "postgresql", reason="LISTEN/NOTIFY and VACUUM are PostgreSQL's")


# ------------------------------------------------------------------ helpers
# listener: the LISTEN session fixture (tests/conftest.py); options: OX_TEST_OPTIONS for a worker.


def row_of(worker) -> Worker | None:
    return Worker.objects.filter(pid=worker.pid).order_by("-started_at").first()


def marked(worker) -> bool:
    row = row_of(worker)
    return bool(row and row.idle_since is not None)


def succeeded(result) -> bool:
    return Task.objects.filter(pk=result.id, status=Status.SUCCESSFUL).exists()


def worker_row(queues: list[str], idle: bool = True) -> Worker:
    now = timezone.now()
    return Worker.objects.create(
        id=f"attack-{uuid.uuid4()}",
        host="attack",
        pid=1,
        queues=queues,
        started_at=now,
        heartbeat_at=now,
        idle_since=now if idle else None,
    )


# ------------------------------------------------------------------ the idle mark: findings
@pg
def test_an_idle_worker_whose_poll_is_longer_than_its_heartbeat_keeps_its_mark(start_worker):
    """POLL_INTERVAL 10 s, HEARTBEAT 0.5 s: the idle worker claims (short) once per poll, so two
    heartbeats pass with no short claim and the heartbeat clears the mark of a worker that is
    idle with every slot free. An enqueue then notifies nobody and waits for the poll."""
    worker = start_worker(env=options(poll_interval=10, heartbeat=0.5, lease=5))
    wait_until(lambda: marked(worker), timeout=30)
    cleared_after = None
    t0 = time.monotonic()
    while time.monotonic() - t0 < 4:
        if not marked(worker):
            cleared_after = time.monotonic() - t0
            break
        time.sleep(0.05)
    started = time.monotonic()
    result = tasks.echo.enqueue("while idle")
    wait_until(lambda: succeeded(result), timeout=20)
    latency = time.monotonic() - started
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert cleared_after is None and latency < 2, (
        f"idle worker unmarked {cleared_after} s after marking; an enqueue then waited {latency:.1f} s"
    )


@pg
def test_a_worker_draining_a_backlog_of_long_sync_tasks_clears_its_mark(start_worker, listener):
    """Default POLL_INTERVAL (1 s) and HEARTBEAT (3 s). A backlog of 2.5 s sync tasks at
    concurrency 1 keeps the worker busy for ~20 s, and no async task exists. Yet its async
    probe (a claim for 0 sync and 100 async tasks, once per poll) comes back short every
    second, so the heartbeat never clears the mark, and every enqueue keeps notifying."""
    worker = start_worker("--concurrency", "1")
    wait_until(lambda: marked(worker), timeout=30)
    ox.enqueue_many(tasks.sleep_for, [((2.5,), {})] * 8)
    wait_until(lambda: Task.objects.filter(status=Status.RUNNING).exists(), timeout=20)
    cleared = False
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10 and Task.objects.filter(status=Status.READY).exists():
        if not marked(worker):
            cleared = True
            break
        time.sleep(0.1)
    backlog = Task.objects.filter(status=Status.READY).count()
    listener(0.05)
    tasks.echo.enqueue("more")
    notified = listener(0.3)
    worker.signal(signal.SIGTERM)
    worker.wait(60)
    assert cleared, (
        f"busy 10 s (>3 heartbeats) with {backlog} sync tasks still waiting, the worker is still marked;"
        f" an enqueue notified: {notified}"
    )


@pg
def test_a_sigkilled_idle_worker_does_not_keep_every_enqueue_notifying(start_worker, listener):
    """A worker killed (SIGKILL, OOM, a host lost) while idle leaves idle_since set and stopped_at
    NULL: nothing ever sets stopped_at for it (the rescuer only looks at workers holding RUNNING
    tasks) and the trigger does not look at heartbeat_at, so every enqueue of its queues
    notifies for ever, with no worker anywhere. Here it has been silent for ten minutes
    (heartbeat_at set back) and another worker's rescuer ran meanwhile."""
    worker = start_worker(env=options(heartbeat=0.3, lease=3))
    wait_until(lambda: marked(worker), timeout=30)
    worker.signal(signal.SIGKILL)
    worker.wait(10)
    # As if it died ten minutes ago: its last heartbeat is that old (its lock is long gone).
    Worker.objects.filter(pid=worker.pid).update(heartbeat_at=timezone.now() - timezone.timedelta(minutes=10))
    # Another worker (other queue) runs its rescuer meanwhile, several times.
    other = start_worker("--queues", "other", env=options(heartbeat=0.3, lease=3, rescue_interval=0.5))
    wait_until(lambda: row_of(other) is not None, timeout=30)
    time.sleep(5)
    listener(0.05)
    tasks.echo.enqueue("nobody waits")
    got = listener(0.5)
    dead = Worker.objects.get(pid=worker.pid)
    other.signal(signal.SIGTERM)
    assert other.wait(30) == 0
    assert got == [], (
        f"no live worker of 'default', yet the enqueue notified {got}; the dead worker's row: "
        f"idle_since={dead.idle_since} stopped_at={dead.stopped_at} heartbeat_at={dead.heartbeat_at}"
    )


@pg
def test_a_notified_worker_with_its_only_slot_busy_claims_when_the_slot_frees(start_worker, tmp_path, listener):
    """Concurrency 1, POLL_INTERVAL 5 s, still marked while it starts a long task. A task enqueued
    meanwhile notifies it; it cannot take it (sync slot full), claims for async tasks only and
    schedules its next claim a whole poll away, so when its slot frees the waiting task sits
    out the poll (the README: the loop wakes the moment a slot frees)."""
    gate = tmp_path / "gate"
    worker = start_worker("--concurrency", "1", env=options(poll_interval=5))
    wait_until(lambda: marked(worker), timeout=30)
    gated_tasks.hold.enqueue("held", str(gate))
    wait_until(lambda: Ledger.objects.filter(key="held").exists(), timeout=20)
    listener(0.05)
    waiting = tasks.echo.enqueue("next")
    notified = listener(0.3)
    time.sleep(0.5)
    gate.touch()
    opened = time.monotonic()
    wait_until(lambda: succeeded(waiting), timeout=20)
    delay = time.monotonic() - opened
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert delay < 2, f"notified {notified}; the waiting task ran {delay:.1f} s after the slot freed"


@pg
def test_a_heartbeat_that_fails_while_clearing_leaves_the_row_marked_for_good():
    """IdleMark.clear_at_heartbeat() forgets the mark before the heartbeat's UPDATE runs; if that
    UPDATE fails (the connection dropped), memory says unmarked and the row says marked, and no
    later heartbeat clears it while the worker stays busy: producers notify until it next idles.
    Driven through ox.leases.Leases.heartbeat, on a stand-in for the worker with every slot busy."""
    from types import SimpleNamespace

    from ox.flow.keeper import SlotKeeper
    from ox.flow.local import LocalLimits
    from ox.leases import Leases

    row = worker_row(["default"], idle=False)
    fake = SimpleNamespace(
        listener=object(),
        id=row.id,
        next_poll=0.0,
        more_waiting=True,  # busy: its claims get all they ask for
        claims=SimpleNamespace(limits=lambda probe=True: (0, 0)),  # every slot busy
        sync=object(),
        aio=object(),
        held={},
        completer=SimpleNamespace(pending=lambda: []),
        options=SimpleNamespace(lease=30.0),
        conn=open_worker_connection(connection.alias),
        # No slotted queue: the heartbeat's renewal of slots has nothing to do.
        slots=SlotKeeper(row.id, LocalLimits(), lambda preps: None, lambda preps: None),
    )
    fake.idle = IdleMark(fake)
    leases = Leases(fake)
    try:
        fake.idle.after_claim()  # a short claim: marked
        assert Worker.objects.get(pk=row.id).idle_since is not None
        leases.heartbeat()  # this heartbeat saw the short claim: kept
        # The heartbeat after it would clear; its connection drops first.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [fake.conn.connection.info.backend_pid])
        time.sleep(0.2)
        with pytest.raises(OperationalError):
            leases.heartbeat()
    finally:
        try:
            fake.conn.close()
        except Exception:  # noqa: BLE001, S110
            pass
    fake.conn = open_worker_connection(connection.alias)  # the worker reconnects, stays busy
    try:
        for _ in range(3):
            leases.heartbeat()
    finally:
        fake.conn.close()
    assert Worker.objects.get(pk=row.id).idle_since is None, "busy for 3 heartbeats, the row is still marked"


@pg
def test_a_worker_whose_listen_session_dropped_still_wakes_within_milliseconds(start_worker):
    """The LISTEN backend is terminated while the worker is marked; an enqueue right after (in the
    listener's reconnect back-off) is notified to nobody, and the worker does not look when its
    listener is back: the task waits for the poll (10 s here)."""
    worker = start_worker(env=options(poll_interval=10))
    wait_until(lambda: marked(worker), timeout=30)

    def listen_pid():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN ox_task'"
                " AND pid <> pg_backend_pid()"
            )
            row = cursor.fetchone()
            return row[0] if row else None

    pid = wait_until(listen_pid, timeout=30)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])  # waits until it is gone
    started = time.monotonic()
    result = tasks.echo.enqueue("in the gap")
    wait_until(lambda: succeeded(result), timeout=20)
    latency = time.monotonic() - started
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert latency < 2, f"enqueued while the listener reconnected: ran {latency:.1f} s later"


# ------------------------------------------------------------------ the idle mark: attacks that held
@pytest.mark.parametrize(
    "queue", ['it\'s "quoted"', "ünïcødé-キュー-😀", "q" * 64, "a,b", '["default"]', "default ", " "]
)
@pg
def test_the_trigger_matches_odd_queue_names_exactly(listener, queue):
    worker_row([queue, "x"])
    worker_row(["default"], idle=False)
    with connection.cursor() as cursor:
        variant = queue.strip() if queue.strip() not in ("", queue) else "y"
        for name in (queue, variant, "default"):
            cursor.execute(
                """INSERT INTO ox_task (id, task_path, queue, priority, status, args, kwargs, run_after,
                       enqueued_at, is_async, attempts, max_attempts, worker_id, fence, cancel_requested)
                   VALUES (gen_random_uuid(), 'tests.tasks.noop', %s, 0, 'READY', '[]', '{}', now(), now(),
                       false, 0, 1, '', 0, false)""",
                [name],
            )
    got = listener(0.3)
    assert got.count(queue) == 1 and "default" not in got
    if queue.strip() and queue.strip() != queue:
        assert queue.strip() not in got


@pg
def test_a_pooled_worker_without_a_listener_never_marks(start_worker):
    worker = start_worker(env=options(pooler="transaction", poll_interval=0.2, heartbeat=0.3, lease=3))
    wait_until(lambda: row_of(worker) is not None, timeout=30)
    result = tasks.echo.enqueue("polled")
    wait_until(lambda: succeeded(result), timeout=20)
    time.sleep(1.5)  # many short claims
    assert not marked(worker)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0


@pg
def test_a_batch_worker_leaves_no_live_mark(start_worker, listener):
    ox.enqueue_many(tasks.noop, [((), {})] * 50)
    worker = start_worker("--batch")
    assert worker.wait(60) == 0
    assert Worker.objects.get(pid=worker.pid).stopped_at is not None
    listener(0.05)
    tasks.echo.enqueue(1)
    assert listener(0.3) == []


@pg
def test_a_reconnected_worker_keeps_its_mark_and_wakes_at_once(start_worker):
    worker = start_worker(env=options(poll_interval=30))
    wait_until(lambda: marked(worker), timeout=30)
    wid = row_of(worker).id
    with connection.cursor() as cursor:  # the main session: the one holding the liveness lock
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND query <> 'LISTEN ox_task' AND backend_type = 'client backend'"
        )
        pids = [r[0] for r in cursor.fetchall()]
        for pid in pids:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    wait_until(lambda: "reconnected" in worker.output(), timeout=20)
    assert Worker.objects.get(pk=wid).idle_since is not None
    started = time.monotonic()
    result = tasks.echo.enqueue("after reconnect")
    wait_until(lambda: succeeded(result), timeout=40)
    assert time.monotonic() - started < 5
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0


# ------------------------------------------------------------------ the vacuum duty


@pytest.fixture
def nonowner_sessions():
    """New sessions of the test database run as a role that may read and write ox's tables but
    does not own them (ALTER DATABASE ... SET role: as if the workers connected as that role)."""
    role = f"ox_attack_{uuid.uuid4().hex[:8]}"
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role}")
        cursor.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
        cursor.execute(f"ALTER DATABASE {name} SET role = {role}")
    try:
        yield role
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {name} RESET role")
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])
            cursor.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
            cursor.execute(f"DROP ROLE {role}")


@pg
def test_a_vacuum_the_role_may_not_run_is_reported_and_not_retried_every_interval(nonowner_sessions, caplog):
    """Workers connecting as a role that does not own the tables: PostgreSQL 15 answers VACUUM with
    a WARNING (no error), the duty takes it for 'skipped, someone else holds the table', says
    nothing, and opens a new session to try again at every look, for ever."""
    import logging

    make_dead_rows()
    vacuumer = Vacuumer(connection.alias, interval=0.2, min_dead=5000)
    with caplog.at_level(logging.INFO, logger="ox.vacuum"):
        for _ in range(3):
            vacuumer.next_at = 0.0  # as if VACUUM_INTERVAL had passed
            vacuumer.run(connection)
            assert vacuumer.thread is not None
            vacuumer.thread.join(30)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    counts = next(c for c in table_counts(connection) if c.table == "ox_task")
    assert counts.dead >= 12_000  # nothing was vacuumed
    assert "vacuum duty failed" not in caplog.text, caplog.text  # it did connect and VACUUM
    assert vacuumer.wait > 0.2 or "owner" in caplog.text, (
        f"3 rounds of VACUUM the role may not run: nothing logged ({caplog.text!r}), next look in {vacuumer.wait} s"
    )


@pg
def test_stop_cancels_a_vacuum_that_starts_just_after_the_stop_check(monkeypatch):
    """stop() cancels whatever runs on the VACUUM session at that instant; a stop that lands
    between the thread's `stopped` check and its VACUUM statement cancels nothing, and the
    VACUUM (slow: cost delay) runs on past stop()'s join and the worker's exit."""
    import ox.vacuum as vacuum_module

    make_dead_rows(50_000)
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    real = vacuum_module.vacuum_table
    stop_done = threading.Event()
    holder: dict[str, Vacuumer] = {}

    def descheduled(conn, table):
        # The thread passed its `stopped` check; the stop arrives before its statement.
        threading.Thread(target=lambda: (holder["v"].stop(timeout=3), stop_done.set()), daemon=True).start()
        time.sleep(0.3)
        return real(conn, table)

    monkeypatch.setattr(vacuum_module, "vacuum_table", descheduled)
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER DATABASE {name} SET vacuum_cost_delay = 100")
        cursor.execute(f"ALTER DATABASE {name} SET vacuum_cost_limit = 1")
    try:
        vacuumer = holder["v"] = Vacuumer(connection.alias, interval=10, min_dead=1000)
        vacuumer.run(connection)
        assert stop_done.wait(15)
        still = vacuumer.busy
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {name} RESET vacuum_cost_delay")
            cursor.execute(f"ALTER DATABASE {name} RESET vacuum_cost_limit")
            # End the slow VACUUM this test may have left running.
            cursor.execute(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'VACUUM (SKIP%%' AND pid <> pg_backend_pid()"
            )
        if vacuumer.thread is not None:
            vacuumer.thread.join(10)
    assert not still, "stop() returned with the VACUUM still running"


@pg
def test_the_duty_looks_at_a_database_missing_a_table():
    """to_regclass() of a table that is not there is NULL: the look skips it (and the VACUUM of
    one that vanished after the look fails inside the thread, logged, the duty looks again)."""
    from django.db import transaction

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE ox_attempt RENAME TO ox_attempt_gone")
        names = {c.table for c in table_counts(connection)}
        assert "ox_attempt" not in names and "ox_attempt_gone" not in names and "ox_task" in names
        transaction.set_rollback(True)
    names = {c.table for c in table_counts(connection, ("ox_task", "ox_nothing_here"))}
    assert names == {"ox_task"}


@pg
def test_vacuum_thread_racing_worker_shutdown(start_worker):
    """A worker stopped while its duty VACUUMs (cost-delayed): it exits within the grace, its
    VACUUM session is gone soon after, and nothing is lost."""
    make_dead_rows(50_000)
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER DATABASE {name} SET vacuum_cost_delay = 100")
        cursor.execute(f"ALTER DATABASE {name} SET vacuum_cost_limit = 1")
    try:
        worker = start_worker(env=options(vacuum_interval=0.2, vacuum_min_dead=1000))

        def vacuuming():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND query LIKE 'VACUUM (SKIP%%' AND state = 'active' AND pid <> pg_backend_pid()"
                )
                return cursor.fetchone()[0] > 0

        wait_until(vacuuming, timeout=30)
        started = time.monotonic()
        worker.signal(signal.SIGTERM)
        assert worker.wait(30) == 0
        assert time.monotonic() - started < 10
        assert wait_until(lambda: not vacuuming(), timeout=10)
        assert "vacuum duty failed" not in worker.output()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {name} RESET vacuum_cost_delay")
            cursor.execute(f"ALTER DATABASE {name} RESET vacuum_cost_limit")


@pg
def test_a_migration_waiting_for_the_duty_s_vacuum_does_not_stall_enqueues():
    """Autovacuum cancels itself when it blocks another session's lock request (deadlock_timeout
    later); a manual VACUUM does not. A migration's ALTER TABLE ox_task queues behind the duty's
    VACUUM (SHARE UPDATE EXCLUSIVE), and every enqueue and claim (ROW EXCLUSIVE) queues behind
    the ALTER's ACCESS EXCLUSIVE request: the queue stops until the VACUUM ends. The docs say
    DDL waits 'as it would for autovacuum'; autovacuum would have let it through in ~1 s."""
    make_dead_rows(50_000)
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER DATABASE {name} SET vacuum_cost_delay = 100")
        cursor.execute(f"ALTER DATABASE {name} SET vacuum_cost_limit = 1")
    vacuumer = Vacuumer(connection.alias, interval=10, min_dead=1000)
    migration = open_worker_connection(connection.alias)
    producer = open_worker_connection(connection.alias)
    migrated: dict[str, object] = {}
    try:
        vacuumer.run(connection)

        def vacuuming():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND query LIKE 'VACUUM (SKIP%%' AND state = 'active' AND pid <> pg_backend_pid()"
                )
                return cursor.fetchone()[0] > 0

        wait_until(vacuuming, timeout=10)

        def migrate():
            started = time.monotonic()
            raw = migration.connection  # psycopg's own: usable from this thread
            try:
                raw.execute("SET lock_timeout = '8s'")
                raw.execute("BEGIN")
                raw.execute("ALTER TABLE ox_task ADD COLUMN attack_col integer")
                migrated["result"] = "ran"
            except Exception as exc:  # noqa: BLE001
                migrated["result"] = repr(exc)
            finally:
                raw.execute("ROLLBACK")
            migrated["seconds"] = round(time.monotonic() - started, 1)

        thread = threading.Thread(target=migrate, daemon=True)
        thread.start()
        time.sleep(1.5)  # the ALTER is queued behind the VACUUM by now
        took: dict[str, float] = {}

        def enqueue():
            started = time.monotonic()
            producer.connection.execute(
                """INSERT INTO ox_task (id, task_path, queue, priority, status, args, kwargs, run_after,
                       enqueued_at, is_async, attempts, max_attempts, worker_id, fence, cancel_requested)
                   VALUES (gen_random_uuid(), 'tests.tasks.noop', 'default', 0, 'READY', '[]', '{}', now(),
                       now(), false, 0, 1, '', 0, false)"""
            )
            took["enqueue"] = time.monotonic() - started

        producing = threading.Thread(target=enqueue, daemon=True)
        producing.start()
        # Meanwhile the worker loop calls the duty as it does (every second), as a fix may use it.
        deadline = time.monotonic() + 20
        while producing.is_alive() and time.monotonic() < deadline:
            vacuumer.run(connection)
            producing.join(0.5)
        enqueue_took = took.get("enqueue", 99.0)
        thread.join(20)
    finally:
        vacuumer.stop(timeout=10)
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {name} RESET vacuum_cost_delay")
            cursor.execute(f"ALTER DATABASE {name} RESET vacuum_cost_limit")
        migration.close()
        producer.close()
    assert enqueue_took < 2, (
        f"an enqueue waited {enqueue_took:.1f} s behind a migration queued behind the duty's VACUUM"
        f" (the migration: {migrated})"
    )


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite: run with DATABASE_URL=sqlite:///...")
def test_a_sqlite_worker_never_marks_and_logs_no_error(start_worker):
    worker = start_worker(env=options(poll_interval=0.2, heartbeat=0.3, lease=3))
    results = [tasks.echo.enqueue(i) for i in range(20)]
    wait_until(lambda: all(succeeded(r) for r in results), timeout=60)
    time.sleep(1.5)  # idle: short claims, heartbeats
    assert Worker.objects.filter(idle_since__isnull=False).count() == 0
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    out = worker.output()
    assert "ERROR" not in out and "failed" not in out and "vacuum" not in out, out


@pg
def test_a_repeatable_read_producer_wakes_a_worker_that_marked_itself_before_the_insert(
    start_worker, tmp_path, listener
):
    """The trigger's look at ox_worker reads the producer's snapshot. Under REPEATABLE READ (or
    SERIALIZABLE) that is the transaction's first statement, not the INSERT: a transaction that
    began while the worker was busy, and enqueues and commits after the worker has been marked
    and waiting for a while, sends nothing, and the task waits for the poll (5 s here). The
    documented exception is an INSERT that ran while the worker was unmarked; this one ran
    while it was marked."""
    gate = tmp_path / "gate"
    worker = start_worker("--concurrency", "1", env=options(poll_interval=5, heartbeat=0.3, lease=3))
    wait_until(lambda: marked(worker), timeout=30)
    gated_tasks.hold.enqueue("held", str(gate))
    wait_until(lambda: not marked(worker), timeout=15)  # busy through heartbeats: cleared
    checker = open_worker_connection(connection.alias)

    def marked_now() -> bool:
        with checker.cursor() as cursor:
            cursor.execute(
                "SELECT idle_since IS NOT NULL FROM ox_worker WHERE pid = %s AND stopped_at IS NULL", [worker.pid]
            )
            row = cursor.fetchone()
            return bool(row and row[0])

    from django.db import transaction

    try:
        listener(0.05)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                cursor.execute("SELECT count(*) FROM ox_task")  # the snapshot
            gate.touch()  # the worker finishes "held", finds nothing, marks itself
            wait_until(marked_now, timeout=10)
            time.sleep(0.5)  # marked and waiting, well past its look after the mark
            result = tasks.echo.enqueue("rr")  # the INSERT runs now, with the worker marked
        committed = time.monotonic()
        notified = listener(0.2)
        wait_until(lambda: succeeded(result), timeout=20)
        latency = time.monotonic() - committed
    finally:
        checker.close()
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert latency < 2, f"notified {notified}; the enqueue ran {latency:.1f} s after its commit"


@pg
def test_a_round_skipped_behind_another_worker_s_vacuum_keeps_the_back_off_and_its_one_warning(caplog):
    """Several workers take turns on a table by its lock (SKIP_LOCKED). While an old snapshot
    keeps rows dead, a worker backs off and warns once; when its next VACUUM is skipped because
    another worker's holds the table, _pace([]) reads 'all kept up' (all() of nothing), resets
    the pace and the warning, and the round after warns again."""
    import logging

    snapshot = open_worker_connection(connection.alias)
    other = open_worker_connection(connection.alias)
    try:
        with snapshot.cursor() as cursor:
            cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("SELECT count(*) FROM ox_worker")
        make_dead_rows()
        vacuumer = Vacuumer(connection.alias, interval=10, min_dead=5000)
        with caplog.at_level(logging.WARNING, logger="ox.vacuum"):
            vacuumer.run(connection)
            vacuumer.thread.join(60)
            assert vacuumer.wait == 20 and vacuumer.warned
            # Another worker's VACUUM holds ox_task during this worker's next look.
            with other.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute("LOCK TABLE ox_task IN SHARE UPDATE EXCLUSIVE MODE")
            vacuumer.next_at = 0.0
            vacuumer.run(connection)
            vacuumer.thread.join(60)
            with other.cursor() as cursor:
                cursor.execute("ROLLBACK")
            after_skip = vacuumer.wait
            vacuumer.next_at = 0.0
            vacuumer.run(connection)
            vacuumer.thread.join(60)
        warnings = caplog.text.count("could not remove the dead rows")
        with snapshot.cursor() as cursor:
            cursor.execute("ROLLBACK")
    finally:
        snapshot.close()
        other.close()
    assert after_skip >= 20 and warnings == 1, (
        f"after a skipped round the pace went back to {after_skip} s; warnings logged: {warnings}"
    )


@pg
def test_a_killed_worker_leaves_no_vacuum_running_on_the_server(start_worker):
    """A worker that dies mid-VACUUM (SIGKILL, a second SIGTERM's os._exit, an OOM kill) cannot
    cancel it; the server notices a vanished client only when it next writes to it, so the
    VACUUM runs to its end, holding SHARE UPDATE EXCLUSIVE: the migration of the deploy that
    stopped the worker waits for it (and, queued, stalls enqueues: see the test above).
    `client_connection_check_interval` (PostgreSQL 14+) on the duty's session would end it."""
    make_dead_rows(50_000)
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER DATABASE {name} SET vacuum_cost_delay = 100")
        cursor.execute(f"ALTER DATABASE {name} SET vacuum_cost_limit = 1")

    def vacuuming():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'VACUUM (SKIP%%' AND state = 'active' AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0] > 0

    try:
        worker = start_worker(env=options(vacuum_interval=0.2, vacuum_min_dead=1000))
        wait_until(vacuuming, timeout=30)
        worker.signal(signal.SIGKILL)
        worker.wait(10)
        time.sleep(3)
        orphaned = vacuuming()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {name} RESET vacuum_cost_delay")
            cursor.execute(f"ALTER DATABASE {name} RESET vacuum_cost_limit")
            cursor.execute(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE 'VACUUM (SKIP%%' AND pid <> pg_backend_pid()"
            )
    assert not orphaned, "3 s after its worker was killed, the duty's VACUUM still runs on the server"


@pg
def test_the_mark_costs_no_write_per_task(start_worker):
    """A worker draining 20,000 short tasks, then idle, then a trickle of 200 tasks 20 ms apart
    (marked throughout, each notified): the UPDATEs of ox_worker stay at the heartbeats plus a
    mark per idle spell, never one per task."""

    def worker_updates() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute("SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'ox_worker'")
            return cursor.fetchone()[0]

    worker = start_worker("--concurrency", "1", env=options(heartbeat=1.0, lease=5))
    wait_until(lambda: marked(worker), timeout=30)
    before, started = worker_updates(), time.monotonic()
    ox.enqueue_many(tasks.noop, [((), {})] * 20_000)
    wait_until(lambda: not Task.objects.filter(status__in=[Status.READY, Status.RUNNING]).exists(), timeout=180)
    wait_until(lambda: marked(worker), timeout=10)
    trickle = []
    for i in range(200):
        trickle.append(tasks.echo.enqueue(i))
        time.sleep(0.02)
    wait_until(lambda: all(succeeded(r) for r in trickle[-5:]), timeout=30)
    seconds = time.monotonic() - started
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    time.sleep(1.5)  # the worker's backend flushed its statistics as it closed
    updates = worker_updates() - before
    # Heartbeats come every second, and sooner after task starts (START_MARK_DELAY); a mark at
    # most once per clear, a clear only with a heartbeat: O(heartbeats), never O(tasks).
    assert updates <= 3 * seconds + 12, f"{updates} UPDATEs of ox_worker in {seconds:.0f} s for 20,200 tasks"


@pg
def test_one_worker_cleared_and_one_marked_on_a_queue_the_marked_one_wakes(start_worker, tmp_path):
    gate = tmp_path / "gate"
    env = options(poll_interval=30, heartbeat=0.3, lease=3)
    busy = start_worker("--concurrency", "1", env=env)
    wait_until(lambda: marked(busy), timeout=30)
    gated_tasks.hold.enqueue("held", str(gate))
    wait_until(lambda: not marked(busy), timeout=15)
    idle = start_worker("--concurrency", "1", env=env)
    wait_until(lambda: marked(idle), timeout=30)
    try:
        started = time.monotonic()
        result = tasks.echo.enqueue("for the idle one")
        wait_until(lambda: succeeded(result), timeout=20)
        assert time.monotonic() - started < 3
        assert Task.objects.get(pk=result.id).worker_id == row_of(idle).id
    finally:
        gate.touch()
    for w in (busy, idle):
        w.signal(signal.SIGTERM)
    for w in (busy, idle):
        assert w.wait(30) == 0


def test_vacuum_min_dead_zero_does_not_vacuum_tables_with_nothing_dead():
    """VACUUM_MIN_DEAD = 0 is accepted (ox.conf: an integer >= 0); then an empty or clean table
    (0 dead, 0 live) is 'due' at every look: a session opened and four VACUUMs every interval."""
    from ox.vacuum import TableCounts

    assert not TableCounts("ox_worker", live=0, dead=0, vacuums=0).due(0)
