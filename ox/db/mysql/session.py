"""MariaDB/MySQL: what a worker's own connection is given (ox.connection). The client library
has no TCP keepalives, so timeouts do that work, and the session is READ COMMITTED whatever
the database's OPTIONS say."""

from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

READ_TIMEOUT = 60  # s: the client's read and write timeouts (mysql_session)
MDL_WAIT = 50  # s: worker sessions' lock_wait_timeout, at most (below READ_TIMEOUT)


def mysql_session(options: dict[str, Any], idle_limit: float) -> int | None:
    """The worker's session is READ COMMITTED whatever the database's OPTIONS say (each
    statement must see what others committed before it: ox.flow.gate counts after its lock).
    There are no keepalives to set (the client library has none), so timeouts bound a session
    that stops answering: the client gives up on a read or write after READ_TIMEOUT s (longer
    than any statement of the worker's: a lock wait ends at innodb_lock_wait_timeout, 50 s by
    default) and the worker reconnects; the server ends a session silent for `idle_limit` s
    (its wait_timeout, returned here to be set at connect; the worker writes its heartbeat far
    more often), and with it the worker's named lock, so the rescue need not wait for the
    leases; a metadata lock wait ends after MDL_WAIT s at most. The database's own OPTIONS
    win: read_timeout, write_timeout, and an init_command that sets wait_timeout (then None)."""
    options["isolation_level"] = "read committed"
    options.setdefault("read_timeout", READ_TIMEOUT)
    options.setdefault("write_timeout", READ_TIMEOUT)
    if "wait_timeout" in str(options.get("init_command", "")).lower():
        return None
    return max(int(idle_limit), 1)


def worker_options(options: dict[str, Any], idle_limit: float) -> dict[str, str]:
    """Tune `options` (mysql_session); what start_session sets at connect ("" for
    wait_timeout: the OPTIONS' init_command sets it)."""
    wait = mysql_session(options, idle_limit)
    return {"wait_timeout": "" if wait is None else str(wait)}


def start_session(conn: BaseDatabaseWrapper, server: dict[str, str]) -> None:
    """The session's timeouts, in one round trip."""
    # A metadata lock wait (DDL, LOCK TABLES, a backup lock) ends by the server's error,
    # before the client's read timeout, as a row lock wait does (innodb_lock_wait_timeout).
    sets = [f"lock_wait_timeout = LEAST(@@session.lock_wait_timeout, {MDL_WAIT})"]
    if server["wait_timeout"]:
        sets.append(f"wait_timeout = {int(server['wait_timeout'])}")
    with conn.connection.cursor() as cursor:
        cursor.execute("SET SESSION " + ", ".join(sets))
