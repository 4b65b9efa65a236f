"""The database's clock, as every process of ox sees it.

Workers and web servers run on many hosts and their wall clocks disagree; the database is
the one clock they share. Every time ox writes or compares (run_after, enqueued_at, leases,
the rescue, started/finished times, ticks) comes from `db_now()`: the database's clock read
once and then counted forward with this host's monotonic clock, so a host whose wall clock
is off (or is stepped by NTP) neither claims early, nor rescues live tasks, nor shows wrong
times. The reading is refreshed every `REFRESH` seconds, and at once when a worker
reconnects (`forget`).

One reading is one round trip (`SELECT statement_timestamp()` on PostgreSQL), its error at
most half of that round trip. SQLite runs inside this process: its clock is this host's.
"""

import threading
import time
from datetime import UTC, datetime, timedelta

from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db import driver

REFRESH = 60.0  # seconds between readings; a monotonic clock drifts by microseconds in that time

_lock = threading.Lock()
# database identity -> (database time at the reading, minus the monotonic clock then)
_offsets: dict[tuple[str, str, str, str], tuple[datetime, float]] = {}
_latest: tuple[datetime, float] | None = None  # the last reading taken, of any database


def _identity(conn: BaseDatabaseWrapper) -> tuple[str, str, str, str]:
    s = conn.settings_dict
    return (conn.vendor, str(s.get("HOST") or ""), str(s.get("PORT") or ""), str(s.get("NAME") or ""))


def _read(conn: BaseDatabaseWrapper) -> tuple[datetime, float]:
    """(database time, monotonic time) at the middle of one round trip."""
    before = time.monotonic()
    with conn.cursor() as cursor:
        cursor.execute(driver(conn).clock_sql)
        value = cursor.fetchone()[0]
    after = time.monotonic()
    if value.tzinfo is None:  # USE_TZ is required (ox.E008); a naive value would be UTC
        value = value.replace(tzinfo=UTC)
    return value, (before + after) / 2


def db_now(conn: BaseDatabaseWrapper) -> datetime:
    """The database's current time, aware, in UTC."""
    global _latest
    if not driver(conn).clock_sql:  # SQLite: the database is a file on this machine
        return datetime.now(UTC)
    key = _identity(conn)
    now = time.monotonic()
    known = _offsets.get(key)
    if known is None or now - known[1] > REFRESH:
        with _lock:
            known = _offsets.get(key)
            if known is None or now - known[1] > REFRESH:
                known = _latest = _offsets[key] = _read(conn)
                now = time.monotonic()
    at, mono = known
    return (at + timedelta(seconds=now - mono)).astimezone(UTC)


def estimated_now() -> datetime:
    """db_now() without a connection or a round trip: the latest reading of any database,
    counted forward (this host's clock before the first one). For task threads stamping
    when a body started or finished: a worker process talks to one database."""
    if _latest is None:
        return datetime.now(UTC)
    at, mono = _latest
    return (at + timedelta(seconds=time.monotonic() - mono)).astimezone(UTC)


def forget(conn: BaseDatabaseWrapper) -> None:
    """Read the clock again at the next db_now() (after a reconnect: maybe another server)."""
    with _lock:
        _offsets.pop(_identity(conn), None)


def skew(conn: BaseDatabaseWrapper) -> float:
    """Seconds this host's wall clock is ahead of the database's (negative: behind)."""
    return (datetime.now(UTC) - db_now(conn)).total_seconds()


def now_on(alias: str | None = None) -> datetime:
    """db_now() of a database alias (None: the one the router reads ox's tasks from)."""
    from django.db import connections, router

    from ox.models import Task

    return db_now(connections[alias or router.db_for_read(Task)])
