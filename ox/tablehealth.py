"""Health of the queue table, as far as the database can tell: on PostgreSQL bloat, vacuum,
size and the oldest open transaction holding VACUUM back (ox.db.postgresql.health); on
MariaDB/MySQL InnoDB's sizes, purge lag and oldest transaction (ox.db.mysql.health), a
different dataclass; None where the driver has nothing to say (SQLite).

The dashboard, ox_health and the metrics read `table_health()`; which figures there are is the
connection's driver's business (Driver.table_health), so a new database brings its own.
"""

from django.db import connections, router

from ox.db import driver
from ox.db.mysql.health import InnoDBTableHealth
from ox.db.postgresql.health import OldestTransaction, TableHealth
from ox.models import Task

DEFAULT_MAX_XACT_AGE = 3600.0  # seconds; backends' OPTIONS HEALTH_MAX_XACT_AGE overrides

__all__ = ["DEFAULT_MAX_XACT_AGE", "InnoDBTableHealth", "OldestTransaction", "TableHealth", "table_health"]


def table_health(
    using: str | None = None, max_xact_age: float = DEFAULT_MAX_XACT_AGE, table: str = "ox_task"
) -> TableHealth | InnoDBTableHealth | None:
    """Health of ox_task (or another ox table) on PostgreSQL, InnoDB's on MySQL/MariaDB; None
    on other databases. `using`: a database alias (default: the router's read database for ox.Task)."""
    conn = connections[using or router.db_for_read(Task)]
    return driver(conn).table_health(conn, max_xact_age, table)
