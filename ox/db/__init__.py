"""ox's drivers: one module per database holding its statements, behind the operations
ox.sql names, and what else only that database has: its worker session's settings
(ox.connection), its table health (ox.tablehealth), a backlog count of its own (ox.health),
its collation check (ox.checks); ox.db.base gives the generic answer to each. A connection's
driver is chosen by its vendor, here and nowhere else outside ox/db/ (the migrations aside:
tests/test_driver_boundary.py); adding a database is adding a driver here (and its CI leg)."""

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db.base import Driver
from ox.db.mysql import MysqlDriver
from ox.db.postgresql import PostgresDriver
from ox.db.sqlite import SqliteDriver

DRIVERS: dict[str, Driver] = {d.vendor: d for d in (PostgresDriver(), SqliteDriver(), MysqlDriver())}


def driver(conn: BaseDatabaseWrapper) -> Driver:
    """The driver of this connection's database."""
    try:
        return DRIVERS[conn.vendor]
    except KeyError:
        raise ImproperlyConfigured(
            f"ox has no driver for the {conn.vendor!r} database of {conn.alias!r} (it has: {', '.join(DRIVERS)})"
        ) from None


__all__ = ["DRIVERS", "Driver", "driver"]
