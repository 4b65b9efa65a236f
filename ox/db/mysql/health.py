"""InnoDB health of the queue table (MariaDB, MySQL): sizes, purge lag, and the oldest open
transaction holding purge back.

InnoDB has no dead tuples or VACUUM: an UPDATE or DELETE leaves the old row version in the undo
log, and the purge thread removes it once no read view can still see it. The undo records
waiting for purge are the "history list"; one forgotten open transaction keeps its read view
and lets that list (and the undo tablespace, and every secondary-index scan over delete-marked
rows) grow for as long as it stays open. So the two figures that matter are the history list
length and the age of the oldest transaction, the same warning ox gives on PostgreSQL.

`ox.tablehealth.table_health()` returns `innodb_table_health()` through the driver
(MysqlDriver.table_health); it is a dataclass of its own, not PostgreSQL's `TableHealth`, and
says `kind == "innodb"` so a caller (or a JSON reader) can tell the two apart.
"""

from dataclasses import dataclass

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

KIND = "innodb"


@dataclass(frozen=True)
class InnoDBTransaction:
    thread_id: int  # trx_mysql_thread_id: the id that SHOW PROCESSLIST and KILL take
    age_seconds: float  # since trx_started, on the server's clock
    state: str  # trx_state: RUNNING, LOCK WAIT, ROLLING BACK, COMMITTING
    # No statement text: INNODB_TRX.trx_query holds other sessions' SQL with its literal values
    # (session keys, customer data), as pg_stat_activity.query does on PostgreSQL (issue #16).
    # The thread id is enough to find the session and KILL it.


@dataclass(frozen=True)
class InnoDBTableHealth:
    table: str
    estimated_rows: int  # TABLE_ROWS: InnoDB's sampled estimate, not a count
    data_bytes: int  # DATA_LENGTH: the clustered index, i.e. the rows
    index_bytes: int  # INDEX_LENGTH: the secondary indexes
    free_bytes: int  # DATA_FREE: allocated but unused space in the table's tablespace
    # None when INNODB_METRICS cannot be read (no PROCESS privilege) or its
    # trx_rseg_history_len counter is disabled: a frozen counter would read as "no lag".
    history_list_length: int | None
    oldest_transaction: InnoDBTransaction | None
    # False when INNODB_TRX cannot be read (no PROCESS privilege): then "no oldest transaction"
    # means "not known", not "none open", and the page must say so.
    transactions_visible: bool
    max_xact_age: float
    kind: str = KIND  # a field, not a class constant, so that dataclasses.asdict() carries it

    @property
    def total_bytes(self) -> int:
        # Data plus indexes, what the table's rows and indexes take. DATA_FREE is left out: with
        # innodb_file_per_table off it is the free space of the shared system tablespace, not
        # this table's, and adding it would make every table look as big as ibdata1's slack.
        return self.data_bytes + self.index_bytes

    @property
    def warning(self) -> bool:
        """An open transaction older than max_xact_age is holding back purge (as on PostgreSQL,
        where it holds back VACUUM)."""
        return self.oldest_transaction is not None and self.oldest_transaction.age_seconds > self.max_xact_age


# information_schema.TABLES asks the storage engine (handler::info()) on MariaDB, so the numbers
# are current; MySQL 8 caches them for information_schema_stats_expiry (a day by default) unless
# ANALYZE TABLE refreshes them, which is acceptable for a health page.
STATS_SQL = """
    SELECT TABLE_ROWS, DATA_LENGTH, INDEX_LENGTH, DATA_FREE
    FROM information_schema.TABLES
    WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s
"""

# Purge lag and the oldest transaction in one statement, so a page poll costs two queries here
# as on PostgreSQL; both tables need the PROCESS privilege, so they are readable together or not
# at all. The history length is NULL when its counter is off: MariaDB has ENABLED (0/1), MySQL 8
# STATUS ('enabled'), and a disabled counter keeps its last value, which would read as "no lag".
#
# The oldest transaction is the whole server's, not just this schema's: purge is server-wide, so
# a transaction in another database holds back ox_task's undo just the same. Our own connection
# is left out (a test, or a caller inside atomic(), has one open). The age is taken on the
# server's clock (NOW() and trx_started both in this session's time zone; UNIX_TIMESTAMP makes
# the difference DST-proof). trx_started has whole seconds, so the age reads up to 1 s high.
# InnoDB serves INNODB_TRX from a cache refreshed only after 100 ms without a read, so two reads
# closer together see the same snapshot; a page polled every few seconds always gets a fresh one.
SERVER_SQL = """
    SELECT (SELECT COUNT FROM information_schema.INNODB_METRICS
            WHERE NAME = 'trx_rseg_history_len' AND {enabled}),
           o.trx_mysql_thread_id, o.age, o.trx_state
    FROM (SELECT 1) AS one
    LEFT JOIN (
        SELECT trx_mysql_thread_id, UNIX_TIMESTAMP(NOW(6)) - UNIX_TIMESTAMP(trx_started) AS age, trx_state
        FROM information_schema.INNODB_TRX
        WHERE trx_mysql_thread_id <> CONNECTION_ID()
        ORDER BY trx_started, trx_id
        LIMIT 1
    ) AS o ON 1
"""


def innodb_table_health(conn: BaseDatabaseWrapper, max_xact_age: float, table: str) -> InnoDBTableHealth | None:
    """Health of `table` on a MySQL-family connection; None when the table does not exist
    (not migrated yet), as on PostgreSQL."""
    enabled = "ENABLED = 1" if conn.mysql_is_mariadb else "STATUS = 'enabled'"
    with conn.cursor() as cursor:
        cursor.execute(STATS_SQL, [table])
        row = cursor.fetchone()
        if row is None:
            return None
        # A failed statement on MySQL/MariaDB rolls back only itself, not the surrounding
        # transaction (unlike PostgreSQL), so catching the error leaves a caller's atomic() usable.
        try:
            cursor.execute(SERVER_SQL.format(enabled=enabled))
            server = cursor.fetchone()
        except DatabaseError:  # no PROCESS privilege: neither figure is known
            server = None
    history, thread_id, age, state = server or (None, None, None, None)
    return InnoDBTableHealth(
        table=table,
        # NULL for a table the engine cannot open (a view, a broken .ibd): read as 0
        estimated_rows=int(row[0] or 0),
        data_bytes=int(row[1] or 0),
        index_bytes=int(row[2] or 0),
        free_bytes=int(row[3] or 0),
        history_list_length=int(history) if history is not None else None,
        oldest_transaction=InnoDBTransaction(
            thread_id=int(thread_id),
            age_seconds=max(float(age), 0.0),  # never below 0, should the server's clock step back
            state=state or "",
        )
        if thread_id is not None
        else None,
        transactions_visible=server is not None,
        max_xact_age=max_xact_age,
    )
