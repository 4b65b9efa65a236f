"""PostgreSQL table health: the migration's storage parameters, the statistics, and the
oldest open transaction that holds back VACUUM. None on SQLite."""

import time

import pytest
from django.db import connection

from ox.connection import open_worker_connection
from ox.tablehealth import table_health
from tests import tasks

pytestmark = pytest.mark.django_db
postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL storage and statistics")


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite has no table health")
def test_none_on_sqlite():
    assert table_health() is None


@postgres_only
def test_migration_set_queue_friendly_storage_parameters():
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'ox_task'")
        options = dict(o.split("=", 1) for o in cursor.fetchone()[0])
    assert 70 <= int(options["fillfactor"]) <= 80
    assert float(options["autovacuum_vacuum_scale_factor"]) <= 0.02
    assert float(options["autovacuum_analyze_scale_factor"]) <= 0.05
    assert float(options["autovacuum_vacuum_cost_delay"]) <= 2


@postgres_only
def test_migration_is_reversible(django_db_blocker):
    from django.db.migrations.executor import MigrationExecutor

    def reloptions():
        with connection.cursor() as cursor:
            cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'ox_task'")
            return cursor.fetchone()[0]

    executor = MigrationExecutor(connection)
    executor.migrate([("ox", "0002_tick")])
    try:
        assert reloptions() is None
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes("ox"))
    assert "fillfactor=80" in reloptions()


@postgres_only
def test_sizes_statistics_and_storage():
    tasks.echo.enqueue(1)
    health = table_health()
    assert health.table == "ox_task" and health.storage["fillfactor"] == "80"
    assert health.total_bytes >= health.table_bytes + health.index_bytes > 0
    assert health.live_tuples >= 0 and health.dead_tuples >= 0 and 0 <= health.dead_ratio <= 1


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_an_idle_open_transaction_is_found_and_flagged():
    other = open_worker_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("SELECT count(*) FROM ox_task")  # takes the snapshot that pins xmin
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
            time.sleep(0.3)
            health = table_health(max_xact_age=0.1)
            assert health.oldest_transaction.pid == pid
            assert health.oldest_transaction.state == "idle in transaction"
            assert health.oldest_transaction.age_seconds >= 0.3 and health.warning
            assert table_health(max_xact_age=3600).warning is False
            cursor.execute("ROLLBACK")
        after = table_health(max_xact_age=0.1)
        assert after.oldest_transaction is None or after.oldest_transaction.pid != pid
    finally:
        other.close()
