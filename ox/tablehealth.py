"""PostgreSQL health of the queue table: bloat, vacuum, size, and the oldest open transaction
holding VACUUM back. A queue table churns: every finished or pruned task leaves dead row
versions that only VACUUM reclaims, and VACUUM cannot reclaim anything newer than the oldest
snapshot still open in the database, so one forgotten `idle in transaction` session bloats
ox_task however well autovacuum is tuned.

The dashboard reads `table_health()`: None on SQLite; on MySQL/MariaDB the InnoDB figures of
ox.tablehealth_innodb (sizes, purge lag, oldest transaction), a different dataclass.
"""

from dataclasses import dataclass
from datetime import datetime

from django.db import connections, router

from ox.models import Task
from ox.tablehealth_innodb import InnoDBTableHealth, innodb_table_health

DEFAULT_MAX_XACT_AGE = 3600.0  # seconds; backends' OPTIONS HEALTH_MAX_XACT_AGE overrides


@dataclass(frozen=True)
class OldestTransaction:
    pid: int
    age_seconds: float  # since its transaction started
    xmin_age: int | None  # transactions since its snapshot's xmin (None: no snapshot)
    state: str
    application_name: str
    # No statement text: pg_stat_activity.query holds other sessions' SQL with its literal
    # values (session keys, passwords in an ALTER ROLE, customer data). Age, pid, state and
    # application are enough to find the session and end it.


@dataclass(frozen=True)
class TableHealth:
    table: str
    live_tuples: int
    dead_tuples: int
    last_autovacuum: datetime | None
    last_vacuum: datetime | None
    last_autoanalyze: datetime | None
    autovacuum_count: int
    table_bytes: int  # heap, without indexes and TOAST
    index_bytes: int
    total_bytes: int
    storage: dict[str, str]  # reloptions set by ox's migration (fillfactor, autovacuum_*)
    oldest_transaction: OldestTransaction | None
    max_xact_age: float

    @property
    def dead_ratio(self) -> float:
        total = self.live_tuples + self.dead_tuples
        return self.dead_tuples / total if total else 0.0

    @property
    def warning(self) -> bool:
        """An open transaction older than max_xact_age is holding back VACUUM."""
        return self.oldest_transaction is not None and self.oldest_transaction.age_seconds > self.max_xact_age


STATS_SQL = """
    SELECT s.n_live_tup, s.n_dead_tup, s.last_autovacuum, s.last_vacuum, s.last_autoanalyze,
           s.autovacuum_count, pg_relation_size(c.oid), pg_indexes_size(c.oid),
           pg_total_relation_size(c.oid), c.reloptions
    FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
    WHERE c.oid = to_regclass(%s)
"""

# Sessions of this database with a transaction open: their snapshot pins what VACUUM keeps.
OLDEST_SQL = """
    SELECT pid, EXTRACT(EPOCH FROM (now() - xact_start)), age(backend_xmin), state,
           COALESCE(application_name, '')
    FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
      AND xact_start IS NOT NULL
      AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
    ORDER BY xact_start
    LIMIT 1
"""


def table_health(
    using: str | None = None, max_xact_age: float = DEFAULT_MAX_XACT_AGE, table: str = "ox_task"
) -> TableHealth | InnoDBTableHealth | None:
    """Health of ox_task (or another ox table) on PostgreSQL, InnoDB's on MySQL/MariaDB; None
    on other databases. `using`: a database alias (default: the router's read database for ox.Task)."""
    conn = connections[using or router.db_for_read(Task)]
    if conn.vendor == "mysql":
        return innodb_table_health(conn, max_xact_age, table)
    if conn.vendor != "postgresql":
        return None
    with conn.cursor() as cursor:
        cursor.execute(STATS_SQL, [table])
        row = cursor.fetchone()
        cursor.execute(OLDEST_SQL)
        oldest = cursor.fetchone()
    if row is None:
        return None  # not migrated yet
    storage = dict(option.split("=", 1) for option in (row[9] or []))
    return TableHealth(
        table=table,
        live_tuples=row[0],
        dead_tuples=row[1],
        last_autovacuum=row[2],
        last_vacuum=row[3],
        last_autoanalyze=row[4],
        autovacuum_count=row[5],
        table_bytes=row[6],
        index_bytes=row[7],
        total_bytes=row[8],
        storage=storage,
        oldest_transaction=OldestTransaction(
            pid=oldest[0],
            age_seconds=float(oldest[1]),
            xmin_age=oldest[2],
            state=oldest[3] or "",
            application_name=oldest[4],
        )
        if oldest
        else None,
        max_xact_age=max_xact_age,
    )
