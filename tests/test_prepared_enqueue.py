"""A producer's enqueue runs its INSERT as a prepared statement on PostgreSQL
(ox.db.postgresql.prepared.write): on the application's own connection, only that statement,
never behind a transaction pooler ox was told of (POOLER), and when a pooler it was not told of
shows itself (a statement the server session lacks or already has), the connection prepares no
more and the enqueue is not lost outside a transaction. The same through a real PgBouncer in
tests/test_pgbouncer.py (test_an_undeclared_pooler_makes_enqueue_stop_preparing)."""

import dataclasses
from datetime import timedelta

import pytest
from django.db import IntegrityError, ProgrammingError, connection, transaction
from django.test.utils import CaptureQueriesContext

from ox import clock, sql
from ox.connection import open_worker_connection
from ox.db.postgresql.prepared import _CURSOR_ATTR, UNPREPARED_ATTR, prepares
from ox.enqueue import insert_or_find, new_task
from ox.models import Status, Task
from tests import flow_tasks, tasks

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
]


def prepared(conn=connection) -> list[str]:
    """The session's prepared statements' texts."""
    with conn.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements ORDER BY prepare_time")
        return [text for (text,) in cursor.fetchall()]


def psycopg_names(conn=connection) -> list[str]:
    with conn.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements ORDER BY prepare_time")
        return [name for (name,) in cursor.fetchall()]


def _close() -> None:
    """End the connection's server session: with Django's pool (DATABASE_POOL=1) close() only
    hands the session back to the pool, so the pool goes too and the next connection is new."""
    connection.close()
    if connection.settings_dict.get("OPTIONS", {}).get("pool"):
        connection.close_pool()


@pytest.fixture(autouse=True)
def _fresh_session():
    # Each test starts on a new server session with nothing prepared and no mark left by another.
    _close()
    if hasattr(connection, UNPREPARED_ATTR):
        delattr(connection, UNPREPARED_ATTR)
    yield
    _close()
    if hasattr(connection, UNPREPARED_ATTR):
        delattr(connection, UNPREPARED_ATTR)


def test_an_enqueue_prepares_its_insert_and_nothing_else():
    results = [tasks.echo.enqueue({"n": i, "text": "é\u2028"}) for i in range(4)]
    texts = prepared()
    assert len(texts) == 1 and texts[0].startswith("INSERT INTO ox_task")
    with connection.cursor() as cursor:
        for i in range(10):  # psycopg prepares nothing by itself on Django's connection
            cursor.execute("SELECT %s::int + 1", [i])
    assert prepared() == texts
    rows = list(Task.objects.order_by("enqueued_at", "id"))
    assert [str(r.id) for r in rows] == [r.id for r in results]
    assert [r.args for r in rows] == [[{"n": i, "text": "é\u2028"}] for i in range(4)]
    assert {r.status for r in rows} == {Status.READY}
    assert all(r.run_after == r.enqueued_at and r.max_attempts >= 1 for r in rows)


def test_a_sessions_first_enqueue_is_not_prepared():
    # Preparing costs a round trip of its own: a connection opened for one request that
    # enqueues once (CONN_MAX_AGE 0) would pay it for nothing.
    tasks.noop.enqueue()
    assert prepared() == []
    tasks.noop.enqueue()
    assert len(prepared()) == 1
    _close()  # a new session: its first is plain again
    tasks.noop.enqueue()
    assert prepared() == []
    assert Task.objects.count() == 3


def test_an_enqueue_in_atomic_is_prepared_and_rolls_back_with_the_caller():
    tasks.noop.enqueue()
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.noop.enqueue()
        raise RuntimeError("the caller's work fails")
    with transaction.atomic():
        tasks.noop.enqueue()
    assert Task.objects.count() == 2
    # psycopg dropped its statements on the rollback and prepared the INSERT again.
    assert [t[:20] for t in prepared()] == ["INSERT INTO ox_task "]


def test_a_unique_enqueue_is_prepared_and_still_finds_the_holder():
    first = flow_tasks.unique_all.enqueue(7)
    again = flow_tasks.unique_all.enqueue(7)
    assert again.id == first.id
    assert Task.objects.count() == 1
    assert any("ON CONFLICT DO NOTHING" in text for text in prepared())


def test_a_backend_behind_a_transaction_pooler_prepares_nothing(monkeypatch):
    backend = tasks.noop.get_backend()
    monkeypatch.setattr(backend, "_config", dataclasses.replace(backend.config, pooler="transaction"))
    for _ in range(3):
        tasks.noop.enqueue()
    flow_tasks.unique_all.enqueue(1)
    assert Task.objects.count() == 4
    assert prepared() == []


def _row():
    backend = tasks.noop.get_backend()
    return new_task(backend, tasks.noop, (), {}, clock.db_now(connection))


def test_a_statement_the_session_lost_makes_the_connection_stop_preparing():
    # What a transaction pooler does when it lends the session to another client: psycopg
    # believes the INSERT is prepared, the server session has no such statement.
    insert_or_find(connection, _row(), prepare=True)  # the session's first: plain
    insert_or_find(connection, _row(), prepare=True)
    [name] = psycopg_names()
    with connection.cursor() as cursor:
        cursor.execute(f"DEALLOCATE {name}")  # not DEALLOCATE ALL, which psycopg would notice
    insert_or_find(connection, _row(), prepare=True)  # autocommit: runs again, unprepared
    assert getattr(connection, UNPREPARED_ATTR) is True
    insert_or_find(connection, _row(), prepare=True)
    assert Task.objects.count() == 4
    assert prepared() == []


def test_a_name_the_session_already_has_in_atomic_raises_and_writes_nothing():
    # Another client's statement under the name psycopg will choose: in the caller's atomic()
    # the transaction is lost, so the error reaches the caller; the next enqueue is unprepared.
    tasks.noop.enqueue()  # the session's first: plain
    with connection.cursor() as cursor:
        cursor.execute("PREPARE _pg3_0 AS SELECT 1")
    with pytest.raises(ProgrammingError, match="already exists"), transaction.atomic():
        tasks.noop.enqueue()
    assert Task.objects.count() == 1
    assert getattr(connection, UNPREPARED_ATTR) is True
    with transaction.atomic():
        tasks.noop.enqueue()
    assert Task.objects.count() == 2


def _kept_cursor(conn=connection):
    return getattr(conn.connection, _CURSOR_ATTR, None)


def test_one_preparing_cursor_serves_every_enqueue_of_a_connection():
    tasks.noop.enqueue()  # the session's first: plain, no preparing cursor yet
    assert _kept_cursor() is None
    tasks.noop.enqueue()
    kept = _kept_cursor()
    assert kept is not None and not kept.closed
    for i in range(5):
        tasks.echo.enqueue(i)
        assert _kept_cursor() is kept and not kept.closed
    assert len(prepared()) == 1
    _close()  # a new session gets a cursor of its own
    tasks.noop.enqueue()
    tasks.noop.enqueue()
    assert _kept_cursor() is not None and _kept_cursor() is not kept
    assert Task.objects.count() == 9
    assert sorted(r.args for r in Task.objects.exclude(args=[])) == [[i] for i in range(5)]


def test_a_closed_kept_cursor_is_replaced_and_the_enqueue_is_not_lost():
    tasks.noop.enqueue()
    tasks.noop.enqueue()
    kept = _kept_cursor()
    kept.close()  # as if someone closed it: the next statement must not fail on it
    tasks.noop.enqueue()
    assert _kept_cursor() is not kept and not _kept_cursor().closed
    assert Task.objects.count() == 3


def test_the_kept_cursor_still_goes_through_djangos_hooks_and_query_log():
    tasks.noop.enqueue()
    tasks.noop.enqueue()  # the kept cursor exists from here on
    seen = []

    def record(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        tasks.noop.enqueue()
        tasks.noop.enqueue()
    assert [s[:20] for s in seen] == ["INSERT INTO ox_task "] * 2
    with CaptureQueriesContext(connection) as logged:
        tasks.noop.enqueue()
    # (Django logs a server-binding cursor's statement as 'QUERY = "..." PARAMS = ...')
    [query] = logged.captured_queries
    assert "INSERT INTO ox_task" in query["sql"]


def test_an_error_on_the_kept_cursor_is_djangos_and_the_next_enqueue_works():
    tasks.noop.enqueue()
    tasks.noop.enqueue()
    kept = _kept_cursor()
    row = _row()
    insert_or_find(connection, row, prepare=True)
    with pytest.raises(IntegrityError):  # the same id again: translated by Django's wrapper
        insert_or_find(connection, row, prepare=True)
    tasks.noop.enqueue()
    assert _kept_cursor() is kept
    assert Task.objects.count() == 4


def test_a_wrapper_shared_between_threads_keeps_no_cursor():
    # inc_thread_sharing (a live server's threads on one wrapper): two threads on one cursor
    # would read each other's results, so each statement gets a cursor of its own.
    tasks.noop.enqueue()
    connection.inc_thread_sharing()
    try:
        tasks.noop.enqueue()
        tasks.noop.enqueue()
        assert _kept_cursor() is None
    finally:
        connection.dec_thread_sharing()
    assert Task.objects.count() == 3


def test_a_statement_run_in_the_middle_of_a_write_does_not_replace_its_row_count():
    # An execute_wrapper hook (or a log handler) that enqueues on the same connection while
    # the outer statement's row count is still to be read: on one shared cursor the outer
    # unique insert read the inner INSERT's count and said a held key had gone in.
    tasks.noop.enqueue()
    tasks.noop.enqueue()  # the kept cursor exists from here on
    row = _row()
    row.unique_key, row.unique_states = "held-key", 0
    assert insert_or_find(connection, row, prepare=True) is None  # went in
    inside = []

    def enqueue_after(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "ON CONFLICT" in sql and not inside:
            inside.append(True)
            tasks.noop.enqueue()  # runs while the outer count is unread
        return result

    again = dataclasses.replace(row, id=_row().id)
    with connection.execute_wrapper(enqueue_after):
        holder = insert_or_find(connection, again, prepare=True)
    assert inside and holder == row.id  # the key is held: the holder's id, not "inserted"
    assert Task.objects.count() == 4
    assert _kept_cursor() is not None and not _kept_cursor().closed


def test_a_worker_connection_keeps_no_cursor_holding_its_claimed_rows():
    # A claim's result holds the tasks' arguments: kept, it would stay in memory until the
    # next claim. Claims get a cursor each, closed after.
    for i in range(3):
        tasks.echo.enqueue("x" * 10_000, i)
    conn = open_worker_connection("default")
    try:
        assert prepares(conn)  # the claims below run prepared, through prepared.fetchall
        for _ in range(2):
            now = clock.db_now(conn)
            claimed = sql.claim(conn, "w-kept", ["default"], (3, 0), now, now + timedelta(seconds=30))
            assert getattr(conn.connection, _CURSOR_ATTR, None) is None
        assert Task.objects.filter(status=Status.RUNNING).count() == 3 and claimed == []
    finally:
        conn.close()
