"""MariaDB named locks (GET_LOCK): held by a session, free the moment it ends. A worker's
liveness is one (`<prefix><lock_key>`), its listener's session another (`<prefix>w<lock_key>`,
ox.db.mysql.wake)."""

import hashlib

from django.db import DatabaseError, OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper

# Lock name -> the session (CONNECTION_ID) of this process that last took it: a reconnect (a
# new connection) can tell its own previous session still holding the lock.
_lock_sessions: dict[str, int] = {}


def lock_prefix(conn: BaseDatabaseWrapper) -> str:
    """Named locks are the server's, not a database's: a lock name carries its database
    (hashed when long: a name is at most 64 characters)."""
    name = str(conn.settings_dict["NAME"])
    return f"ox.{name if len(name) <= 40 else hashlib.sha256(name.encode()).hexdigest()[:16]}."


def lock_name(conn: BaseDatabaseWrapper, lock_key: int) -> str:
    return f"{lock_prefix(conn)}{lock_key}"


def listen_lock_name(conn: BaseDatabaseWrapper, lock_key: int) -> str:
    return f"{lock_prefix(conn)}w{lock_key}"


def take_lock(conn: BaseDatabaseWrapper, name: str) -> None:
    """Take a named lock on this (new) session. After a network break the server may keep
    this process's previous session, and the lock with it, for as long as its wait_timeout
    (hours): a session of this process's that still holds it is ended (KILL, allowed on
    one's own user's sessions). Not got: an OperationalError, which the caller's reconnect
    loop retries."""
    with conn.cursor() as cursor:
        cursor.execute("SELECT IS_USED_LOCK(%s), CONNECTION_ID()", [name])
        holder, me = cursor.fetchone()
        previous = _lock_sessions.get(name)
        if holder is not None and holder != me and holder == previous:
            try:
                cursor.execute("KILL CONNECTION %s", [int(holder)])
            except DatabaseError:
                pass  # gone meanwhile, or not ours to end: GET_LOCK below says
        cursor.execute("SELECT GET_LOCK(%s, 10)", [name])
        if cursor.fetchone()[0] != 1:
            raise OperationalError(f"could not take the lock {name!r}: another session holds it")
        _lock_sessions[name] = int(me)
