"""What only PostgreSQL can say about ox's tables, for ox_health, the metrics and the
dashboard: the queue table's bloat, vacuum, size and the oldest open transaction holding VACUUM
back (`table_health`), and the backlog counted off the READY index alone (`backlog_rows`).

A queue table churns: every finished or pruned task leaves dead row versions that only VACUUM
reclaims, and VACUUM cannot reclaim anything newer than the oldest snapshot still open in the
database, so one forgotten `idle in transaction` session bloats ox_task however well
autovacuum is tuned.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper


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


def table_health(conn: BaseDatabaseWrapper, max_xact_age: float, table: str) -> TableHealth | None:
    """Health of `table`; None when it does not exist (not migrated yet)."""
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


# The claim index is (queue, is_async, priority DESC, run_after, id) over READY rows. Its
# (queue, is_async, priority) groups are found by a loose index scan (one probe per group, not
# one row per task); within a group, due tasks are a range of run_after, so each count is an
# index-only range scan, and the outer LIMIT stops the nested loop over a queue's groups at
# cap + 1 entries: a count costs at most cap + 1 index entries plus one probe per group, however
# long the backlog. The oldest due task is the first entry of some group.
BACKLOG_SQL = """
WITH RECURSIVE grp AS (
    (SELECT queue, is_async, priority FROM ox_task WHERE status = 'READY'
     ORDER BY queue, is_async, priority DESC LIMIT 1)
    UNION ALL
    SELECT nxt.queue, nxt.is_async, nxt.priority FROM grp g CROSS JOIN LATERAL (
        (SELECT t.queue, t.is_async, t.priority FROM ox_task t
         WHERE t.status = 'READY' AND t.queue = g.queue AND t.is_async = g.is_async AND t.priority < g.priority
         ORDER BY t.priority DESC LIMIT 1)
        UNION ALL
        (SELECT t.queue, t.is_async, t.priority FROM ox_task t
         WHERE t.status = 'READY' AND t.queue = g.queue AND t.is_async > g.is_async
         ORDER BY t.is_async, t.priority DESC LIMIT 1)
        UNION ALL
        (SELECT t.queue, t.is_async, t.priority FROM ox_task t
         WHERE t.status = 'READY' AND t.queue > g.queue
         ORDER BY t.queue, t.is_async, t.priority DESC LIMIT 1)
        LIMIT 1
    ) nxt
)
SELECT q.queue,
    (SELECT count(*) FROM (
        SELECT 1 FROM grp g CROSS JOIN LATERAL (
            SELECT 1 FROM ox_task t
            WHERE t.status = 'READY' AND t.queue = g.queue AND t.is_async = g.is_async
              AND t.priority = g.priority AND t.run_after <= %(now)s
            LIMIT %(limit)s) x
        WHERE g.queue = q.queue LIMIT %(limit)s) c),
    (SELECT count(*) FROM (
        SELECT 1 FROM grp g CROSS JOIN LATERAL (
            SELECT 1 FROM ox_task t
            WHERE t.status = 'READY' AND t.queue = g.queue AND t.is_async = g.is_async
              AND t.priority = g.priority AND t.run_after > %(now)s
            LIMIT %(limit)s) x
        WHERE g.queue = q.queue LIMIT %(limit)s) c),
    (SELECT min(f.run_after) FROM grp g CROSS JOIN LATERAL (
        SELECT t.run_after FROM ox_task t
        WHERE t.status = 'READY' AND t.queue = g.queue AND t.is_async = g.is_async AND t.priority = g.priority
        ORDER BY t.run_after LIMIT 1) f
     WHERE g.queue = q.queue AND f.run_after <= %(now)s)
FROM (SELECT DISTINCT queue FROM grp) q
ORDER BY q.queue
"""


def backlog_rows(conn: BaseDatabaseWrapper, now: datetime, limit: int) -> list[tuple[Any, ...]]:
    """(queue, due, scheduled, oldest due run_after) per queue with READY tasks, each count
    stopping at `limit`, in queue order."""
    with conn.cursor() as cursor:
        cursor.execute(BACKLOG_SQL, {"now": now, "limit": limit})
        return cursor.fetchall()
