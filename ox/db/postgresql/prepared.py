"""The worker's claims as prepared statements with generic plans, on its own connection.

Planning the claim (a recursive walk, a LATERAL range scan, SKIP LOCKED, the UPDATE and its
RETURNING) costs PostgreSQL about a millisecond, several times what running it costs on an
idle or shallow queue; an idle worker woken by NOTIFY waits for that plan before its task
starts. Prepared once per session with a generic plan, each claim after the first is run
without planning. Generic, not PostgreSQL's default choice: its custom plans for this
statement keep looking cheaper to it, so it would plan every claim again.

Only on the worker's own connection (ox.connection), and only when no transaction pooler
stands between it and the server (a prepared statement lives in one server session):
ox.db.postgresql.session sets plan_cache_mode there, and turns off psycopg's automatic
preparing, so nothing but these statements is prepared with that mode. Every other
connection, and a pooled worker's, runs the same SQL unprepared through Django's cursor.

The claim's text carries its limits as literals (ox.db.postgresql.claim), so the generic plan
knows how many rows it reads; what stays a parameter is the time, the queues, the worker and
its lease. tests/test_prepared_claim.py pins the generic plan's shape on a large backlog.
"""

import functools
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, NotSupportedError, ProgrammingError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from ox.db.base import SESSION_ATTR

# Set on the worker connection's server session (ox.db.postgresql.session) when it prepares.
GENERIC = ("plan_cache_mode", "force_generic_plan")
# "cached plan must not change result type": a table the statement returns from changed a
# column's type since the statement was prepared (a migration run beside live workers).
RESULT_CHANGED = "0A000"
# Errors after which the session itself is still usable (a refused value, a changed table).
_REFUSED = (DataError, IntegrityError, NotSupportedError, ProgrammingError)
# A prepared statement the server session does not have (26000), has already under the name
# psycopg chose (42P05), or has with another statement's parameters (08P01): a transaction
# pooler ox was not told about (POOLER) lends this client server sessions other clients
# prepared on. In each case the statement did not run.
_POOLED = ("26000", "42P05", "08P01")
# Set on a Django connection wrapper once its sessions showed a pooler: it prepares no more.
UNPREPARED_ATTR = "_ox_unprepared"
# psycopg's prepare_threshold when Django leaves it None, which refuses even an explicit
# prepare: high enough that psycopg prepares nothing by itself (Django's default), so only
# the statements ox asks for are prepared.
NEVER_BY_ITSELF = 2**62


@functools.cache
def _prepared_cursor() -> type:
    """A server-side binding cursor that prepares every statement it runs (psycopg keeps up
    to prepared_max of them per connection, least recently used first out). Built on first
    use: psycopg (with libpq, libssl and Kerberos, ~12 MiB resident) loads only in a process
    that talks to PostgreSQL, never in a SQLite or MariaDB worker
    (tests/test_driver_imports.py)."""
    import psycopg

    class Prepared(psycopg.Cursor[Any]):
        def execute(self, query: Any, params: Any = None, *, prepare: bool | None = None, binary: Any = None) -> Any:
            return super().execute(query, params, prepare=True, binary=binary)

    return Prepared


def prepares(conn: BaseDatabaseWrapper) -> bool:
    """Whether this wrapper is a worker connection whose session runs generic plans."""
    server: dict[str, str] | None = getattr(conn, SESSION_ATTR, None)
    return bool(server) and server.get(GENERIC[0]) == GENERIC[1]


def _cursor(conn: BaseDatabaseWrapper, raw: Any = None) -> CursorWrapper:
    """Django's cursor wrapper (query logging, execute_wrapper hooks and error translation
    as for any cursor) around a preparing cursor: `raw`, or a new one."""
    conn.ensure_connection()
    with conn.wrap_database_errors:
        conn.validate_thread_sharing()
        psycopg_conn = conn.connection
        if psycopg_conn.prepare_threshold is None:
            psycopg_conn.prepare_threshold = NEVER_BY_ITSELF
        if raw is None or raw.closed:  # a kept one is always this connection's (_take_kept)
            raw = _prepared_cursor()(psycopg_conn)
        return conn.make_debug_cursor(raw) if conn.queries_logged else conn.make_cursor(raw)


# Set on a psycopg connection: the preparing cursor its producers' writes run through, kept
# between them. Opening and closing a cursor per statement cost ~14 us (timed here: a sixth of
# what Python adds to an autocommit enqueue's round trip). Taken off the connection while a
# statement runs, so a statement run in the middle of it (an execute_wrapper hook, a log
# handler that enqueues) gets a cursor of its own and cannot replace this one's row count.
# Writes only: an INSERT's result holds nothing, where a claim's would hold its rows (the
# tasks' arguments) until the next claim. It goes with its connection (a reconnect makes a
# new psycopg connection).
_CURSOR_ATTR = "_ox_prepared_cursor"


def _take_kept(conn: BaseDatabaseWrapper) -> Any:
    """The connection's kept cursor, taken off it (None: none kept, or a wrapper shared
    between threads, whose statements each get a cursor of their own)."""
    if conn.allow_thread_sharing:
        return None
    psycopg_conn = conn.connection
    raw = getattr(psycopg_conn, _CURSOR_ATTR, None)
    if raw is not None:
        setattr(psycopg_conn, _CURSOR_ATTR, None)
    return raw


def _keep(conn: BaseDatabaseWrapper, cursor: CursorWrapper) -> None:
    raw = cursor.cursor
    if not conn.allow_thread_sharing and not raw.closed:
        setattr(raw.connection, _CURSOR_ATTR, raw)


def fetchall(conn: BaseDatabaseWrapper, text: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
    """Run the statement, prepared where the session allows, and return its rows.

    psycopg forgets a statement whose first run failed without closing it on the server, and
    keeps one that failed later: run again, a statement whose table changed type under it fails
    the same way every time (the worker would stop claiming until restarted). So after an
    error that leaves the session usable, every prepared statement goes (DEALLOCATE ALL, which
    psycopg sees and forgets its own), and one that failed only because its table changed is
    run once more, prepared anew. Inside a transaction the caller's rollback does the same
    (psycopg forgets its prepared statements on every rollback)."""
    if not prepares(conn):
        with conn.cursor() as plain:
            plain.execute(text, params)
            return plain.fetchall()
    try:
        return _run(conn, text, params)
    except _REFUSED as exc:
        if conn.in_atomic_block or not conn.get_autocommit():
            raise
        with conn.cursor() as plain:
            plain.execute("DEALLOCATE ALL")
        if getattr(exc.__cause__, "sqlstate", None) != RESULT_CHANGED:
            raise
    return _run(conn, text, params)


def _run(conn: BaseDatabaseWrapper, text: str, params: Sequence[object]) -> list[tuple[Any, ...]]:
    with _cursor(conn) as prepared:
        prepared.execute(text, params)
        return prepared.fetchall()


# Set on a psycopg connection once its first producer's write has shown whether it reaches the
# server directly: True (prepare from now on) or False (a pooler is in the way: never).
_DIRECT_ATTR = "_ox_direct"


def write(conn: BaseDatabaseWrapper, text: str, params: Sequence[object], prepare: bool) -> int:
    """Run a producer's write (enqueue's INSERT) and return its row count: prepared when
    `prepare` (ox OPTIONS POOLER does not say a transaction pooler is in the way) and the
    session is known to reach the server directly, else as Django runs any statement.

    This is the application's own connection, not the worker's: nothing about its session
    changes but the one statement prepared (PostgreSQL's own custom-or-generic choice plans
    it; an INSERT ... VALUES plans the same either way). Parsing and planning the INSERT is
    about a sixth of an autocommit enqueue's round trip.

    A session's first write runs unprepared (preparing is a round trip of its own: a
    connection opened for one request, CONN_MAX_AGE 0, that enqueues once never pays for it)
    and returns the server's process id: a connection made through a pooler (PgBouncer,
    either mode) was given the pooler's id, not the server's, and prepares nothing, ever. A
    pooler it was not told of must not get a prepared statement: psycopg names them _pg3_0,
    _pg3_1, ... on every connection alike, and a server session lent by a transaction pooler
    may hold another client's statement under the name, which would run in place of this one.
    If a prepared statement fails as a pooler's would (missing, name taken, another
    statement's parameters), the connection prepares no more and, outside a transaction, the
    statement runs again unprepared; inside the caller's atomic() the error is raised."""
    if not prepare or getattr(conn, UNPREPARED_ATTR, False):
        return _plain(conn, text, params)
    conn.ensure_connection()
    raw = conn.connection
    direct = getattr(raw, _DIRECT_ATTR, None)
    if direct is None:
        with conn.cursor() as cursor:
            cursor.execute(f"{text} RETURNING pg_backend_pid()", params)
            row = cursor.fetchone()
            count = cursor.rowcount
        if row is not None:  # None: a unique insert that found its key held; next time
            direct = row[0] == raw.pgconn.backend_pid
            setattr(raw, _DIRECT_ATTR, direct)
            if not direct:
                setattr(conn, UNPREPARED_ATTR, True)
        return count
    try:
        cursor = _cursor(conn, _take_kept(conn))
        try:
            cursor.execute(text, params)
            return cursor.rowcount
        finally:
            _keep(conn, cursor)
    except DatabaseError as exc:
        if getattr(exc.__cause__, "sqlstate", None) not in _POOLED:
            raise
        setattr(conn, UNPREPARED_ATTR, True)
        if conn.in_atomic_block or not conn.get_autocommit():
            raise
    return _plain(conn, text, params)


def _plain(conn: BaseDatabaseWrapper, text: str, params: Sequence[object]) -> int:
    with conn.cursor() as cursor:
        cursor.execute(text, params)
        return cursor.rowcount
