"""Adversarial tests of the MariaDB driver (ox.db.mysql): InnoDB's transaction semantics
(statement vs transaction rollback, deadlocks between concurrent unique inserts), the JSON_TABLE
payloads of completions, fencing, liveness via named locks, READ COMMITTED worker sessions,
and MariaDB's PAD SPACE binary collation. MariaDB only."""

import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections

from ox import clock, sql
from ox.connection import open_worker_connection
from ox.db import driver
from ox.db.rows import NewTask
from ox.flow import gate
from ox.ids import uuid7
from ox.models import Attempt, Status, Task, Worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB only"),
]


def _row(key: str | None = None, limit_key: str | None = None, queue: str = "default") -> NewTask:
    now = clock.db_now(connection)
    return NewTask(
        id=uuid7(),
        task_path="tests.tasks.echo",
        queue=queue,
        priority=0,
        args=[1],
        kwargs={},
        run_after=now,
        enqueued_at=now,
        max_attempts=3,
        unique_key=key,
        unique_states=0,
        limit_key=limit_key,
    )


def _claim(conn, n: int = 1, worker: str = "attack-w") -> list[sql.Claimed]:
    now = clock.db_now(conn)
    return sql.claim(conn, worker, ["default"], (n, 0), now, now + timedelta(seconds=60))


def _enqueue_and_claim(n: int = 1, worker: str = "attack-w") -> list[sql.Claimed]:
    sql.insert_tasks(connection, [_row() for _ in range(n)])
    return _claim(connection, n, worker)


def _raw(task_id: uuid.UUID, column: str):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM ox_task WHERE id = %s", [task_id.hex])
        return cursor.fetchone()[0]


# ---------------------------------------------------------------------------- unique keys


def test_concurrent_unique_inserts_after_the_holder_rolls_back_neither_raise():
    """Promise (ox.sql.insert_unique): a duplicate neither raises nor aborts the caller's
    transaction; a concurrent insert of the same key waits for the first to commit or roll
    back, so exactly one of them inserts. On InnoDB two inserts waiting on a third that rolls
    back both take a shared lock on the key and then both want it exclusively: one is chosen
    as a deadlock victim (1213), its whole transaction rolled back."""
    key = "k" * 64
    holder = connections.create_connection("default")
    rows = [_row(key) for _ in range(3)]
    results: list[object] = []
    try:
        holder.ensure_connection()
        with holder.cursor() as c:
            c.execute("START TRANSACTION")
        assert sql.insert_unique(holder, _row(key))

        def enqueue(row):
            conn = connections.create_connection("default")
            try:
                results.append(sql.insert_unique(conn, row))
            except Exception as exc:  # noqa: BLE001
                results.append(exc)
            finally:
                conn.close()

        threads = [threading.Thread(target=enqueue, args=(r,)) for r in rows]
        for t in threads:
            t.start()
        time.sleep(1.0)  # all three wait on the holder's uncommitted key
        with holder.cursor() as c:
            c.execute("ROLLBACK")
        for t in threads:
            t.join(30)
    finally:
        holder.close()
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, f"an enqueue of a duplicate key raised: {errors!r}"
    assert sorted(results) == [False, False, True]
    assert Task.objects.filter(unique_key=key).count() == 1


def test_a_unique_insert_in_the_callers_own_transaction_is_not_run_again_when_its_victim():
    """Promise (ox.sql.insert_unique): a deadlock victim is run again only where it lost just
    its statement (autocommit). A caller that turned autocommit off has a transaction of its
    own open (no atomic()): InnoDB rolled all of it back, the caller's earlier writes too, so
    the error is raised for the caller to see. Run again instead, the insert answered as if
    nothing had happened and the caller committed a transaction missing what it wrote first."""
    from tests.testapp.models import Ledger

    def deadlocks() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
            return int(cursor.fetchone()[1])

    before = deadlocks()
    raised: list[BaseException] = []
    answered = 0
    for round_ in range(6):
        key = f"own-{round_}"
        holder = connections.create_connection("default")
        outcomes: list[object] = []
        try:
            holder.ensure_connection()
            with holder.cursor() as c:
                c.execute("START TRANSACTION")
            assert sql.insert_unique(holder, _row(key))

            def enqueue(i: int, key: str = key, outcomes: list = outcomes) -> None:
                conn = connections.create_connection("default")
                try:
                    conn.set_autocommit(False)
                    with conn.cursor() as c:  # the caller's own write, before the enqueue
                        c.execute("INSERT INTO testapp_ledger (`key`, pid, attempt) VALUES (%s, 0, 0)", [f"{key}-{i}"])
                    try:
                        outcomes.append(sql.insert_unique(conn, _row(key)))
                    except Exception as exc:  # noqa: BLE001  (read below)
                        outcomes.append(exc)
                        conn.rollback()
                        return
                    conn.commit()
                finally:
                    conn.close()

            threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(3)]
            for t in threads:
                t.start()
            time.sleep(1.0)  # all three wait on the holder's uncommitted key
            with holder.cursor() as c:
                c.execute("ROLLBACK")
            for t in threads:
                t.join(30)
        finally:
            holder.close()
        errors = [o for o in outcomes if isinstance(o, Exception)]
        raised += errors
        answered += len(outcomes) - len(errors)
        # Each caller that got an answer committed its own write with it: none lost.
        assert Ledger.objects.filter(key__startswith=f"{key}-").count() == len(outcomes) - len(errors), outcomes
        assert all(driver(connection).deadlocked(e) for e in errors), errors
    assert deadlocks() > before, "InnoDB saw no deadlock: the test made none"
    assert raised and answered


def test_concurrent_unique_enqueues_while_the_holder_completes_neither_raise():
    """Promise (ox.sql.insert_unique): a concurrent insert of a held key waits for the holder
    and then exactly one insert goes in, none raising. Here the holder is a RUNNING unique
    task whose completion (status SUCCESSFUL: unique_held becomes NULL, its index entry
    deleted) is in flight while twelve producers enqueue the same key: on InnoDB the waiters
    all take a shared lock on the deleted entry, then deadlock inserting (1213). A victim
    that ran again at once met the others again, ten times in a row on a busy machine (CI,
    four producers); with twelve that happened here one run in two before the random pause
    between tries (ox.db.dialect.after_deadlock)."""
    errors: list[object] = []
    for round_ in range(10):
        key = f"{round_}" * 64
        assert sql.insert_unique(connection, _row(key, queue=f"q{round_}"))
        now = clock.db_now(connection)
        (c,) = sql.claim(connection, "w", [f"q{round_}"], (1, 0), now, now + timedelta(seconds=60))
        completer = connections.create_connection("default")
        rows = [_row(key) for _ in range(12)]
        results: list[object] = []
        try:
            completer.ensure_connection()
            now = clock.db_now(connection)
            with sql.transaction(completer):
                assert sql.complete(completer, [sql.Completion(c.id, c.fence, "1", now, now)]) == {(c.id, c.fence)}

                def enqueue(row, results=results):
                    conn = connections.create_connection("default")
                    try:
                        results.append(sql.insert_unique(conn, row))
                    except Exception as exc:  # noqa: BLE001
                        results.append(exc)
                    finally:
                        conn.close()

                threads = [threading.Thread(target=enqueue, args=(r,)) for r in rows]
                for t in threads:
                    t.start()
                time.sleep(0.5)  # they wait on the completion's lock of the key
            for t in threads:
                t.join(30)
        finally:
            completer.close()
        errors += [r for r in results if isinstance(r, Exception)]
        if not errors:
            assert sorted(results) == [False] * 11 + [True]
    assert not errors, f"enqueues of a released key raised: {errors!r}"


def test_unique_enqueue_through_the_task_api_never_raises_while_the_holder_completes():
    """Promise: enqueueing a unique task whose key another task holds returns that task's
    result (or enqueues it, once the holder has released the key); it does not fail. Through
    the public API (Task.enqueue), several producers enqueueing a key while its holder's
    completion commits get InnoDB deadlock errors raised out of enqueue()."""
    from tests import flow_tasks

    errors: list[object] = []
    for round_ in range(5):
        customer = f"acme-{round_}"
        holder = flow_tasks.unique_customer.enqueue(customer)
        now = clock.db_now(connection)
        (c,) = driver(connection).set_running(connection, "w", [uuid.UUID(holder.id).hex], now + timedelta(seconds=60))
        completer = connections.create_connection("default")
        results: list[object] = []

        def enqueue(results=results, customer=customer):
            try:
                results.append(flow_tasks.unique_customer.enqueue(customer).id)
            except Exception as exc:  # noqa: BLE001
                results.append(exc)
            finally:
                connections.close_all()

        try:
            completer.ensure_connection()
            with sql.transaction(completer):
                sql.complete(completer, [sql.Completion(c.id, c.fence, '"done"', now, now)])
                threads = [threading.Thread(target=enqueue) for _ in range(3)]
                for t in threads:
                    t.start()
                time.sleep(0.5)
            for t in threads:
                t.join(30)
        finally:
            completer.close()
        errors += [r for r in results if isinstance(r, Exception)]
    assert not errors, f"enqueue() raised: {errors!r}"


def test_unique_enqueue_many_never_raises_while_the_holder_completes():
    """Promise: the batch form (ox.enqueue_many of a unique task, one transaction of ox's)
    does not fail either: a batch whose transaction InnoDB rolled back as a deadlock victim
    is run again whole (ox.enqueue._enqueue_unique), and every key ends with one holder."""
    import ox
    from tests import flow_tasks

    errors: list[object] = []
    for round_ in range(5):
        customers = [f"bulk-{round_}-{i}" for i in range(3)]
        holders = [flow_tasks.unique_customer.enqueue(c) for c in customers]
        now = clock.db_now(connection)
        claimed = driver(connection).set_running(
            connection, "w", [uuid.UUID(h.id).hex for h in holders], now + timedelta(seconds=60)
        )
        completer = connections.create_connection("default")
        results: list[object] = []

        def enqueue_batch(results=results, customers=customers):
            try:
                results.append(len(ox.enqueue_many(flow_tasks.unique_customer, [((c,), {}) for c in customers])))
            except Exception as exc:  # noqa: BLE001
                results.append(exc)
            finally:
                connections.close_all()

        try:
            completer.ensure_connection()
            with sql.transaction(completer):
                sql.complete(completer, [sql.Completion(c.id, c.fence, '"done"', now, now) for c in claimed])
                threads = [threading.Thread(target=enqueue_batch) for _ in range(3)]
                for t in threads:
                    t.start()
                time.sleep(0.5)
            for t in threads:
                t.join(30)
        finally:
            completer.close()
        errors += [r for r in results if isinstance(r, Exception)]
        for c in customers:  # the finished holder released the key: one new task holds it
            assert Task.objects.filter(status=Status.READY, kwargs__isnull=False, args=[c]).count() == 1
    assert not errors, f"enqueue_many() raised: {errors!r}"


def test_a_refused_duplicate_inside_atomic_keeps_the_callers_earlier_writes():
    """Promise: a duplicate unique enqueue inside the caller's atomic() fails that statement
    only (InnoDB rolls back the statement), the caller's transaction and its earlier writes
    go on and commit."""
    from django.db import transaction

    key = "d" * 64
    assert sql.insert_unique(connection, _row(key))
    plain = _row()
    with transaction.atomic():
        sql.insert_tasks(connection, [plain])
        assert sql.insert_unique(connection, _row(key)) is False
        after = _row()
        sql.insert_tasks(connection, [after])
    assert Task.objects.filter(pk__in=[plain.id, after.id]).count() == 2
    assert Task.objects.filter(unique_key=key).count() == 1


# ---------------------------------------------------------------------------- collation


def test_limit_keys_that_differ_by_trailing_spaces_are_counted_apart():
    """Promise: key limits hold per limit key, keys compared as on PostgreSQL (binary).
    utf8mb4_bin is a PAD SPACE collation on MariaDB: 'acct' = 'acct ', so GROUP BY merges
    the two keys' RUNNING counts under one name and the other key reads as running nothing
    (the gate would then start more of it than its key limit)."""
    a, b = _row(limit_key="acct"), _row(limit_key="acct ")
    sql.insert_tasks(connection, [a, b])
    assert len(_claim(connection, 2)) == 2
    _per_queue, per_key = gate._running(connection, ["default"])
    assert per_key[("default", "acct")] == 1
    assert per_key[("default", "acct ")] == 1


def test_key_concurrency_holds_for_keys_that_differ_by_trailing_spaces():
    """Promise: concurrency/key limits hold under concurrent workers: with key_concurrency 1,
    at most one task of each limit key runs. Keys 'acct' and 'acct ' are two keys (as on
    PostgreSQL); MariaDB's PAD SPACE comparison merges their RUNNING counts under one name,
    so the second claim sees the other key free and starts a second task of it."""
    from collections import Counter

    from ox.flow.limits import QueueLimits

    sql.insert_tasks(connection, [_row(limit_key=k) for k in ("acct", "acct ", "acct", "acct ")])
    limits = {"default": QueueLimits(key_concurrency=1)}
    for worker in ("gw1", "gw2"):
        now = clock.db_now(connection)
        gate.claim_limited(connection, worker, limits, (4, 0), now, now + timedelta(seconds=60))
    running = Counter(Task.objects.filter(status=Status.RUNNING).values_list("limit_key", flat=True))
    assert running == Counter({"acct": 1, "acct ": 1})


@pytest.mark.parametrize("other", ["DEFAULT", "Default", "défault", "default "])
def test_queue_names_compare_binary_in_the_claims_walk(other):
    """Promise: queue names compare as on PostgreSQL (binary): a worker of queue 'DEFAULT'
    never claims, nor waits for, tasks of queue 'default'. The walk's seeds are
    CAST(%s AS CHAR), whose collation is the connection's (utf8mb4_general_ci by default).
    'default ' (a trailing space) fails: utf8mb4_bin is PAD SPACE on MariaDB."""
    sql.insert_tasks(connection, [_row()])
    now = clock.db_now(connection)
    assert sql.claim(connection, "w", [other], (1, 1), now, now + timedelta(seconds=60)) == []
    assert sql.earliest_ready(connection, [other]) is None
    assert driver(connection).levels(connection, [other]) == {}


def test_limit_key_with_trailing_space_is_stored_as_given():
    """Promise: what is enqueued is stored as given (a limit key with a trailing space reads
    back with it; a PAD SPACE comparison finds both keys' tasks by either name)."""
    a, b = _row(limit_key="acct"), _row(limit_key="acct ")
    sql.insert_tasks(connection, [a, b])
    assert Task.objects.get(pk=b.id).limit_key == "acct "
    assert Task.objects.filter(limit_key="acct").count() == 1


# ---------------------------------------------------------------------------- completion payloads


@pytest.mark.parametrize(
    "value",
    [
        "😀 emoji 𝄞 and CJK 漢字",
        'quote " backslash \\ newline \n tab \t',
        "\u0001\u001f control",
        "\\u0000 literally, and \\ud83d literally",
        "x" * 70000,
    ],
)
def test_return_values_round_trip_through_the_completion_payload(value):
    """Promise: utf8mb4 everywhere; a task's return value is stored exactly as the worker
    serialised it (the completion carries it inside a JSON document read with JSON_TABLE:
    its escapes must come back as the same text)."""
    (c,) = _enqueue_and_claim()
    now = clock.db_now(connection)
    rv = json.dumps({"v": value})
    assert sql.complete(connection, [sql.Completion(c.id, c.fence, rv, now, now)]) == {(c.id, c.fence)}
    stored = _raw(c.id, "return_value")
    assert json.loads(stored) == {"v": value}


def test_completion_keeps_microseconds_and_utc():
    """Promise: datetimes are UTC with microseconds, through the JSON_TABLE payloads of
    complete and renew as through the ORM."""
    (c,) = _enqueue_and_claim()
    started = datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
    finished = datetime(2026, 3, 4, 5, 6, 8, 1, tzinfo=UTC)
    sql.renew(connection, [(c.id, c.fence, started)], finished + timedelta(seconds=60))
    sql.complete(connection, [sql.Completion(c.id, c.fence, "null", started, finished)])
    t = Task.objects.get(pk=c.id)
    assert t.started_at == started
    assert t.finished_at == finished
    assert t.last_attempted_at == started


def test_completion_with_a_non_utc_session_time_zone_still_writes_utc():
    """Promise: datetimes are UTC whatever the server's or session's time zone (DATETIME
    columns carry no zone; ox passes naive UTC, and the clock is UTC_TIMESTAMP)."""
    with connection.cursor() as cursor:
        cursor.execute("SET time_zone = '+05:00'")
    try:
        (c,) = _enqueue_and_claim()
        now = clock.db_now(connection)
        sql.complete(connection, [sql.Completion(c.id, c.fence, "1", now, now)])
        t = Task.objects.get(pk=c.id)
        assert abs((t.finished_at - datetime.now(UTC)).total_seconds()) < 120
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET time_zone = SYSTEM")


# ---------------------------------------------------------------------------- fencing


def test_a_stale_fence_writes_nothing_anywhere():
    """Promise: a stale worker's (old fence) completion, renewal, failure and hand-back
    write nothing once the task was rescued and claimed again."""
    (old,) = _enqueue_and_claim(worker="stale")
    now = clock.db_now(connection)
    # rescued: its lease expired
    Task.objects.filter(pk=old.id).update(lease_expires_at=now - timedelta(seconds=5))
    assert [r[0] for r in sql.rescue(connection, now)] == [old.id]
    (new,) = _claim(connection, worker="fresh")
    assert new.fence > old.fence
    before = Task.objects.values().get(pk=old.id)
    assert sql.complete(connection, [sql.Completion(old.id, old.fence, "1", now, now)]) == set()
    assert sql.renew(connection, [(old.id, old.fence, now)], now + timedelta(hours=1)) == {}
    failure = sql.Failure(old.id, old.fence, 1, "stale", now, now, "error", "x.Y", "tb", None)
    assert sql.fail(connection, failure) is None
    assert sql.hand_back(connection, [(old.id, old.fence)], now) == 0
    assert Task.objects.values().get(pk=old.id) == before
    assert not Attempt.objects.filter(task_id=old.id, worker_id="stale", outcome="error").exists()


def test_hand_back_counts_rows_written_not_rows_matched():
    """Promise: hand_back returns how many claims it gave back (CLIENT_FOUND_ROWS counts
    matched rows: a row matched but unchanged must not count, a row handed back twice counts
    once)."""
    a, b = _enqueue_and_claim(2)
    now = clock.db_now(connection)
    assert sql.hand_back(connection, [(a.id, a.fence), (a.id, a.fence), (b.id, b.fence + 5)], now) == 1
    assert Task.objects.get(pk=a.id).status == Status.READY
    assert Task.objects.get(pk=b.id).status == Status.RUNNING


# ---------------------------------------------------------------------------- sessions and liveness


def test_worker_connections_and_ox_transactions_are_read_committed():
    """Promise: every worker connection is READ COMMITTED (the gate and the slots count what
    others committed after taking their lock; no gap locks between claim, complete and rescue),
    and an ox transaction on it stays so."""
    conn = open_worker_connection("default")
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT @@session.tx_isolation")
            assert cursor.fetchone()[0] == "READ-COMMITTED"
        with sql.transaction(conn) as cursor:
            cursor.execute("SELECT @@session.tx_isolation")
            assert cursor.fetchone()[0] == "READ-COMMITTED"
    finally:
        conn.close()


def test_a_repeatable_read_session_sees_a_commit_made_after_its_snapshot_in_the_gate():
    """Promise: the gate counts what runs after its lock, whatever the session's isolation
    (begin_read_committed): a REPEATABLE READ session that read ox_task before must still
    count a task another session set RUNNING since."""
    conn = connections.create_connection("default")
    other = connections.create_connection("default")
    try:
        conn.ensure_connection()
        with conn.cursor() as c:
            c.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        sql.insert_tasks(connection, [_row()])
        with driver(conn).transaction(conn, read_committed=True):
            assert gate._running(conn, ["default"])[0]["default"] == 0
            assert len(_claim(other, 1)) == 1  # committed by another session meanwhile
            assert gate._running(conn, ["default"])[0]["default"] == 1
    finally:
        conn.close()
        other.close()


def test_a_live_workers_tasks_are_not_rescued_and_a_dead_ones_are():
    """Promise: a worker's death is noticed through its named lock (free the moment its
    session ends) and its tasks rescued; a live worker's never are, however often the rescue
    runs."""
    worker_conn = open_worker_connection("default")
    lock_key = 123456789
    now = clock.db_now(connection)
    try:
        sql.hold_worker_lock(worker_conn, lock_key)
        sql.register_worker(worker_conn, sql.WorkerRow("live-w", "h", 1, ["default"], 1, lock_key, now))
        sql.insert_tasks(connection, [_row()])
        (c,) = _claim(worker_conn, 1, worker="live-w")
        for _ in range(3):
            lost, marked = sql.rescue_and_mark(connection, clock.db_now(connection), liveness_grace=0.0)
            assert lost == [] and marked == []
    finally:
        worker_conn.close()
    # The session is gone: marked first, then rescued once the grace has passed.
    from tests.helpers import wait_until

    wait_until(lambda: sql.rescue_and_mark(connection, clock.db_now(connection), liveness_grace=0.0)[1], 10)
    time.sleep(0.05)
    lost = sql.rescue(connection, clock.db_now(connection), liveness_grace=0.0)
    assert [r[0] for r in lost] == [c.id]
    assert Task.objects.get(pk=c.id).status == Status.READY


def test_named_lock_names_fit_for_a_long_database_name():
    """Promise: a worker's named lock carries its database (two databases' workers never
    share a lock) and fits MariaDB's 64 characters whatever the database name and lock key."""
    from ox.db.mysql.locks import lock_name

    class Fake:
        def __init__(self, name):
            self.settings_dict = {"NAME": name}

    long_a, long_b = "a" * 64, "a" * 63 + "b"
    assert lock_name(Fake(long_a), 2**31 - 1) != lock_name(Fake(long_b), 2**31 - 1)
    for name in ("x" * 40, "y" * 41, long_a):
        full = lock_name(Fake(name), 2**31 - 1)
        assert len(full) <= 64
        with connection.cursor() as cursor:
            cursor.execute("SELECT GET_LOCK(%s, 0), RELEASE_LOCK(%s)", [full, full])
            assert cursor.fetchone() == (1, 1)


# ---------------------------------------------------------------------------- transactions


def test_a_deadlock_victims_ox_transaction_is_not_continued():
    """Promise: an error that rolled back the whole transaction (a deadlock) leaves nothing of
    the operation written and the connection usable, back in autocommit, with no ox transaction
    flagged open (a later operation must not 'join' a transaction that is gone)."""
    a, b = _enqueue_and_claim(2)
    mine = connections.create_connection("default")
    mine.ensure_connection()
    locked, go = threading.Event(), threading.Event()
    other_errors: list[BaseException] = []

    def other_session():
        other = connections.create_connection("default")
        try:
            with other.cursor() as oc:
                oc.execute("START TRANSACTION")
                # heavier than mine: InnoDB picks the transaction that wrote less as its victim
                oc.execute("UPDATE ox_task SET priority = 3 WHERE id = %s", [b.id.hex])
                oc.execute(
                    "INSERT INTO ox_queue (name, paused, overrides, limited, updated_by)"
                    " VALUES ('dl1', 0, '{}', 0, ''), ('dl2', 0, '{}', 0, ''), ('dl3', 0, '{}', 0, '')"
                )
                locked.set()
                go.wait(10)
                oc.execute("SELECT id FROM ox_task WHERE id = %s FOR UPDATE", [a.id.hex])
                oc.execute("COMMIT")
        except BaseException as exc:  # noqa: BLE001
            other_errors.append(exc)
        finally:
            other.close()

    t = threading.Thread(target=other_session)
    t.start()
    assert locked.wait(10)
    error = None
    try:
        with sql.transaction(mine) as cursor:
            cursor.execute("UPDATE ox_task SET priority = 7 WHERE id = %s", [a.id.hex])
            go.set()
            time.sleep(0.3)
            cursor.execute("SELECT id FROM ox_task WHERE id = %s FOR UPDATE", [b.id.hex])
    except Exception as exc:  # noqa: BLE001
        error = exc
    t.join(30)
    try:
        assert error is not None and "1213" in str(error.args[0]), (error, other_errors)
        assert not getattr(mine, "_ox_transaction_open", False)
        assert Task.objects.get(pk=a.id).priority == 0  # mine was rolled back whole
        with sql.transaction(mine) as cursor:  # and the next ox transaction is a fresh one
            cursor.execute("SELECT @@in_transaction")
            assert cursor.fetchone()[0] == 1
        with mine.cursor() as cursor:
            cursor.execute("SELECT @@in_transaction")
            assert cursor.fetchone()[0] == 0
    finally:
        mine.close()


def test_a_worker_reconnecting_while_its_old_session_still_holds_its_lock_keeps_trying():
    """Promise: nothing a step meets ends the worker; a lost connection means reconnect
    and carry on. On MariaDB the old session (a partition the server has not noticed yet:
    ox sets no server-side keepalive there) can still hold the worker's named lock: the
    reconnect's GET_LOCK(…, 10) then returns 0 and hold_worker_lock raises RuntimeError,
    which the reconnect loop (OperationalError/InterfaceError only) does not retry: the
    worker ends instead of waiting for its old session to go."""
    from types import SimpleNamespace

    from django.db import OperationalError

    from ox.worker import Worker

    lock_key = 424242
    zombie = open_worker_connection("default")
    sql.hold_worker_lock(zombie, lock_key)
    worker = Worker.__new__(Worker)
    worker.alias, worker.lock_key, worker.id = "default", lock_key, "reconnecting-w"
    worker.options = SimpleNamespace(pooled=False, heartbeat=3.0)
    worker.conn, worker.stopping, worker.stop_deadline = None, False, None
    outcome: list[object] = []

    def reconnect():
        try:
            worker._reconnect(OperationalError(2013, "Lost connection to server during query"))
            outcome.append("reconnected")
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)
        finally:
            if worker.conn is not None:
                worker.conn.close()

    t = threading.Thread(target=reconnect)
    started = time.monotonic()
    t.start()
    t.join(30)
    took = time.monotonic() - started
    assert outcome == ["reconnected"], outcome
    # Not by waiting for the old session to go (it would hold the lock for wait_timeout):
    # the reconnect ended it, and took the lock at once.
    assert took < 5, f"the reconnect took {took:.1f} s"
    try:
        zombie.close()
    except Exception:  # noqa: BLE001  (its session was ended under it)
        pass


def test_a_connection_killed_mid_transaction_commits_nothing_and_leaves_no_transaction_flagged():
    """Promise: a lost connection mid-transaction writes nothing of the operation (the server
    rolls it back), and the wrapper is not left believing an ox transaction is open (its next
    operation on a reconnect must open a transaction of its own, not join a dead one)."""
    (c,) = _enqueue_and_claim()
    victim = connections.create_connection("default")
    victim.ensure_connection()
    with victim.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        (conn_id,) = cursor.fetchone()
    now = clock.db_now(connection)
    with pytest.raises(Exception):  # noqa: B017,PT011
        with sql.transaction(victim) as cursor:
            cursor.execute("UPDATE ox_task SET priority = 9 WHERE id = %s", [c.id.hex])
            with connection.cursor() as killer:
                killer.execute("KILL %s", [conn_id])
            time.sleep(0.2)
            sql.complete(victim, [sql.Completion(c.id, c.fence, "1", now, now)])
    assert not getattr(victim, "_ox_transaction_open", False)
    t = Task.objects.get(pk=c.id)
    assert (t.status, t.priority) == (Status.RUNNING, 0)
    victim.close()


def test_concurrent_rescuers_rescue_each_lost_task_once():
    """Promise: two rescuers never rescue one task (SKIP LOCKED): every lost task of a dead
    worker is taken back once, with one 'lost' attempt and one fence step, however many
    rescuers run at once; nothing deadlocks."""
    worker_conn = open_worker_connection("default")
    lock_key = 987654
    now = clock.db_now(connection)
    sql.hold_worker_lock(worker_conn, lock_key)
    sql.register_worker(worker_conn, sql.WorkerRow("dead-w", "h", 1, ["default"], 1, lock_key, now))
    sql.insert_tasks(connection, [_row() for _ in range(60)])
    claimed = _claim(worker_conn, 60, worker="dead-w")
    assert len(claimed) == 60
    worker_conn.close()
    from tests.helpers import wait_until

    wait_until(
        lambda: (
            sql.rescue_and_mark(connection, clock.db_now(connection), liveness_grace=0.0)[1]
            or Worker.objects.filter(id="dead-w", lock_lost_at__isnull=False).exists()
        ),
        10,
    )
    time.sleep(0.05)
    out: list[object] = []
    start = threading.Barrier(4)

    def rescuer():
        conn = connections.create_connection("default")
        try:
            start.wait(10)
            out.extend(sql.rescue(conn, clock.db_now(conn), liveness_grace=0.0))
        except Exception as exc:  # noqa: BLE001
            out.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=rescuer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    errors = [r for r in out if isinstance(r, Exception)]
    assert not errors, errors
    assert sorted(r[0] for r in out) == sorted(c.id for c in claimed)
    assert Attempt.objects.filter(outcome="lost").count() == 60
    assert set(Task.objects.values_list("status", flat=True)) == {Status.READY}
    fences = dict(Task.objects.values_list("id", "fence"))
    assert all(fences[c.id] == c.fence + 1 for c in claimed)


def test_concurrent_slot_takers_never_hold_more_slots_than_there_are():
    """Promise: a queue's concurrency limit holds under concurrent workers: slots taken at
    once by many workers (FOR UPDATE SKIP LOCKED, then UPDATE by id on MariaDB) are never
    held by two, and their sum never exceeds the queue's slots; nothing deadlocks."""
    from ox.flow import slots

    slots.size(connection, "default", 5)
    out: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def taker(name):
        conn = connections.create_connection("default")
        try:
            start.wait(10)
            for _ in range(5):
                now = clock.db_now(conn)
                out.setdefault(name, []).extend(slots.take(conn, name, "default", 3, now, now + timedelta(seconds=60)))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=taker, args=(f"sw{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    taken = [n for ns in out.values() for n in ns]
    assert sorted(taken) == sorted(set(taken)) and len(taken) <= 5
    with connection.cursor() as cursor:
        cursor.execute("SELECT worker_id, n FROM ox_slot WHERE queue = 'default' AND worker_id <> ''")
        held = cursor.fetchall()
    assert sorted(n for _w, n in held) == sorted(taken)
    assert all(n in out[w] for w, n in held)
