"""The soak's readings: the backlog and the table's health through this process's Django connection,
the workers' RSS and CPU from /proc (scripts/soak.py)."""

import os
from pathlib import Path
from typing import Any


def vendor() -> str:
    from django.db import connection

    return connection.vendor


def pending_count() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        # Two counts, each matching a partial index (claim, lease): status IN (...) matches neither.
        cursor.execute("SELECT COUNT(*) FROM ox_task WHERE status = 'READY'")
        ready = cursor.fetchone()[0]
        cursor.execute("SELECT COUNT(*) FROM ox_task WHERE status = 'RUNNING'")
        return ready + cursor.fetchone()[0]


def table_stats() -> dict[str, int | None]:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                """SELECT s.n_dead_tup, s.autovacuum_count + s.vacuum_count, pg_relation_size(s.relid),
                          pg_indexes_size(s.relid), pg_relation_size(to_regclass('ox_task_ready_claim')),
                          pg_total_relation_size(to_regclass('ox_task_archive'))
                   FROM pg_stat_user_tables s WHERE s.relid = to_regclass('ox_task')"""
            )
            dead, vacuums, table, indexes, ready, archive = cursor.fetchone()
            return dict(
                dead=dead,
                vacuums=vacuums,
                table=table,
                indexes=indexes,
                ready=ready,
                archive=archive,
                file=None,
                wal=None,
            )
        if connection.vendor == "mysql":
            return _innodb_stats(cursor)
        cursor.execute("PRAGMA page_count")
        pages = cursor.fetchone()[0]
        cursor.execute("PRAGMA page_size")
        page_size = cursor.fetchone()[0]
        cursor.execute("PRAGMA freelist_count")
        freelist = cursor.fetchone()[0]
        # dbstat (compiled into Python's SQLite here) sizes each b-tree; without it, file size only.
        sizes: dict[str, int] = {}
        try:
            cursor.execute(
                "SELECT name, SUM(pgsize) FROM dbstat WHERE name IN "
                "(SELECT name FROM sqlite_schema WHERE tbl_name = 'ox_task') GROUP BY name"
            )
            sizes = {name: int(size) for name, size in cursor.fetchall()}
            cursor.execute(
                "SELECT SUM(pgsize) FROM dbstat WHERE name IN "
                "(SELECT name FROM sqlite_schema WHERE tbl_name = 'ox_task_archive')"
            )
            archive = cursor.fetchone()[0]
        except Exception:  # noqa: BLE001  (no dbstat: report what PRAGMAs give)
            sizes, archive = {}, None
    wal = Path(str(connection.settings_dict["NAME"]) + "-wal")
    return dict(
        dead=freelist,
        vacuums=None,
        table=sizes.get("ox_task", 0),
        indexes=sum(v for k, v in sizes.items() if k != "ox_task"),
        ready=sizes.get("ox_task_ready_claim"),
        archive=None if archive is None else int(archive),
        file=pages * page_size,
        wal=wal.stat().st_size if wal.exists() else 0,
    )


def _innodb_stats(cursor: Any) -> dict[str, int | None]:
    """MariaDB: sizes from InnoDB's statistics (refreshed as the table changes, not exact);
    "dead" is the history list length, the undo records purge has yet to free (server-wide:
    what MVCC keeps of old row versions, as dead tuples are on PostgreSQL)."""
    cursor.execute(
        "SELECT table_name, data_length, index_length FROM information_schema.tables"
        " WHERE table_schema = DATABASE() AND table_name IN ('ox_task', 'ox_task_archive')"
    )
    sizes = {name: (int(data), int(index)) for name, data, index in cursor.fetchall()}
    cursor.execute(
        "SELECT SUM(stat_value) * @@innodb_page_size FROM mysql.innodb_index_stats WHERE database_name = DATABASE()"
        " AND table_name = 'ox_task' AND index_name = 'ox_task_ready_claim' AND stat_name = 'size'"
    )
    ready = cursor.fetchone()[0]
    cursor.execute("SELECT count FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'")
    history = cursor.fetchone()
    table, indexes = sizes.get("ox_task", (0, 0))
    return dict(
        dead=None if history is None else int(history[0]),
        vacuums=None,
        table=table,
        indexes=indexes,
        ready=None if ready is None else int(ready),
        archive=sum(sizes.get("ox_task_archive", (0, 0))),
        file=None,
        wal=None,
    )


def vacuum() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ox_task")  # Django's autocommit: not inside a transaction block


def server_autovacuum() -> str | None:
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        return cursor.fetchone()[0]


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    try:
        # Fields after the command (which may hold spaces, inside parentheses): utime, stime are
        # the 14th and 15th fields of the whole line.
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0
