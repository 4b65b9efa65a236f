"""Every raw statement ox runs, named per operation, with an explicit branch per database.

The worker runs these on its own long-lived connection (ox.connection). Timestamps come from
the worker's clock and are passed in, so PostgreSQL and SQLite compare like with like.
"""

import json
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from ox.exceptions import WorkerLost, class_path

# Namespace (first key) of ox's PostgreSQL advisory locks; the second key is a worker's
# lock_key, or 0 for the rescuer.
LOCK_NAMESPACE = 0x6F78  # "ox"
RESCUER_KEY = 0

CLAIM_COLUMNS = (
    "id, task_path, queue, priority, args, kwargs, run_after, enqueued_at, started_at,"
    " last_attempted_at, attempts, max_attempts, fence"
)


@dataclass(slots=True)
class Claimed:
    id: uuid.UUID
    task_path: str
    queue: str
    priority: int
    args_json: str
    kwargs_json: str
    run_after: datetime
    enqueued_at: datetime
    started_at: datetime
    last_attempted_at: datetime
    attempts: int
    max_attempts: int
    fence: int


@dataclass(slots=True)
class NewTask:
    """A task row about to be inserted."""

    id: uuid.UUID
    task_path: str
    queue: str
    priority: int
    args: list[Any]
    kwargs: dict[str, Any]
    run_after: datetime
    enqueued_at: datetime
    max_attempts: int


@dataclass(slots=True)
class Completion:
    id: uuid.UUID
    fence: int
    return_json: str
    finished_at: datetime


@dataclass(slots=True)
class Failure:
    id: uuid.UUID
    fence: int
    attempt: int
    worker_id: str
    started_at: datetime
    finished_at: datetime
    outcome: str  # an ox.models.Outcome value
    exception_class_path: str
    traceback: str
    retry_at: datetime | None  # None: no retry, the task is finished


def is_postgres(conn: BaseDatabaseWrapper) -> bool:
    return conn.vendor == "postgresql"


def _id(conn: BaseDatabaseWrapper, value: uuid.UUID) -> object:
    return value if is_postgres(conn) else value.hex


def _ts(conn: BaseDatabaseWrapper, value: datetime | None) -> object:
    return conn.ops.adapt_datetimefield_value(value)


def _read_id(value: object) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _read_ts(value: object) -> datetime:
    if isinstance(value, datetime):
        return value if timezone.is_aware(value) else value.replace(tzinfo=timezone.UTC)
    parsed = parse_datetime(str(value))
    assert parsed is not None, f"unparseable timestamp {value!r}"
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=timezone.UTC)


def _read_json_text(value: object) -> str:
    # Django's psycopg setup loads jsonb as text, SQLite stores text: decoding (and its
    # failure) stays with the worker, per task.
    return value if isinstance(value, str) else json.dumps(value)


@contextmanager
def transaction(conn: BaseDatabaseWrapper) -> Iterator[object]:
    """A transaction on a connection left in autocommit; IMMEDIATE on SQLite so the write
    lock is taken up front."""
    with conn.cursor() as cursor:
        cursor.execute("BEGIN" if is_postgres(conn) else "BEGIN IMMEDIATE")
        try:
            yield cursor
        except BaseException:
            cursor.execute("ROLLBACK")
            raise
        cursor.execute("COMMIT")


def _claim_sql(
    conn: BaseDatabaseWrapper,
    worker_id: str,
    queues: Sequence[str],
    limit: int,
    now: datetime,
    lease_expires_at: datetime,
) -> tuple[str, list[object]]:
    if is_postgres(conn):
        sql = (
            "UPDATE ox_task SET status = 'RUNNING', attempts = attempts + 1, worker_id = %s,"
            " lease_expires_at = %s, fence = fence + 1, started_at = COALESCE(started_at, %s),"
            " last_attempted_at = %s, cancel_requested = false"
            " WHERE id IN (SELECT id FROM ox_task WHERE status = 'READY' AND queue = ANY(%s)"
            " AND run_after <= %s ORDER BY priority DESC, run_after, id LIMIT %s FOR UPDATE SKIP LOCKED)"
            f" RETURNING {CLAIM_COLUMNS}"
        )
        return sql, [worker_id, lease_expires_at, now, now, list(queues), now, limit]
    marks = ", ".join(["%s"] * len(queues))
    sql = (
        "UPDATE ox_task SET status = 'RUNNING', attempts = attempts + 1, worker_id = %s,"
        " lease_expires_at = %s, fence = fence + 1, started_at = COALESCE(started_at, %s),"
        " last_attempted_at = %s, cancel_requested = 0"
        f" WHERE id IN (SELECT id FROM ox_task WHERE status = 'READY' AND queue IN ({marks})"
        " AND run_after <= %s ORDER BY priority DESC, run_after, id LIMIT %s)"
        f" RETURNING {CLAIM_COLUMNS}"
    )
    ts = _ts(conn, now)
    return sql, [worker_id, _ts(conn, lease_expires_at), ts, ts, *queues, ts, limit]


def _read_claimed(rows: Iterable[Sequence[Any]]) -> list[Claimed]:
    claimed = [
        Claimed(
            id=_read_id(r[0]),
            task_path=r[1],
            queue=r[2],
            priority=r[3],
            args_json=_read_json_text(r[4]),
            kwargs_json=_read_json_text(r[5]),
            run_after=_read_ts(r[6]),
            enqueued_at=_read_ts(r[7]),
            started_at=_read_ts(r[8]),
            last_attempted_at=_read_ts(r[9]),
            attempts=r[10],
            max_attempts=r[11],
            fence=r[12],
        )
        for r in rows
    ]
    # RETURNING order is unspecified on both databases: restore claim order.
    claimed.sort(key=lambda c: (-c.priority, c.run_after, c.id))
    return claimed


def claim(
    conn: BaseDatabaseWrapper,
    worker_id: str,
    queues: Sequence[str],
    limit: int,
    now: datetime,
    lease_expires_at: datetime,
) -> list[Claimed]:
    """Claim up to `limit` due READY tasks in priority order, in one statement."""
    if limit <= 0:
        return []
    sql, params = _claim_sql(conn, worker_id, queues, limit, now, lease_expires_at)
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return _read_claimed(cursor.fetchall())


def complete_and_claim(
    conn: BaseDatabaseWrapper,
    done: Sequence["Completion"],
    worker_id: str,
    queues: Sequence[str],
    limit: int,
    now: datetime,
    lease_expires_at: datetime,
) -> tuple[set[uuid.UUID], list[Claimed]]:
    """Write finished tasks and claim the next ones in one round trip and one commit (on
    PostgreSQL one statement; on SQLite, whose statements cost no round trip, one
    transaction). Returns the ids written (the rest were fenced out) and the claimed."""
    if not done:
        return set(), claim(conn, worker_id, queues, limit, now, lease_expires_at)
    if limit <= 0:
        return complete(conn, done), []
    if not is_postgres(conn):
        with transaction(conn):
            return complete(conn, done), claim(conn, worker_id, queues, limit, now, lease_expires_at)
    complete_sql, complete_params = _complete_sql(conn, done)
    claim_sql, claim_params = _claim_sql(conn, worker_id, queues, limit, now, lease_expires_at)
    nulls = ", ".join(["NULL"] * 12)
    sql = (
        f"WITH done AS ({complete_sql}), claimed AS ({claim_sql})"
        f" SELECT true, {CLAIM_COLUMNS} FROM claimed UNION ALL SELECT false, id, {nulls} FROM done"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [*complete_params, *claim_params])
        rows = cursor.fetchall()
    written = {_read_id(r[1]) for r in rows if not r[0]}
    return written, _read_claimed(r[1:] for r in rows if r[0])


def earliest_ready(conn: BaseDatabaseWrapper, queues: Sequence[str]) -> datetime | None:
    """When the next READY task in these queues becomes due (None: none waiting)."""
    if is_postgres(conn):
        sql = "SELECT MIN(run_after) FROM ox_task WHERE status = 'READY' AND queue = ANY(%s)"
        params: list[object] = [list(queues)]
    else:
        marks = ", ".join(["%s"] * len(queues))
        sql = f"SELECT MIN(run_after) FROM ox_task WHERE status = 'READY' AND queue IN ({marks})"
        params = list(queues)
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return _read_ts(row[0]) if row and row[0] is not None else None


# Constants stay in the text; the READY row's other columns take their model defaults.
_INSERT_COLUMNS = (
    "id, task_path, queue, priority, status, args, kwargs, run_after, enqueued_at,"
    " attempts, max_attempts, worker_id, fence, cancel_requested"
)


def insert_tasks(conn: BaseDatabaseWrapper, rows: Sequence[NewTask]) -> None:
    """Insert READY tasks in one statement (written out: compiling the ORM's INSERT costs
    more than the round trip). Many rows travel as one JSON document."""
    if not rows:
        return
    pg = is_postgres(conn)
    false = "false" if pg else "0"
    if len(rows) == 1:
        r = rows[0]
        sql = (
            f"INSERT INTO ox_task ({_INSERT_COLUMNS})"
            f" VALUES (%s, %s, %s, %s, 'READY', %s, %s, %s, %s, 0, %s, '', 0, {false})"
        )
        params = [
            _id(conn, r.id),
            r.task_path,
            r.queue,
            r.priority,
            json.dumps(r.args),
            json.dumps(r.kwargs),
            _ts(conn, r.run_after),
            _ts(conn, r.enqueued_at),
            r.max_attempts,
        ]
    elif pg:
        _copy_tasks(conn, rows)
        return
    else:
        x = [f"json_extract(value, '$[{i}]')" for i in range(9)]
        sql = (
            f"INSERT INTO ox_task ({_INSERT_COLUMNS})"
            f" SELECT {x[0]}, {x[1]}, {x[2]}, {x[3]}, 'READY', {x[4]}, {x[5]}, {x[6]}, {x[7]}, 0, {x[8]}, '', 0, 0"
            " FROM json_each(%s)"
        )
        payload = [
            [r.id.hex, r.task_path, r.queue, r.priority, r.args, r.kwargs]
            + [_ts(conn, r.run_after), _ts(conn, r.enqueued_at), r.max_attempts]
            for r in rows
        ]
        params = [json.dumps(payload)]
    with conn.cursor() as cursor:
        cursor.execute(sql, params)


def _copy_field(value: str) -> str:
    # COPY's text format: backslash, tab and line breaks are escaped.
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return value


def _copy_tasks(conn: BaseDatabaseWrapper, rows: Sequence[NewTask]) -> None:
    """PostgreSQL bulk insert: one COPY, its rows formatted here (several times faster than
    adapting each value). COPY fires the statement-level NOTIFY trigger like an INSERT."""
    iso: dict[datetime, str] = {}  # a batch mostly shares its timestamps: format each once
    lines = []
    for r in rows:
        run_after = iso.get(r.run_after) or iso.setdefault(r.run_after, r.run_after.isoformat())
        enqueued_at = iso.get(r.enqueued_at) or iso.setdefault(r.enqueued_at, r.enqueued_at.isoformat())
        lines.append(
            f"{r.id}\t{_copy_field(r.task_path)}\t{_copy_field(r.queue)}\t{r.priority}\tREADY"
            f"\t{_copy_field(json.dumps(r.args)) if r.args else '[]'}"
            f"\t{_copy_field(json.dumps(r.kwargs)) if r.kwargs else '{}'}"
            f"\t{run_after}\t{enqueued_at}\t0\t{r.max_attempts}\t\t0\tf\n"
        )
    with conn.cursor() as cursor:
        with cursor.cursor.copy(f"COPY ox_task ({_INSERT_COLUMNS}) FROM STDIN") as copy:
            copy.write("".join(lines))


def _complete_sql(conn: BaseDatabaseWrapper, done: Sequence[Completion]) -> tuple[str, list[object]]:
    if is_postgres(conn):
        # One JSON document rather than four arrays: building it is a string join, where
        # adapting arrays element by element costs the worker more CPU than the task.
        sql = (
            "UPDATE ox_task AS t SET status = 'SUCCESSFUL', return_value = v.rv,"
            " finished_at = v.at, lease_expires_at = NULL"
            " FROM jsonb_to_recordset(%s::jsonb) AS v(id uuid, fence bigint, rv jsonb, at timestamptz)"
            " WHERE t.id = v.id AND t.fence = v.fence AND t.status = 'RUNNING' RETURNING t.id"
        )
        rows = ",".join(
            f'{{"id":"{d.id}","fence":{d.fence},"rv":{d.return_json},"at":"{d.finished_at.isoformat()}"}}' for d in done
        )
        return sql, [f"[{rows}]"]
    sql = (
        "UPDATE ox_task SET status = 'SUCCESSFUL', return_value = json_extract(v.value, '$[2]'),"
        " finished_at = json_extract(v.value, '$[3]'), lease_expires_at = NULL"
        " FROM json_each(%s) AS v"
        " WHERE ox_task.id = json_extract(v.value, '$[0]') AND ox_task.fence = json_extract(v.value, '$[1]')"
        " AND ox_task.status = 'RUNNING' RETURNING ox_task.id"
    )
    payload = [[d.id.hex, d.fence, d.return_json, _ts(conn, d.finished_at)] for d in done]
    return sql, [json.dumps(payload)]


def complete(conn: BaseDatabaseWrapper, done: Sequence[Completion]) -> set[uuid.UUID]:
    """Mark tasks SUCCESSFUL in one statement; returns the ids written (the rest were fenced out)."""
    if not done:
        return set()
    sql, params = _complete_sql(conn, done)
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return {_read_id(r[0]) for r in cursor.fetchall()}


def fail(conn: BaseDatabaseWrapper, failure: Failure) -> bool:
    """Record a failed attempt and send the task back to READY (retry_at) or to its final
    status. Returns False when fenced out: nothing is written."""
    if failure.retry_at is not None:
        status = "READY"
    elif failure.outcome == "cancelled":
        status = "CANCELLED"
    else:
        status = "FAILED"
    finished_at = None if status == "READY" else failure.finished_at
    run_after = failure.retry_at or failure.finished_at
    with transaction(conn) as cursor:
        cursor.execute(
            "UPDATE ox_task SET status = %s, run_after = %s, finished_at = %s, lease_expires_at = NULL"
            " WHERE id = %s AND fence = %s AND status = 'RUNNING'",
            [status, _ts(conn, run_after), _ts(conn, finished_at), _id(conn, failure.id), failure.fence],
        )
        if cursor.rowcount != 1:
            return False
        cursor.execute(
            "INSERT INTO ox_attempt (task_id, number, worker_id, started_at, finished_at, outcome,"
            " exception_class_path, traceback) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [
                _id(conn, failure.id),
                failure.attempt,
                failure.worker_id,
                _ts(conn, failure.started_at),
                _ts(conn, failure.finished_at),
                failure.outcome,
                failure.exception_class_path,
                failure.traceback,
            ],
        )
    return True


def _pairs_param(conn: BaseDatabaseWrapper, held: Iterable[tuple[uuid.UUID, int]]) -> tuple[str, list[object]]:
    held = list(held)
    if is_postgres(conn):
        return (
            "(SELECT * FROM unnest(%s::uuid[], %s::bigint[]) AS h(id, fence))",
            [[h[0] for h in held], [h[1] for h in held]],
        )
    return (
        "(SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS fence FROM json_each(%s))",
        [json.dumps([[h[0].hex, h[1]] for h in held])],
    )


def renew(
    conn: BaseDatabaseWrapper, held: Sequence[tuple[uuid.UUID, int]], lease_expires_at: datetime
) -> dict[uuid.UUID, bool]:
    """Extend the leases this worker still holds, in one statement. Returns {id:
    cancel_requested} for each lease kept; an id missing from it was fenced out."""
    if not held:
        return {}
    source, params = _pairs_param(conn, held)
    sql = (
        "UPDATE ox_task SET lease_expires_at = %s"
        f" WHERE status = 'RUNNING' AND (id, fence) IN (SELECT id, fence FROM {source} AS h)"
        " RETURNING id, cancel_requested"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [_ts(conn, lease_expires_at), *params])
        return {_read_id(r[0]): bool(r[1]) for r in cursor.fetchall()}


def hand_back(conn: BaseDatabaseWrapper, held: Sequence[tuple[uuid.UUID, int]]) -> int:
    """Return claimed-but-unstarted tasks to READY without spending an attempt."""
    if not held:
        return 0
    source, params = _pairs_param(conn, held)
    sql = (
        "UPDATE ox_task SET status = 'READY', attempts = attempts - 1, fence = fence + 1,"
        " lease_expires_at = NULL, worker_id = ''"
        f" WHERE status = 'RUNNING' AND (id, fence) IN (SELECT id, fence FROM {source} AS h)"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


LOST_TRACEBACK = (
    "The lease of worker {worker} on this attempt expired or its process died; the rescuer took the task back."
)


def rescue(conn: BaseDatabaseWrapper, now: datetime, max_lost: int = 5) -> list[tuple[uuid.UUID, str, str]]:
    """Take back RUNNING tasks whose lease expired or whose worker died, recording a `lost`
    attempt. A lost attempt does not spend the task's budget (max_attempts grows with it):
    the worker may have died before the task even started (it may have been prefetched).
    Only a task lost `max_lost` times (it may be what kills its workers) becomes FAILED.
    run_after is kept, so the task goes back to its place in the queue, not to the end. One
    rescuer at a time. Returns (task id, worker id, new status) per rescued task."""
    lost_path = class_path(WorkerLost)
    if is_postgres(conn):
        # A live worker holds a session advisory lock on (LOCK_NAMESPACE, lock_key): if the
        # lock is gone, its process (or connection) is gone, whatever its lease says.
        sql = f"""
            WITH holders AS (
                SELECT DISTINCT worker_id FROM ox_task WHERE status = 'RUNNING'
            ), dead AS (
                SELECT w.id FROM ox_worker w JOIN holders h ON h.worker_id = w.id
                WHERE w.lock_key > 0 AND NOT EXISTS (
                    SELECT 1 FROM pg_locks l
                    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                      AND l.classid = {LOCK_NAMESPACE} AND l.objid = w.lock_key::oid
                      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
            ), lost AS (
                SELECT t.id FROM ox_task t
                WHERE t.status = 'RUNNING'
                  AND (t.lease_expires_at < %(now)s OR t.worker_id IN (SELECT id FROM dead))
                FOR UPDATE SKIP LOCKED
            ), counted AS (
                SELECT lost.id, (SELECT count(*) FROM ox_attempt a WHERE a.task_id = lost.id AND a.outcome = 'lost')
                       + 1 >= %(max_lost)s AS give_up
                FROM lost
            ), moved AS (
                UPDATE ox_task t SET
                    status = CASE WHEN c.give_up THEN 'FAILED' ELSE 'READY' END,
                    finished_at = CASE WHEN c.give_up THEN %(now)s END,
                    max_attempts = t.max_attempts + 1, lease_expires_at = NULL, fence = t.fence + 1
                FROM counted c WHERE t.id = c.id
                RETURNING t.id, t.attempts, t.worker_id, t.last_attempted_at, t.status
            ), recorded AS (
                INSERT INTO ox_attempt (task_id, number, worker_id, started_at, finished_at, outcome,
                                        exception_class_path, traceback)
                SELECT id, attempts, worker_id, last_attempted_at, %(now)s, 'lost', %(path)s,
                       replace(%(tb)s, '{{worker}}', worker_id)
                FROM moved
            )
            SELECT id, worker_id, status FROM moved
        """
        with transaction(conn) as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, RESCUER_KEY])
            if not cursor.fetchone()[0]:
                return []
            cursor.execute(sql, {"now": now, "path": lost_path, "tb": LOST_TRACEBACK, "max_lost": max_lost})
            return [(_read_id(r[0]), r[1], r[2]) for r in cursor.fetchall()]
    # SQLite has one writer at a time: the IMMEDIATE transaction is the rescuer's lock, and
    # both statements see the same expired set.
    ts = _ts(conn, now)
    with transaction(conn) as cursor:
        cursor.execute(
            "INSERT INTO ox_attempt (task_id, number, worker_id, started_at, finished_at, outcome,"
            " exception_class_path, traceback)"
            " SELECT id, attempts, worker_id, last_attempted_at, %s, 'lost', %s, replace(%s, '{worker}', worker_id)"
            " FROM ox_task WHERE status = 'RUNNING' AND lease_expires_at < %s",
            [ts, lost_path, LOST_TRACEBACK, ts],
        )
        lost_count = "(SELECT count(*) FROM ox_attempt a WHERE a.task_id = ox_task.id AND a.outcome = 'lost')"
        cursor.execute(
            "UPDATE ox_task SET"
            f" status = CASE WHEN {lost_count} >= %s THEN 'FAILED' ELSE 'READY' END,"
            f" finished_at = CASE WHEN {lost_count} >= %s THEN %s END,"
            " max_attempts = max_attempts + 1, lease_expires_at = NULL, fence = fence + 1"
            " WHERE status = 'RUNNING' AND lease_expires_at < %s RETURNING id, worker_id, status",
            [max_lost, max_lost, ts, ts],
        )
        return [(_read_id(r[0]), r[1], r[2]) for r in cursor.fetchall()]


def hold_worker_lock(conn: BaseDatabaseWrapper, lock_key: int) -> None:
    """PostgreSQL: hold the worker's liveness lock for the life of this session."""
    if is_postgres(conn):
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [LOCK_NAMESPACE, lock_key])


def heartbeat(conn: BaseDatabaseWrapper, worker_id: str, now: datetime) -> None:
    with conn.cursor() as cursor:
        # stopped_at cleared: a rescuer may have taken this worker for dead while its
        # connection was down; it is back.
        cursor.execute(
            "UPDATE ox_worker SET heartbeat_at = %s, stopped_at = NULL WHERE id = %s", [_ts(conn, now), worker_id]
        )
