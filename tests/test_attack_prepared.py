"""Attacks on the worker's prepared claims (ox.db.postgresql.prepared; commit cea3929): schema
changes under a prepared claim, refused statements, killed sessions, eviction past psycopg's
prepared_max, parameter types, the gate, and real workers."""

import json
import random
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.db import DatabaseError, DataError, OperationalError, connection
from django.db.models import Count
from django.utils import timezone

from ox import clock, sql
from ox.connection import open_worker_connection
from ox.models import Status, Task
from tests.helpers import wait_until
from tests.test_dashboard_support import make_task

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
]


def claim_on(conn, limit=1, queues=("default",)) -> list:
    now = clock.db_now(conn)
    return sql.claim(conn, "w-atk", list(queues), limit, now, now + timedelta(seconds=30))


def arg(claimed) -> int:
    return json.loads(claimed.args_json)[0]


def ddl(statement: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement)


def n_prepared(conn) -> int:
    with conn.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        return cursor.fetchone()[0]


# ---------------------------------------------------------------- schema changes
def test_a_migration_widening_a_returned_column_does_not_break_the_prepared_claim():
    # A migration (AlterField max_length) changes the RETURNING's row type under a prepared
    # claim: PostgreSQL then refuses the statement ("cached plan must not change result type").
    for i in range(3):
        make_task(args=[i])
    conn = open_worker_connection("default")
    try:
        assert len(claim_on(conn)) == 1
        ddl("ALTER TABLE ox_task ALTER COLUMN queue TYPE varchar(100)")
        try:
            got, errors = [], []
            for _ in range(3):  # the worker retries a failed step: a retry must claim
                try:
                    got += claim_on(conn)
                except DatabaseError as exc:
                    errors.append(repr(exc))
            assert [arg(c) for c in got] == [1, 2], errors
        finally:
            ddl("ALTER TABLE ox_task ALTER COLUMN queue TYPE varchar(64)")
    finally:
        conn.close()


def test_the_claims_index_dropped_and_rebuilt_under_a_prepared_claim_replans_it():
    # A migration rebuilding the READY index under a generic plan that uses it: the plan must
    # be dropped with it (a stale plan would read a missing index), and the claim stay exact.
    for i in range(4):
        make_task(args=[i], priority=i % 2)
    conn = open_worker_connection("default")
    try:
        assert [arg(c) for c in claim_on(conn)] == [1]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_get_indexdef('ox_task_ready_claim'::regclass)")
            definition = cursor.fetchone()[0]
        ddl("DROP INDEX ox_task_ready_claim")
        try:
            assert [arg(c) for c in claim_on(conn)] == [3]
        finally:
            ddl(definition)
        assert [arg(c) for c in claim_on(conn, 2)] == [0, 2]
    finally:
        conn.close()


def test_a_claim_prepared_inside_a_rolled_back_transaction_is_claimable_again():
    # The first run (the PREPARE) inside a transaction the caller rolls back: the task stays
    # READY, psycopg forgets its statements (DEALLOCATE ALL), the next claims prepare anew.
    for i in range(2):
        make_task(args=[i])
    conn = open_worker_connection("default")
    try:
        conn.set_autocommit(False)
        assert [arg(c) for c in claim_on(conn)] == [0]
        conn.rollback()
        conn.set_autocommit(True)
        assert not Task.objects.filter(status=Status.RUNNING).exists()
        assert [arg(c) for c in claim_on(conn)] == [0]
        assert [arg(c) for c in claim_on(conn)] == [1]
        assert n_prepared(conn) == 1
    finally:
        conn.close()


# ---------------------------------------------------------------- refused statements
def _done(task: Task, return_json: str) -> sql.Completion:
    task.refresh_from_db()
    now = timezone.now()
    return sql.Completion(id=task.pk, fence=task.fence, return_json=return_json, started_at=now, finished_at=now)


def _complete_and_claim(conn, done, limit=1):
    now = clock.db_now(conn)
    return sql.complete_and_claim(conn, done, "w-atk", ["default"], (limit, 0), now, now + timedelta(seconds=30))


@pytest.mark.parametrize("atomic", [False, True])
def test_a_completion_the_database_refuses_after_prepare_leaves_later_claims_working(atomic):
    # A jsonb value PostgreSQL refuses (U+0000) in complete_and_claim once its text is
    # prepared; inside a caller's atomic too (its rollback makes psycopg DEALLOCATE ALL).
    for i in range(6):
        make_task(args=[i])
    conn = open_worker_connection("default")
    try:
        [a] = claim_on(conn)
        written, [b] = _complete_and_claim(conn, [_done(Task.objects.get(pk=a.id), "1")])  # prepared now
        assert written == {(a.id, a.fence)}
        bad = [_done(Task.objects.get(pk=b.id), '"\\u0000"')]
        if atomic:  # the caller's transaction, rolled back after the error
            conn.set_autocommit(False)
        try:
            with pytest.raises(DataError):
                _complete_and_claim(conn, bad)
        finally:
            if atomic:
                conn.rollback()
                conn.set_autocommit(True)
        # Nothing of the refused statement stays: b still RUNNING once, nothing else claimed.
        assert Task.objects.filter(status=Status.RUNNING).count() == 1
        written, [c] = _complete_and_claim(conn, [_done(Task.objects.get(pk=b.id), "2")])
        assert written == {(b.id, b.fence)}
        assert [arg(x) for x in claim_on(conn, 3)] == [3, 4, 5]
        assert arg(c) == 2
        assert Task.objects.filter(status=Status.SUCCESSFUL).count() == 2
        assert Task.objects.filter(status=Status.RUNNING).count() == 4
        assert set(Task.objects.values_list("attempts", flat=True)) == {1}
    finally:
        conn.close()


def test_refused_first_runs_do_not_pile_up_prepared_statements_on_the_server():
    # A statement refused at its first (preparing) run: psycopg forgets its name but the
    # server keeps it; repeated, the session's statements grow past prepared_max.
    make_task(args=[0])
    conn = open_worker_connection("default")
    try:
        [a] = claim_on(conn)
        bad = [_done(Task.objects.get(pk=a.id), '"\\u0000"')]
        for _ in range(conn.connection.prepared_max + 20):
            with pytest.raises(DataError):
                _complete_and_claim(conn, bad)
        assert n_prepared(conn) <= conn.connection.prepared_max
    finally:
        conn.close()


# ---------------------------------------------------------------- killed sessions
def _blocked_backend(query_start: str, timeout: float = 5.0) -> int | None:
    """The pid of a session waiting on a lock while running a statement starting so."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT pid, query FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            for pid, query in cursor.fetchall():
                if query.startswith(query_start):
                    return pid
            time.sleep(0.02)
    return None


def test_a_session_killed_while_its_prepared_claim_waits_claims_nothing_and_reconnects():
    # pg_terminate_backend in the middle of a prepared claim (held up by a table lock): the
    # claim's transaction dies with it; the reconnected wrapper prepares again and claims once.
    for i in range(3):
        make_task(args=[i])
    conn = open_worker_connection("default")
    side = open_worker_connection("default", pooled=True)
    try:
        assert [arg(c) for c in claim_on(conn)] == [0]
        errors: list[BaseException] = []

        def run() -> None:
            try:
                claim_on(conn)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        conn.inc_thread_sharing()
        side.set_autocommit(False)
        with side.cursor() as cursor:
            cursor.execute("LOCK TABLE ox_task IN ACCESS EXCLUSIVE MODE")
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            pid = _blocked_backend("WITH pick_false")
            assert pid is not None, "the claim never waited on the lock"
            with side.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        finally:
            side.rollback()
            side.set_autocommit(True)
        thread.join(10)
        assert not thread.is_alive()
        conn.dec_thread_sharing()
        assert len(errors) == 1 and isinstance(errors[0], OperationalError), errors
        conn.close()
        assert [arg(c) for c in claim_on(conn, 5)] == [1, 2]
        assert Task.objects.filter(status=Status.RUNNING).count() == 3
        assert set(Task.objects.values_list("attempts", flat=True)) == {1}
    finally:
        conn.close()
        side.close()


# ---------------------------------------------------------------- many statements, odd params
def _expected(rows, queues, kind_limits) -> list[int]:
    """Brute force: per kind, the first `limit` due READY rows of these queues in claim order."""
    out = []
    for flag, limit in zip((False, True), kind_limits, strict=True):
        mine = [r for r in rows if r[1] in queues and r[2] == flag]
        out += [r[0] for r in sorted(mine, key=lambda r: (-r[3], r[4], r[5]))[:limit]]
    return sorted(out)


def _seed(n: int, rng: random.Random) -> list:
    queues = ("default", "emails", "reports", "other")
    rows = []
    now = timezone.now()
    for i in range(n):
        t = make_task(
            args=[i],
            queue=rng.choice(queues),
            is_async=rng.random() < 0.4,
            priority=rng.choice((-5, 0, 0, 3, 10)),
            run_after=now - timedelta(seconds=rng.randint(1, 500)),
        )
        rows.append((i, t.queue, t.is_async, t.priority, t.run_after, t.pk))
    return rows


def test_more_distinct_claims_than_psycopgs_prepared_max_evict_and_stay_exact():
    # 15 queue sets x 3 kind mixes x 3 candidate bounds = 135 statement texts on one session
    # (psycopg keeps 100, deallocating the least recently used): each claim exact, rerun after
    # eviction too, and the server's statements stay bounded.
    rng = random.Random(7)
    rows = _seed(300, rng)
    ready = {r[0]: r for r in rows}
    conn = open_worker_connection("default")
    names = ("default", "emails", "reports", "other")
    sets = [tuple(q for j, q in enumerate(names) if mask >> j & 1) for mask in range(1, 16)]
    try:
        combos = [(qs, mix, size) for size in (1, 6, 14) for mix in ((1, 0), (0, 1), (1, 1)) for qs in sets]
        for qs, mix, size in [*combos, *combos[:20]]:
            limits = (mix[0] * size, mix[1] * size)
            now = clock.db_now(conn)
            got = sql.claim(conn, "w-atk", list(qs), limits, now, now + timedelta(seconds=30))
            assert sorted(arg(c) for c in got) == _expected(list(ready.values()), qs, limits), (qs, limits)
            for c in got:
                del ready[arg(c)]
            if len(ready) < 60:  # hand them back: the claims keep having something to take
                Task.objects.filter(status=Status.RUNNING).update(status=Status.READY, worker_id="", attempts=0)
                ready = {r[0]: r for r in rows}
        assert n_prepared(conn) <= conn.connection.prepared_max
    finally:
        conn.close()


def test_limits_on_either_side_of_a_parameter_type_boundary_share_a_text_and_both_work():
    # 32767 is dumped as int2, 32768 as int4: one text (the same candidate bound, 131072), two
    # prepared statements keyed by parameter types. And an int8 limit.
    for i in range(5):
        make_task(args=[i])
    conn = open_worker_connection("default")
    try:
        for limit in (32767, 32768, 2**31 + 5):
            Task.objects.update(status=Status.READY, worker_id="", attempts=0)
            assert sorted(arg(c) for c in claim_on(conn, limit)) == [0, 1, 2, 3, 4], limit
        assert claim_on(conn, 32767) == []
    finally:
        conn.close()


def test_generic_plans_claim_exactly_what_a_brute_force_picks():
    # Random backlogs (priorities, due times, kinds, queues) against the generic plan, with
    # limits that land on every candidate bound and tasks scheduled for later among them.
    rng = random.Random(11)
    rows = _seed(200, rng)
    later = timezone.now() + timedelta(hours=1)
    for r in rows[::7]:
        Task.objects.filter(pk=r[5]).update(run_after=later)
    rows = [r for r in rows if r not in rows[::7]]
    conn = open_worker_connection("default")
    try:
        for _ in range(25):
            qs = tuple(rng.sample(("default", "emails", "reports", "other"), rng.randint(1, 4)))
            limits = (rng.choice((0, 1, 2, 3, 5, 9, 30)), rng.choice((0, 1, 4, 17)))
            if max(limits) == 0:
                continue
            Task.objects.filter(status=Status.RUNNING).update(status=Status.READY, worker_id="", attempts=0)
            now = clock.db_now(conn)
            got = sql.claim(conn, "w-atk", list(qs), limits, now, now + timedelta(seconds=30))
            assert sorted(arg(c) for c in got) == _expected(rows, qs, limits), (qs, limits)
    finally:
        conn.close()


def test_concurrent_prepared_claimers_never_claim_a_task_twice():
    # Four worker sessions, each with its generic plans, racing over one backlog.
    for i in range(400):
        make_task(args=[i], priority=i % 4, is_async=i % 3 == 0)
    claimed: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(n: int) -> None:
        conn = open_worker_connection("default")
        mine: list[int] = []
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                got = claim_on(conn, (n + len(mine)) % 7 + 1, ("default", "emails"))
                if not got:
                    break
                mine += [arg(c) for c in got]
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            claimed[n] = mine
            conn.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(40)
    assert not errors, errors
    every = [i for mine in claimed.values() for i in mine]
    assert sorted(every) == list(range(400))
    assert sum(1 for mine in claimed.values() if mine) >= 2


# ---------------------------------------------------------------- real workers
TERMINAL = [Status.SUCCESSFUL, Status.FAILED, Status.CANCELLED]


def _options(**values: object) -> dict[str, str]:
    return {"OX_TEST_OPTIONS": json.dumps({k.upper(): v for k, v in values.items()})}


def _stop(*workers) -> None:
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(30) == 0, w.output()[-3000:]


def _all_done(ids, timeout: float) -> bool:
    try:
        wait_until(lambda: not Task.objects.filter(pk__in=list(ids)).exclude(status__in=TERMINAL).exists(), timeout)
    except AssertionError:
        return False
    return True


def _records(prefix: str, n: int) -> list:
    from tests import tasks

    return [tasks.record.enqueue(f"{prefix}{i}").id for i in range(n)]


def test_a_worker_keeps_claiming_after_a_migration_changes_a_returned_columns_type(start_worker):
    # A migration (AlterField max_length on queue) applied beside a running worker: the
    # claim texts it prepared before must not fail for good afterwards (a task ending across
    # the migration would stay RUNNING, and nothing new would be claimed).
    from tests import tasks
    from tests.testapp.models import Ledger

    worker = start_worker("--queues", "default", "--concurrency", "1", env=_options(poll_interval=60, prefetch=0))

    def rounds(prefix: str, timeout: float) -> tuple[bool, list]:
        # The same shapes of claims each time: a long task, tasks enqueued while it runs.
        long = tasks.sleep_for.enqueue(0.5).id
        try:
            wait_until(lambda: Task.objects.filter(pk=long).exclude(status=Status.READY).exists(), timeout)
        except AssertionError:
            return False, [long]
        ids = [long, *_records(prefix, 3)]
        return _all_done(ids, timeout), ids

    assert rounds("a", 20)[0], worker.output()[-3000:]
    assert rounds("a2", 20)[0], worker.output()[-3000:]
    ddl("ALTER TABLE ox_task ALTER COLUMN queue TYPE varchar(100)")
    try:
        ok, ids = rounds("b", 6)
        log = worker.output()
        states = sorted(Task.objects.filter(pk__in=ids).values_list("status", flat=True))
    finally:
        ddl("ALTER TABLE ox_task ALTER COLUMN queue TYPE varchar(64)")
    assert ok, (states, log[-1500:])
    assert "cached plan must not change result type" not in log
    assert Ledger.objects.filter(key__startswith="b").count() == 3
    _stop(worker)


def test_a_worker_whose_session_is_killed_mid_claim_reconnects_and_runs_each_task_once(start_worker):
    # pg_terminate_backend while the worker's prepared claim waits on a table lock: it
    # reconnects, prepares on the new session, and every task runs exactly once.
    from tests import tasks
    from tests.testapp.models import Ledger

    worker = start_worker("--queues", "default", "--concurrency", "2", env=_options(poll_interval=0.2))
    assert _all_done(_records("warm", 3), 20), worker.output()[-3000:]
    side = open_worker_connection("default", pooled=True)
    killed = None
    try:
        for _try in range(5):
            due = tasks.record.using(run_after=timezone.now() + timedelta(seconds=0.3)).enqueue("due").id
            side.set_autocommit(False)
            try:
                with side.cursor() as cursor:
                    cursor.execute("LOCK TABLE ox_task IN ACCESS EXCLUSIVE MODE")
                pid = _blocked_backend("WITH pick_", timeout=3)
                if pid is not None:
                    with side.cursor() as cursor:
                        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
                    killed = pid
            finally:
                side.rollback()
                side.set_autocommit(True)
            if killed:
                break
            assert _all_done([due], 10)
    finally:
        side.close()
    assert killed, "the worker's claim never waited on the lock"
    more = _records("after", 10)
    assert _all_done([due, *more], 20), worker.output()[-3000:]
    assert "reconnected" in worker.output()
    counts = dict(Ledger.objects.values_list("key").annotate(n=Count("id")).values_list("key", "n"))
    assert all(n == 1 for key, n in counts.items() if key.startswith("after")), counts
    assert Task.objects.get(pk=due).status == Status.SUCCESSFUL
    assert Ledger.objects.filter(key="due").count() == Task.objects.filter(args=["due"]).count()
    _stop(worker)


def test_a_worker_with_gated_and_plain_queues_sync_and_async_and_a_chain_runs_everything_once(start_worker):
    # Several queues: one behind a concurrency limit, one rate-limited (the gate, ox.flow),
    # two plain; sync and async tasks side by side; a chain (its inputs read by the prepared
    # claim); priorities; prefetch moving the limits (new candidate bounds).
    import ox
    from tests import tasks

    env = _options(limits={"emails": {"concurrency": 1}, "reports": {"rate": "100/s"}}, poll_interval=0.3)
    worker = start_worker(
        "--queues", "default,emails,reports,other", "--concurrency", "3", "--async-concurrency", "4", env=env
    )
    ids, expect = [], {}
    for i in range(60):
        queue = ("default", "emails", "reports", "other")[i % 4]
        t = (tasks.async_echo if i % 3 == 0 else tasks.echo).using(queue_name=queue, priority=i % 5)
        r = t.enqueue([i, queue])
        ids.append(r.id)
        expect[r.id] = [i, queue]
    chains = [ox.chain(tasks.echo.s(k), tasks.echo.s(), tasks.async_echo.s()).enqueue() for k in range(5)]
    assert _all_done(ids, 40), worker.output()[-3000:]
    rows = {t.pk: t for t in Task.objects.filter(pk__in=ids)}
    assert {str(pk): (t.status, t.attempts) for pk, t in rows.items()} == dict.fromkeys(ids, (Status.SUCCESSFUL, 1))
    assert {str(pk): t.return_value for pk, t in rows.items()} == expect
    wait_until(lambda: not Task.objects.exclude(status__in=TERMINAL).exists(), 20)
    assert set(Task.objects.values_list("status", flat=True)) == {Status.SUCCESSFUL}
    assert sorted(Task.objects.get(pk=c.last.id).return_value for c in chains) == [0, 1, 2, 3, 4]
    _stop(worker)
    assert "a worker step failed" not in worker.output()
