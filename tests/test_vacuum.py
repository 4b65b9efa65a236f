"""The vacuum duty (ox.vacuum, PostgreSQL): it vacuums ox's tables once their dead tuples pile
up, off the worker loop, skips a table someone else is vacuuming, backs off while an old
snapshot keeps VACUUM from removing anything, and a real worker keeps ox_task's dead tuples
bounded on a server whose autovacuum is off (this machine's). Everything here runs on the real
server: dead tuples are made by inserting and deleting rows, and the statistics are flushed
with pg_stat_force_next_flush() (PostgreSQL 15+) before they are read."""

import json
import logging
import time

import pytest
from django.db import connection

import ox
from ox.connection import open_worker_connection
from ox.vacuum import Vacuumer, table_counts
from tests import tasks
from tests.helpers import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="VACUUM is PostgreSQL's"),
]

DEAD = 12_000


def make_dead_rows(count: int = DEAD) -> None:
    """`count` dead tuples in ox_task: rows inserted and deleted, statistics flushed."""
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO ox_task (id, task_path, queue, priority, status, args, kwargs, run_after,
                   enqueued_at, is_async, attempts, max_attempts, worker_id, fence, cancel_requested)
               SELECT gen_random_uuid(), 'tests.tasks.noop', 'vacuum-test', 0, 'SUCCESSFUL', '[]', '{}',
                   now(), now(), false, 1, 1, '', 1, false
               FROM generate_series(1, %s)""",
            [count],
        )
        cursor.execute("DELETE FROM ox_task WHERE queue = 'vacuum-test'")
    flush_stats()


def flush_stats() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # at this (autocommit) statement's end


def ox_task_counts():
    flush_stats()
    return next(c for c in table_counts(connection) if c.table == "ox_task")


def manual_vacuums() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'ox_task'::regclass")
        return cursor.fetchone()[0]


def finish(vacuumer: Vacuumer) -> None:
    assert vacuumer.thread is not None
    vacuumer.thread.join(60)
    assert not vacuumer.busy


def test_vacuums_a_table_past_its_threshold_and_only_then():
    make_dead_rows()
    before = ox_task_counts()
    assert before.dead >= DEAD
    vacuumer = Vacuumer(connection.alias, interval=10, min_dead=before.dead + 1)
    vacuumer.run(connection)
    assert vacuumer.looks == 1 and vacuumer.thread is None  # under the threshold: nothing started
    vacuumer.run(connection)
    assert vacuumer.looks == 1  # the next look waits for the interval

    vacuumer = Vacuumer(connection.alias, interval=10, min_dead=DEAD // 2)
    vacuumer.run(connection)
    finish(vacuumer)
    [done] = [v for v in vacuumer.vacuums if v.table == "ox_task"]
    assert done.dead_before >= DEAD and done.dead_after < DEAD // 10 and done.kept_up
    after = ox_task_counts()
    assert after.vacuums == before.vacuums + 1 and after.dead < DEAD // 10
    assert vacuumer.wait == 10  # kept up: the next look at the usual interval


def test_the_loop_never_waits_for_a_vacuum_and_a_locked_table_is_skipped():
    """Another session holds the lock VACUUM needs (as autovacuum or another worker's duty
    would): the duty's run() returns at once, its thread skips the table instead of queueing
    behind the lock, and no back-off follows (nothing was found stuck)."""
    make_dead_rows()
    other = open_worker_connection(connection.alias)
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("LOCK TABLE ox_task IN SHARE UPDATE EXCLUSIVE MODE")
        vacuumer = Vacuumer(connection.alias, interval=10, min_dead=DEAD // 2)
        started = time.monotonic()
        vacuumer.run(connection)
        assert time.monotonic() - started < 0.5
        finish(vacuumer)
        assert time.monotonic() - started < 10
        assert [v for v in vacuumer.vacuums if v.table == "ox_task"] == []
        assert vacuumer.wait == 10
        with other.cursor() as cursor:
            cursor.execute("ROLLBACK")
    finally:
        other.close()
    assert ox_task_counts().dead >= DEAD  # still there: the next look will take it


def test_backs_off_and_warns_while_an_old_snapshot_keeps_rows_dead(caplog):
    other = open_worker_connection(connection.alias)
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("SELECT count(*) FROM ox_worker")  # takes the snapshot
        make_dead_rows()  # deleted after that snapshot: VACUUM must keep them
        vacuumer = Vacuumer(connection.alias, interval=10, min_dead=DEAD // 2)
        with caplog.at_level(logging.WARNING, logger="ox.vacuum"):
            vacuumer.run(connection)
            finish(vacuumer)
        [done] = [v for v in vacuumer.vacuums if v.table == "ox_task"]
        assert not done.kept_up and done.dead_after >= DEAD
        assert vacuumer.wait == 20 and vacuumer.next_at > time.monotonic() + 15
        assert "could not remove the dead rows of ox_task" in caplog.text
        with other.cursor() as cursor:
            cursor.execute("ROLLBACK")
    finally:
        other.close()
    # The snapshot is gone: the next round removes them and the pace returns to normal.
    vacuumer.next_at = 0.0
    vacuumer.run(connection)
    finish(vacuumer)
    assert vacuumer.vacuums[-1].kept_up and vacuumer.wait == 10


def test_stop_cancels_a_vacuum_in_progress(caplog):
    """Stopping the worker does not wait for a VACUUM: stop() cancels it, quietly. The VACUUM is
    made slow with cost-based delay on the test database (new sessions pick it up; the duty
    opens one per VACUUM): 50,000 dead tuples then take minutes instead of a tenth of a second."""
    make_dead_rows(50_000)
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER DATABASE {connection.ops.quote_name(name)} SET vacuum_cost_delay = 100")
        cursor.execute(f"ALTER DATABASE {connection.ops.quote_name(name)} SET vacuum_cost_limit = 1")
    try:
        vacuumer = Vacuumer(connection.alias, interval=10, min_dead=1000)
        with caplog.at_level(logging.INFO, logger="ox.vacuum"):
            vacuumer.run(connection)
            assert wait_until(lambda: vacuumer.conn is not None, timeout=10)
            assert wait_until(lambda: vacuum_running(), timeout=10)
            time.sleep(0.5)
            assert vacuumer.busy  # still vacuuming: it would take minutes
            started = time.monotonic()
            vacuumer.stop(timeout=10)
            assert not vacuumer.busy and time.monotonic() - started < 3
        assert vacuumer.vacuums == [] and caplog.text == ""
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {connection.ops.quote_name(name)} RESET vacuum_cost_delay")
            cursor.execute(f"ALTER DATABASE {connection.ops.quote_name(name)} RESET vacuum_cost_limit")
    assert not vacuum_running()


def vacuum_running() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'VACUUM (SKIP%%'"
            " AND state = 'active' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0] > 0


def test_a_draining_worker_keeps_dead_tuples_bounded(start_worker):
    """A real worker drains 30,000 tasks with the duty looking every 0.5 s from 5,000 dead
    tuples: VACUUM ran (the manual count grew: autovacuum's is separate) and the dead tuples
    left are a fraction of the ~2 per task a drain leaves without it."""
    vacuums_before = manual_vacuums()
    options = {"VACUUM_INTERVAL": 0.5, "VACUUM_MIN_DEAD": 5000}
    worker = start_worker("--concurrency", "2", env={"OX_TEST_OPTIONS": json.dumps(options)})
    total = 30_000
    ox.enqueue_many(tasks.noop, [((), {})] * total)
    wait_until(lambda: ox_task_counts().live >= 0 and not_pending(), timeout=180, interval=0.5)
    wait_until(lambda: manual_vacuums() > vacuums_before, timeout=30)
    # One more look after the drain brings it under the threshold.
    assert wait_until(lambda: ox_task_counts().dead < 10_000, timeout=30, interval=0.5)
    assert "vacuumed table=ox_task" in worker.output()
    worker.signal(15)
    assert worker.wait(30) == 0


def test_vacuum_false_turns_the_duty_off(start_worker):
    vacuums_before = manual_vacuums()
    options = {"VACUUM": False, "VACUUM_INTERVAL": 0.5, "VACUUM_MIN_DEAD": 1000}
    worker = start_worker("--concurrency", "2", env={"OX_TEST_OPTIONS": json.dumps(options)})
    ox.enqueue_many(tasks.noop, [((), {})] * 5000)
    wait_until(not_pending, timeout=120, interval=0.5)
    time.sleep(2)
    assert ox_task_counts().dead >= 5000 and manual_vacuums() == vacuums_before
    assert "vacuumed" not in worker.output()
    worker.signal(15)
    assert worker.wait(30) == 0


def not_pending() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM ox_task WHERE status IN ('READY', 'RUNNING')")
        return cursor.fetchone()[0] == 0
