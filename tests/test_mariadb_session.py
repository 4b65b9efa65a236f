"""MariaDB: what a worker's own session is given (ox.db.mysql.session): READ
COMMITTED whatever the database's OPTIONS say, a client read timeout that ends a wait on a
server that stopped answering, and a server-side idle limit that ends a session whose worker
went silent (and with it the worker's named lock). Against the real server."""

import time

import pytest
from django.db import OperationalError, connection, connections

from ox.connection import IDLE_LIMIT, open_worker_connection
from ox.db.mysql.session import MDL_WAIT, READ_TIMEOUT

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB/MySQL worker sessions"),
]


@pytest.fixture
def db_options(monkeypatch):
    """Set the database's OPTIONS as DATABASES would (the copy connections are made from)."""

    def set_options(**options: object) -> None:
        db = connections.settings[connection.alias]
        monkeypatch.setitem(db, "OPTIONS", {**db.get("OPTIONS", {}), **options})

    return set_options


def one(conn, sql: str):
    with conn.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


def test_a_worker_session_is_read_committed_with_both_timeouts():
    conn = open_worker_connection(connection.alias)
    try:
        assert one(conn, "SELECT @@session.tx_isolation") == "READ-COMMITTED"
        assert one(conn, "SELECT @@session.wait_timeout") == IDLE_LIMIT
        assert one(conn, "SELECT @@session.lock_wait_timeout") == MDL_WAIT  # the server's default is a day
        assert conn.settings_dict["OPTIONS"]["read_timeout"] == READ_TIMEOUT
    finally:
        conn.close()


def test_read_committed_even_when_the_database_says_otherwise(db_options):
    db_options(isolation_level="repeatable read")
    plain = connections.create_connection(connection.alias)
    conn = open_worker_connection(connection.alias)
    try:
        assert one(plain, "SELECT @@session.tx_isolation") == "REPEATABLE-READ"  # the setting took
        assert one(conn, "SELECT @@session.tx_isolation") == "READ-COMMITTED"
    finally:
        plain.close()
        conn.close()


def test_the_databases_read_timeout_wins_and_ends_a_wait_on_a_silent_server(db_options):
    """A statement the server does not answer within read_timeout fails on the worker's side
    (MariaDB's SLEEP stands in for a server that went quiet): the worker reconnects instead
    of waiting for ever."""
    db_options(read_timeout=1)
    conn = open_worker_connection(connection.alias)
    try:
        started = time.monotonic()
        with pytest.raises(OperationalError), conn.cursor() as cursor:
            cursor.execute("SELECT SLEEP(10)")
        assert time.monotonic() - started < 5
    finally:
        conn.close()


def test_the_server_ends_a_worker_session_silent_past_its_idle_limit():
    conn = open_worker_connection(connection.alias, idle_limit=1)
    try:
        assert one(conn, "SELECT @@session.wait_timeout") == 1
        time.sleep(2.5)
        with pytest.raises(OperationalError):
            one(conn, "SELECT 1")
    finally:
        conn.close()


def test_an_init_command_that_sets_wait_timeout_wins(db_options):
    db_options(init_command="SET SESSION wait_timeout = 777")
    conn = open_worker_connection(connection.alias, idle_limit=5)
    try:
        assert one(conn, "SELECT @@session.wait_timeout") == 777
    finally:
        conn.close()
