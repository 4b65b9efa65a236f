"""Slots: a queue's concurrency limit as N leased rows (ox_slot), for queues whose only limit
is `concurrency`.

A worker leases some of the queue's slots and runs at most as many of its tasks at once as it
holds (ox.flow.local keeps the count, and parks claimed tasks beyond it); it claims them with
the ordinary claim statement, prefetch included, without taking any lock another worker waits
for. So the limit costs one cheap statement when a worker takes or gives back slots, not a
serialised transaction per claim (ox.flow.gate, still used for key limits and rates).

A slot is taken with FOR UPDATE SKIP LOCKED on rows whose own columns say it is free (empty
worker_id, or a lease run out): a row another worker took meanwhile is rechecked against its
new version by the lock (READ COMMITTED), so two workers never take the same slot, and the
sum of what they hold never exceeds the rows there are. Leases are renewed with the
heartbeat; a worker that stops gives its slots back, one that dies loses them when the rescuer
finds it dead (ox.sql.rescue_and_mark) or when their lease runs out.
"""

from collections.abc import Iterable
from datetime import datetime

from django.db.backends.base.base import BaseDatabaseWrapper

from ox import sql
from ox.db import driver


def size(conn: BaseDatabaseWrapper, queue: str, n: int) -> None:
    """Make the queue have slots 0..n-1: new rows free, free rows past n deleted. A held row
    past n stays until its holder, which stops starting tasks on it, gives it back when
    what runs on it has finished (a limit raised again meanwhile must not find it free)."""
    with sql.transaction(conn) as cursor:
        marks = ", ".join(["(%s, %s, '')"] * n)
        cursor.execute(
            f"INSERT INTO ox_slot (queue, n, worker_id) VALUES {marks}{driver(conn).skip_duplicate('n')}",
            [v for i in range(n) for v in (queue, i)],
        )
        cursor.execute("DELETE FROM ox_slot WHERE queue = %s AND n >= %s AND worker_id = ''", [queue, n])


def retire(conn: BaseDatabaseWrapper, worker_id: str, queue: str, numbers: Iterable[int], n: int) -> None:
    """Give back slots past a lowered limit n: deleted (or freed, if the limit was raised
    past them again)."""
    give_back(conn, worker_id, queue, numbers)
    with conn.cursor() as cursor:
        cursor.execute("DELETE FROM ox_slot WHERE queue = %s AND n >= %s AND worker_id = ''", [queue, n])


def take(
    conn: BaseDatabaseWrapper, worker_id: str, queue: str, want: int, now: datetime, expires_at: datetime
) -> list[int]:
    """Lease up to `want` free slots of the queue; the slot numbers taken. Fewer while tasks
    of the queue run without a slot (claimed by the gate, by a worker serving a queue the
    gate claims, or before the queue was slotted): what they use of the limit is not free."""
    if want <= 0:
        return []
    d = driver(conn)
    ts, until = d.ts(conn, now), d.ts(conn, expires_at)
    free = "(worker_id = '' OR expires_at < %s)"
    with sql.transaction(conn) as cursor:
        # What of the limit is free: free slots less the RUNNING tasks of the queue whose
        # worker holds none of its slots (ox_task_running_queue).
        cursor.execute(
            f"SELECT (SELECT count(*) FROM ox_slot WHERE queue = %s AND {free}) - (SELECT count(*) FROM ox_task t"
            " WHERE t.status = 'RUNNING' AND t.queue = %s AND NOT EXISTS (SELECT 1 FROM ox_slot h"
            " WHERE h.queue = t.queue AND h.worker_id = t.worker_id AND h.worker_id <> ''))",
            [queue, ts, queue],
        )
        n = min(want, int(cursor.fetchone()[0]))
        if n <= 0:
            return []
        # A slot another worker took since is passed over (SKIP LOCKED) or, once its lock
        # is gone, rechecked against the free condition and left: fewer taken, never more.
        rows = d.update_returning(
            conn,
            "ox_slot",
            "worker_id = %s, expires_at = %s",
            [worker_id, until],
            f"queue = %s AND {free}",
            [queue, ts],
            "n",
            order="n",
            limit=n,
            cursor=cursor,
        )
        return sorted(int(r[0]) for r in rows)


def renew(conn: BaseDatabaseWrapper, worker_id: str, expires_at: datetime) -> dict[str, set[int]]:
    """Extend this worker's leases; queue -> the slots it still holds (one taken over after
    its lease ran out, or deleted by a lower limit, is not among them)."""
    d = driver(conn)
    rows = d.update_returning(
        conn,
        "ox_slot",
        "expires_at = %s",
        [d.ts(conn, expires_at)],
        "worker_id = %s",
        [worker_id],
        "queue, n",
    )
    held: dict[str, set[int]] = {}
    for queue, n in rows:
        held.setdefault(queue, set()).add(int(n))
    return held


def give_back(conn: BaseDatabaseWrapper, worker_id: str, queue: str, numbers: Iterable[int]) -> None:
    numbers = list(numbers)
    if not numbers:
        return
    marks = ", ".join(["%s"] * len(numbers))
    with conn.cursor() as cursor:
        cursor.execute(
            "UPDATE ox_slot SET worker_id = '', expires_at = NULL"
            f" WHERE worker_id = %s AND queue = %s AND n IN ({marks})",
            [worker_id, queue, *numbers],
        )


def give_back_all(conn: BaseDatabaseWrapper, worker_id: str) -> None:
    """A stopping worker's slots, all at once; on PostgreSQL the workers waiting for one are
    told (a NOTIFY on the tasks' channel per queue), so a backlog left behind goes on at once."""
    rows = driver(conn).update_returning(
        conn, "ox_slot", "worker_id = '', expires_at = NULL", [], "worker_id = %s", [worker_id], "queue"
    )
    queues = sorted({r[0] for r in rows})
    with conn.cursor() as cursor:
        for queue in queues:
            driver(conn).notify(cursor, "ox_task", queue)
