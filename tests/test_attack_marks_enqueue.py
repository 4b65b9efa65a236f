"""Adversarial tests of two changes: enqueue's prepared INSERT on PostgreSQL
(ox.db.postgresql.prepared.write, ox.enqueue.prepares) and start marks / MAX_LOST
(ox.start_marks, the rescues' LOST_COUNTED / LOSS_COUNTS).

Each test says what it attacks. Those that fail show a real break; the rest are regression
tests of attacks the changes held against."""

import os
import signal
import threading

import pytest
from django.db import DatabaseError, close_old_connections, connection, transaction
from django.tasks import task

from ox.db.postgresql.prepared import UNPREPARED_ATTR
from ox.models import Attempt, Outcome, Status, Task
from tests import flow_tasks, start_mark_tasks, tasks
from tests.helpers import in_fresh_thread, wait_until
from tests.pgbouncer import pgbouncer_fixture  # noqa: F401  (the fixture "pgbouncer")
from tests.test_durability import options

pytestmark = pytest.mark.django_db(transaction=True)


@task(takes_context=True, max_attempts=3)
def fails_then_kills(context) -> None:
    """A task for worker subprocesses: its first attempt raises, every later one kills its worker."""
    if context.attempt == 1:
        raise RuntimeError("the first attempt fails")
    os.kill(os.getpid(), signal.SIGKILL)


pg_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared enqueue: PostgreSQL only")


def _forget_session():
    connection.close()
    if hasattr(connection, UNPREPARED_ATTR):
        delattr(connection, UNPREPARED_ATTR)


@pytest.fixture(autouse=True)
def _fresh_session():
    _forget_session()
    yield
    _forget_session()


# ---------------------------------------------------------------- change 1: prepared enqueue


# (Found by this review: a transaction pooler ox was not told of could hand a client a server
# session holding another client's statement under psycopg's name, which then ran in its place.
# A session's first write now reads the server's process id and a connection through a pooler
# prepares nothing: test_real_pgbouncer_hands_a_unique_enqueue_another_clients_prepared_insert
# below, and tests/test_pgbouncer.py::test_an_undeclared_pooler_makes_enqueue_stop_preparing.)


@pg_only
def test_a_savepoint_rolled_back_between_prepared_enqueues_in_one_transaction():
    # psycopg clears its cache on a ROLLBACK (TO SAVEPOINT, too) and sends DEALLOCATE ALL:
    # the next enqueue in the same transaction prepares again and nothing is lost or doubled.
    tasks.noop.enqueue()
    with transaction.atomic():
        tasks.noop.enqueue()  # prepared
        for _ in range(3):
            try:
                with transaction.atomic():
                    tasks.noop.enqueue()
                    raise RuntimeError("the savepoint rolls back")
            except RuntimeError:
                pass
            tasks.noop.enqueue()  # after ROLLBACK TO SAVEPOINT
    assert Task.objects.count() == 5
    assert not getattr(connection, UNPREPARED_ATTR, False)


@pg_only
@pytest.mark.parametrize(
    "statement", ["DISCARD ALL", "DEALLOCATE ALL", "ALTER TABLE ox_task ALTER COLUMN queue SET DEFAULT 'x'"]
)
def test_user_code_drops_prepared_statements_between_enqueues_in_atomic(statement):
    # DISCARD ALL / DEALLOCATE ALL / a migration's ALTER run by user code on the same
    # connection inside the request's transaction: the next enqueue must not fail the request.
    tasks.noop.enqueue()
    tasks.noop.enqueue()  # prepared
    if statement.startswith("DISCARD"):  # cannot run in a transaction block: between requests
        with connection.cursor() as cursor:
            cursor.execute(statement)
    try:
        with transaction.atomic():
            tasks.noop.enqueue()
            if not statement.startswith("DISCARD"):
                with connection.cursor() as cursor:
                    cursor.execute(statement)
            tasks.noop.enqueue()
            tasks.noop.enqueue()
            if statement.startswith("ALTER"):
                raise RuntimeError("undo the ALTER")
    except RuntimeError:
        pass
    expected = 2 if statement.startswith("ALTER") else 5
    assert Task.objects.count() == expected
    assert not getattr(connection, UNPREPARED_ATTR, False)


@pg_only
def test_the_server_ends_the_session_between_prepared_enqueues():
    # pg_terminate_backend between two enqueues: the next one fails like any statement on a
    # dead connection (Django's usual), and the one after runs on a fresh session, its first
    # write plain, nothing left behind by the old session's prepared state.
    tasks.noop.enqueue()
    tasks.noop.enqueue()  # prepared
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    import psycopg

    from tests.conftest import database_url

    with psycopg.connect(database_url().replace("postgres://", "postgresql://"), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(DatabaseError):
        tasks.noop.enqueue()
    close_old_connections()
    connection.close()
    tasks.noop.enqueue()
    tasks.noop.enqueue()
    assert Task.objects.count() == 4
    assert not getattr(connection, UNPREPARED_ATTR, False)


@pg_only
def test_debug_cursor_and_execute_wrapper_see_the_prepared_enqueue():
    # DEBUG query logging (CursorDebugWrapper) and execute_wrapper hooks must see the
    # prepared INSERT as they see any other (an app's query audit relies on them).
    seen: list[str] = []

    def hook(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    connection.force_debug_cursor = True
    try:
        with connection.execute_wrapper(hook):
            tasks.noop.enqueue()
            tasks.noop.enqueue()  # prepared
        logged = [q["sql"] for q in connection.queries]
    finally:
        connection.force_debug_cursor = False
    assert sum("INSERT INTO ox_task" in s for s in seen) == 2
    assert sum("INSERT INTO ox_task" in s for s in logged) == 2
    assert Task.objects.count() == 2


@pg_only
def test_enqueue_from_many_threads_and_a_huge_argument():
    # Threads each on their own connection, each past its first write, plus a 10 MB argument
    # through the prepared INSERT.
    errors: list[BaseException] = []

    def produce():
        try:
            for i in range(6):
                tasks.echo.enqueue(i)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=produce) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    tasks.echo.enqueue("a")
    big = tasks.echo.enqueue("x" * 10_000_000)  # prepared (the session's second)
    assert len(Task.objects.get(pk=big.id).args[0]) == 10_000_000
    assert Task.objects.count() == 26


def test_a_lone_surrogate_is_refused_clearly_and_writes_nothing():
    tasks.echo.enqueue("ok")
    with pytest.raises(Exception) as info:
        tasks.echo.enqueue("bad \ud800")
    assert "surrogate" in str(info.value).lower() or "encode" in str(info.value).lower(), repr(info.value)
    tasks.echo.enqueue("ok again")  # the connection is still usable, nothing half written
    assert Task.objects.count() == 2


@pg_only
def test_aenqueue_from_many_coroutines():
    import asyncio

    async def main():
        await asyncio.gather(*(tasks.echo.aenqueue(i) for i in range(30)))
        await asyncio.gather(*(flow_tasks.unique_all.aenqueue(i % 3) for i in range(12)))

    in_fresh_thread(lambda: asyncio.run(main()))
    assert Task.objects.filter(task_path="tests.tasks.echo").count() == 30
    assert Task.objects.filter(task_path="tests.flow_tasks.unique_all").count() == 3


# ---------------------------------------------------------------- change 2: start marks


@pg_only
@pytest.mark.parametrize("kind", [start_mark_tasks.marked_at_start, start_mark_tasks.amarked_at_start])
def test_a_retried_task_whose_start_mark_cannot_be_written_runs_at_once(start_worker, kind):
    # The mark's UPDATE fails (a DB error for that one statement: a trigger standing for a
    # statement_timeout or a lost connection): the body must still run once - not stay
    # RUNNING, not be FAILED, not go round unrun.
    with connection.cursor() as cursor:
        # A sequence: nextval() outlives the failed statement's rollback (a table would not).
        cursor.execute("DROP SEQUENCE IF EXISTS attack_mark_refusals")
        cursor.execute("CREATE SEQUENCE attack_mark_refusals")
        cursor.execute(
            """CREATE OR REPLACE FUNCTION attack_refuse_mark() RETURNS trigger AS $$
            BEGIN
              IF NEW.attempts >= 2 AND NEW.last_attempted_at IS NOT NULL AND OLD.last_attempted_at IS NULL
                 AND nextval('attack_mark_refusals') = 1 THEN
                RAISE EXCEPTION 'attack: the mark cannot be written';
              END IF;
              RETURN NEW;
            END $$ LANGUAGE plpgsql"""
        )
        cursor.execute("DROP TRIGGER IF EXISTS attack_refuse_mark ON ox_task")
        cursor.execute(
            "CREATE TRIGGER attack_refuse_mark BEFORE UPDATE ON ox_task"
            " FOR EACH ROW EXECUTE FUNCTION attack_refuse_mark()"
        )
    try:
        r = kind.enqueue()
        worker = start_worker(env=options(heartbeat=0.5, lease=3.0, rescue_interval=0.5, backoff_base=0.05))
        try:
            wait_until(lambda: Task.objects.get(pk=r.id).status in (Status.SUCCESSFUL, Status.FAILED), 30)
        except AssertionError:
            row = Task.objects.get(pk=r.id)
            attempts = list(Attempt.objects.filter(task_id=r.id).order_by("number").values_list("number", "outcome"))
            raise AssertionError(
                f"task {row.status} attempts={row.attempts} lease={row.lease_expires_at} worker={row.worker_id}"
                f" ox_attempt={attempts}\n{worker.output()[-2500:]}"
            ) from None
        row = Task.objects.get(pk=r.id)
        assert row.status == Status.SUCCESSFUL, (row.status, worker.output()[-2000:])
        # The refused mark did not hold the body back (a mark that could never be written
        # would otherwise send the task round for ever): it ran at once, unmarked (False), its
        # mark written by the heartbeat after it, as before marks came first.
        assert row.return_value is False and row.attempts == 2
        with connection.cursor() as cursor:
            cursor.execute("SELECT last_value FROM attack_mark_refusals")
            assert cursor.fetchone()[0] == 2  # refused once, then written
        outcomes = list(Attempt.objects.filter(task_id=r.id).order_by("number").values_list("outcome", flat=True))
        assert Outcome.LOST not in outcomes
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS attack_refuse_mark ON ox_task")
            cursor.execute("DROP FUNCTION IF EXISTS attack_refuse_mark()")
            cursor.execute("DROP SEQUENCE IF EXISTS attack_mark_refusals")


def test_a_poison_task_after_a_failed_first_attempt_is_still_failed_after_max_lost(start_worker, tmp_path):
    # The first attempt raises (no loss), every later attempt kills its worker at once: the
    # losses are all of marked attempts (> 1), so MAX_LOST of them must end it FAILED, on
    # every database's rescue SQL, rather than loop forever.
    fast = {"lease": 3.0, "heartbeat": 0.5, "rescue_interval": 0.5, "liveness_grace": 1.0, "max_lost": 2}
    r = fails_then_kills.enqueue()
    rescuer = start_worker("--queues", "other", env=options(**fast))
    deaths = 0
    for _ in range(4):
        victim = start_worker("--queues", "default", env=options(**fast))
        try:
            victim.wait(30)
        except Exception:  # noqa: BLE001
            break
        deaths += 1
        wait_until(lambda: Task.objects.get(pk=r.id).status != Status.RUNNING, 30)
        if Task.objects.get(pk=r.id).status == Status.FAILED:
            break
    row = Task.objects.get(pk=r.id)
    assert row.status == Status.FAILED, (row.status, row.attempts, deaths)
    assert deaths == 2
    assert rescuer.proc.poll() is None


@pg_only
@pytest.mark.slow
def test_real_pgbouncer_hands_a_unique_enqueue_another_clients_prepared_insert(pgbouncer):
    # The same through a real PgBouncer 1.18 in transaction mode, pool of 2, ox not told
    # (POOLER unset, as docs/deployment.md says it detects). PgBouncer reuses server sessions
    # LIFO, so the session client A prepared on last is the one B gets next.
    from django.db.backends.postgresql.base import DatabaseWrapper

    from ox import clock
    from ox.enqueue import insert_or_find, new_task

    bouncer = pgbouncer(pool_mode="transaction", pool_size=2)
    settings = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": bouncer.port}
    a, b = DatabaseWrapper(dict(settings), "bouncer_a"), DatabaseWrapper(dict(settings), "bouncer_b")
    backend = tasks.noop.get_backend()

    def row(conn, task, *args):
        return new_task(backend, task, args, {}, clock.db_now(conn))

    try:
        with a.cursor() as cursor:
            cursor.execute("BEGIN")  # A holds server session S1
        insert_or_find(a, row(a, tasks.noop), prepare=True)  # plain (A's first)
        insert_or_find(a, row(a, tasks.noop), prepare=True)  # _pg3_0 = the plain INSERT, on S1
        # B, autocommit, can only get S2 meanwhile.
        assert insert_or_find(b, row(b, flow_tasks.unique_all, 7), prepare=True) is None  # plain
        holder = insert_or_find(b, row(b, flow_tasks.unique_all, 7), prepare=True)  # _pg3_0 = ON CONFLICT, on S2
        assert holder is not None
        with a.cursor() as cursor:
            cursor.execute("COMMIT")  # S1 back to the pool, last: PgBouncer hands it out next
        # B enqueues the duplicate again: it must find the holder, not fail.
        again = insert_or_find(b, row(b, flow_tasks.unique_all, 7), prepare=True)
        assert again == holder
    finally:
        a.close()
        b.close()
    assert Task.objects.filter(task_path="tests.flow_tasks.unique_all").count() == 1


@pg_only
def test_an_autocommit_enqueue_on_a_pooled_session_whose_name_holds_a_statement_of_other_arity():
    # Behind an undeclared pooler the server session may hold, under psycopg's _pg3_0, a
    # statement another client prepared with a different parameter count (a worker's claim,
    # an app with prepare_threshold set). The Bind fails with 08P01 (protocol violation), not
    # 26000/42P05: the wrapper neither stops preparing nor runs the INSERT again, and an
    # enqueue outside any transaction - the case the change promises not to lose - fails.
    tasks.noop.enqueue()
    tasks.noop.enqueue()  # _pg3_0 = the INSERT
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE _pg3_0")
        cursor.execute("PREPARE _pg3_0 (int) AS SELECT $1 + 1")  # what another client left there
    tasks.noop.enqueue()  # autocommit: must not fail
    assert Task.objects.count() == 3
