"""MariaDB/MySQL wake-up: an idle worker is told of an enqueue within milliseconds, without
LISTEN/NOTIFY.

- The worker's listener thread, on a session of its own, takes the named lock
  `<prefix>w<lock_key>` and then waits, over and over, WAIT_SECONDS at a time, for a second
  named lock (`<prefix>w<lock_key>b`, "the bell") that a second session of the listener holds
  and never lets go. The first lock names the session: IS_USED_LOCK() of it is that session's
  CONNECTION_ID, and NULL once the session is gone, so a producer never needs a stored
  session id that may have been given to someone else since (ids start again at 1 when the
  server restarts).
- A producer, once its enqueue has committed (ox.db.dialect.after_commit), reads the sessions
  of the running workers marked idle (ox.idle) that take one of the queues it enqueued to,
  and sends each `KILL QUERY <id>`: that ends the wait (GET_LOCK returns NULL) and the
  listener wakes the worker. KILL QUERY ends the running statement only; the session and its
  locks stay. On a session running nothing it does nothing.
- Why a lock wait and not `SELECT SLEEP(n)`: MariaDB's SLEEP waits under one server-wide
  mutex, and a KILL QUERY that reaches a session just as its SLEEP ends blocks the producer
  for two seconds (1 KILL in 100-300 with three idle workers woken in bursts; measured, and
  tests/test_attack_mariadb_wake.py pins it). A lock wait has a mutex of its own per session.
- If the bell's session dies, the wait gets the bell: the listener gives it back and raises,
  and the caller reconnects both sessions (ox.listener).
- What producers read is kept SEEN_FRESH seconds in each process, so a burst of enqueues costs
  one look, not one per enqueue: a worker that marks itself after that look looks again
  IDLE_RELOOK later (ox.idle), which finds what was enqueued meanwhile. A KILL that finds no
  such session (the listener reconnected) drops the look and looks again for that enqueue.
- KILL needs the same database user (or CONNECTION ADMIN): a session the producer may not
  KILL is skipped from then on (a warning, once); that worker finds the producer's tasks at
  its poll, the others are still woken.
- A KILL that arrives while the listener is between two waits ends nothing: a claim that a
  wake-up led to and that came back short is followed by another IDLE_RELOOK later
  (Dialect.lossy_wakeups), which finds a task whose KILL was lost so. A listener that (re)
  starts wakes its worker once: enqueues meanwhile woke no one.
- In Django's manual transaction mode (autocommit off, no atomic()) there is no commit to wait
  for: no wake-up is sent, and the task starts at the workers' poll.
"""

import copy
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db import DatabaseError, OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db.dialect import pending_commit
from ox.db.mysql.locks import take_lock

logger = logging.getLogger("ox.worker")

WAIT_SECONDS = 2.0  # one wait; the listener looks at its stop flag between them
PING_SECONDS = 20.0  # the bell's session is pinged this often (well inside its wait_timeout)
SEEN_FRESH = 0.025  # s: a look is reused this long (below ox.idle.IDLE_RELOOK)
ER_NO_SUCH_THREAD = 1094
ER_QUERY_INTERRUPTED = 1317

# alias -> (monotonic time of the look, [(the worker's queues, its listener's session)])
_seen: dict[str, tuple[float, list[tuple[frozenset[str], int]]]] = {}
_refused: dict[str, set[int]] = {}  # alias -> listener sessions its user may not KILL
_lock = threading.Lock()


def listen(
    conn: BaseDatabaseWrapper,
    name: str,
    wake: Callable[[], None],
    stopped: threading.Event,
    ready: Callable[[], None],
) -> None:
    """Hold the listener's lock on this session and wait until stopped, waking the worker
    whenever a wait is cut short. Raises what either session raises (the caller reconnects)."""
    take_lock(conn, name)
    bell_name = f"{name}b"
    # A second session like this one (the same server, user and options).
    bell = type(conn)(copy.deepcopy(conn.settings_dict), alias=conn.alias)
    try:
        bell.ensure_connection()
        take_lock(bell, bell_name)
        ready()
        pinged = time.monotonic()
        with conn.cursor() as cursor, bell.cursor() as ringer:
            while not stopped.is_set():
                try:
                    cursor.execute("SELECT GET_LOCK(%s, %s)", [bell_name, WAIT_SECONDS])
                    got = cursor.fetchone()[0]
                except OperationalError as exc:
                    if not exc.args or exc.args[0] != ER_QUERY_INTERRUPTED:
                        raise
                    got = None  # a server that reports the KILL as an error
                if got is None:  # KILL QUERY ended the wait
                    wake()
                elif got == 1:  # the bell's session is gone (the server ended it)
                    cursor.execute("SELECT RELEASE_LOCK(%s)", [bell_name])
                    raise OperationalError(f"the listener's bell session (lock {bell_name!r}) is gone")
                if time.monotonic() - pinged > PING_SECONDS:
                    # The bell's session says nothing else: keep it inside its wait_timeout.
                    ringer.execute("SELECT 1")
                    pinged = time.monotonic()
    finally:
        bell.close()


def _look(conn: BaseDatabaseWrapper, prefix: str) -> list[tuple[frozenset[str], int]]:
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT queues, IS_USED_LOCK(CONCAT(%s, 'w', lock_key)) FROM ox_worker"
            " WHERE idle_since IS NOT NULL AND stopped_at IS NULL AND lock_key > 0",
            [prefix],
        )
        rows = cursor.fetchall()
    return [(frozenset(json.loads(queues)), int(session)) for queues, session in rows if session is not None]


def _sessions(conn: BaseDatabaseWrapper, prefix: str, queues: set[str], fresh: bool = False) -> set[int]:
    now = time.monotonic()
    with _lock:
        seen = _seen.get(conn.alias)
    if seen is not None and not fresh and now - seen[0] < SEEN_FRESH:
        sleepers = seen[1]
    else:
        sleepers = _look(conn, prefix)
        with _lock:
            _seen[conn.alias] = (now, sleepers)
    refused = _refused.get(conn.alias, set())
    return {s for qs, s in sleepers if qs & queues and s not in refused}


def wake_idle(conn: BaseDatabaseWrapper, prefix: str, queues: Iterable[str]) -> None:
    """Wake the idle workers of these queues (after the enqueue committed). Never raises: an
    enqueue that committed has succeeded, whatever becomes of its wake-up."""
    wanted = set(queues)
    try:
        gone = [s for s in sorted(_sessions(conn, prefix, wanted)) if not _kill_query(conn, s)]
        if gone:
            # A listener reconnected (a new session) or its worker stopped since the look
            # this process kept: look again, once, for this enqueue.
            for session in sorted(_sessions(conn, prefix, wanted, fresh=True) - set(gone)):
                _kill_query(conn, session)
    except DatabaseError as exc:
        logger.info("could not wake idle workers (%s); they find the task at their poll", exc)


def _kill_query(conn: BaseDatabaseWrapper, session: int) -> bool:
    """KILL QUERY the session: False if there is no such session (any more)."""
    try:
        with conn.cursor() as cursor:
            cursor.execute("KILL QUERY %s", [session])
    except OperationalError as exc:
        code = exc.args[0] if exc.args else None
        if code == ER_NO_SUCH_THREAD:
            return False
        if code in (1095, 1227):  # ER_KILL_DENIED_ERROR, ER_SPECIFIC_ACCESS_DENIED_ERROR
            # That worker runs as another database user: skip it from now on, wake the rest.
            with _lock:
                first = conn.alias not in _refused
                _refused.setdefault(conn.alias, set()).add(session)
            if first:
                logger.warning(
                    "database %r: this user may not KILL QUERY a worker's session (%s): that worker finds"
                    " what this process enqueues at its poll; run producers and workers as one database user"
                    " (or grant CONNECTION ADMIN) to wake every worker at once",
                    conn.alias,
                    exc,
                )
            return True
        raise
    return True


def forget(alias: str | None = None) -> None:
    """Drop what producers of this process saw (all aliases when None)."""
    with _lock:
        if alias is None:
            _seen.clear()
            _refused.clear()
        else:
            _seen.pop(alias, None)


def wake_later(conn: BaseDatabaseWrapper, prefix: str, queues: Iterable[str]) -> None:
    """Wake the idle workers of `queues` once the open transaction commits (at once in
    autocommit): one look per transaction, whatever it enqueued."""
    pending: Any = pending_commit(conn, "ox.wake", lambda: _Wake(conn, prefix))
    if pending is None:
        if not conn.get_autocommit():
            return  # manual transaction mode: the commit is the caller's, with no hook to it
        wake_idle(conn, prefix, queues)
    else:
        pending.queues.update(queues)


class _Wake:
    def __init__(self, conn: BaseDatabaseWrapper, prefix: str) -> None:
        self.conn, self.prefix = conn, prefix
        self.queues: set[str] = set()

    def __call__(self) -> None:
        if self.queues:
            wake_idle(self.conn, self.prefix, self.queues)
