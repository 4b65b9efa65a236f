"""The worker's own database connection: opened once, held for the worker's life whatever
CONN_MAX_AGE says, never shared with task bodies (which use Django's per-thread ones).

What that session needs beyond Django's defaults is its database's: the driver tunes the
connection's OPTIONS (Driver.worker_options) and names the settings its server's side gets at
every connect (Driver.start_worker_session). On PostgreSQL that is TCP keepalives on both
ends and jit off (ox.db.postgresql.session); on MariaDB/MySQL, timeouts and READ COMMITTED
(ox.db.mysql.session); on SQLite, nothing.

`pooled`: behind a transaction-mode pooler (ox OPTIONS POOLER = "transaction") nothing is set
on the server's session, which the pooler hands to other clients between transactions.
"""

import copy
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from ox.db import driver
from ox.db.base import SESSION_ATTR

IDLE_LIMIT = 60.0  # s


def open_worker_connection(alias: str, pooled: bool = False, idle_limit: float = IDLE_LIMIT) -> BaseDatabaseWrapper:
    """A new connection for the worker (or its listener). `pooled`: the alias is behind a
    transaction-mode pooler, so nothing is set on the server's session. `idle_limit`: the
    longest the caller leaves the session silent, times a margin (MariaDB: mysql_session)."""
    conn = connections.create_connection(alias)
    settings = copy.deepcopy(conn.settings_dict)
    options = settings.setdefault("OPTIONS", {})
    # A pooled connection would go back to the pool between statements; the worker's
    # session state (LISTEN, its liveness advisory lock) must stay on one session. (Django's
    # client-side pool; an external pooler is what `pooled` is about.)
    options.pop("pool", None)
    settings["CONN_MAX_AGE"] = None
    # Each of the worker's statements commits, or opens ox's own transaction, whatever the
    # project's DATABASES say: with AUTOCOMMIT False a claim or completion would stay
    # uncommitted (invisible to every other session) until something committed it.
    settings["AUTOCOMMIT"] = True
    server = driver(conn).worker_options(options, pooled, idle_limit)
    if server is not None:
        # On the wrapper, not applied once here: a reconnect of the same wrapper gets them too.
        setattr(conn, SESSION_ATTR, server)
    conn.settings_dict = settings
    conn.ensure_connection()
    return conn


def _start_worker_session(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Set the server's side of a worker connection as soon as it connects (a receiver, so a
    reconnect of the same wrapper gets it too). Every other connection has nothing to set."""
    server: dict[str, str] | None = getattr(connection, SESSION_ATTR, None)
    if not server:
        return
    driver(connection).start_worker_session(connection, server)


connection_created.connect(_start_worker_session, dispatch_uid="ox.connection.server_keepalives")
