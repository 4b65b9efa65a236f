"""The raw statements of enqueue and the worker loop, named per operation, with an explicit
branch per database (periodic, prune, tablehealth and the listener run a few of their own).

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
    "id, task_path, queue, priority, args, kwargs, scheduled_for, enqueued_at, started_at,"
    " attempts, max_attempts, fence, is_async, run_after"
)


@dataclass(slots=True)
class Claimed:
    id: uuid.UUID
    task_path: str
    queue: str
    priority: int
    args_json: str
    kwargs_json: str
    scheduled_for: datetime | None  # the run_after it was enqueued with
    enqueued_at: datetime
    started_at: datetime | None  # when its first attempt's body started
    attempts: int
    max_attempts: int
    fence: int
    is_async: bool  # as recorded at enqueue
    run_after: datetime  # when it became due (claim order)

    @property
    def key(self) -> tuple[uuid.UUID, int]:
        """This claim: a worker can hold an old and a new run of one task after a rescue,
        so everything in flight is keyed by (id, fence), never by the id alone."""
        return (self.id, self.fence)


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
    is_async: bool = False
    scheduled_for: datetime | None = None
    unique_key: str | None = None  # ox.flow.unique
    unique_states: int = 0
    unique_until: datetime | None = None
    limit_key: str | None = None  # ox.flow.limits


@dataclass(slots=True)
class Completion:
    id: uuid.UUID
    fence: int
    return_json: str
    started_at: datetime
    finished_at: datetime


@dataclass(slots=True)
class Failure:
    id: uuid.UUID
    fence: int
    attempt: int
    worker_id: str
    started_at: datetime | None  # None: its body never started
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


def _read_opt_ts(value: object) -> datetime | None:
    return None if value is None else _read_ts(value)


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
    # Inside the caller's atomic() (Django code calling ox.sql): a savepoint of it.
    nested = conn.in_atomic_block
    with conn.cursor() as cursor:
        cursor.execute("SAVEPOINT ox_sql" if nested else "BEGIN" if is_postgres(conn) else "BEGIN IMMEDIATE")
        try:
            yield cursor
        except BaseException:
            cursor.execute("ROLLBACK TO SAVEPOINT ox_sql" if nested else "ROLLBACK")
            raise
        cursor.execute("RELEASE SAVEPOINT ox_sql" if nested else "COMMIT")


@dataclass(slots=True)
class ClaimSql:
    """A claim as parts, so complete_and_claim can put its picks beside the completion."""

    picks: list[str]  # CTEs choosing ids, one per kind asked for (PostgreSQL)
    pick_params: list[object]
    update: str  # the UPDATE ... RETURNING, reading the picks
    update_params: list[object]


Levels = dict[tuple[str, int], list[int]]  # (queue, is_async) -> priorities waiting, highest first


def _distinct(queues: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(queues))


def _candidates(limit: int) -> int:
    """Unlocked candidates read per priority and queue: some beyond `limit`, so that a claim
    racing another for the same first rows still finds rows nobody holds."""
    return 2 * limit + 8


# Queues the claim for unlimited queues leaves alone: paused ones, and ones with limits set at
# run time (ox_queue.limited; ox.flow.gate claims from those). One primary key probe each.
_SKIP_QUEUE = "NOT EXISTS (SELECT 1 FROM ox_queue s WHERE s.name = l.queue AND (s.paused OR s.limited))"
_SKIP_PAUSED = "NOT EXISTS (SELECT 1 FROM ox_queue s WHERE s.name = l.queue AND s.paused)"

# gate: which queues limited at run time a claim may take from: all (True: ox.flow.gate),
# none (False), or the ones named (the slotted queues whose slots the worker holds).
Gate = bool | Sequence[str]


def _skip(gate: Gate) -> tuple[str, list[object]]:
    if gate is True:
        return _SKIP_PAUSED, []
    if not gate:
        return _SKIP_QUEUE, []
    allowed = list(gate)
    marks = ", ".join(["%s"] * len(allowed))
    text = (
        "NOT EXISTS (SELECT 1 FROM ox_queue s WHERE s.name = l.queue"
        f" AND (s.paused OR (s.limited AND l.queue NOT IN ({marks}))))"
    )
    return text, allowed


def candidates_sql(
    flag: str, queues: Sequence[str], now: object, k: int, limit: int, columns: str = "c.id", gate: Gate = False
) -> tuple[str, list[object]]:
    """PostgreSQL: due READY tasks of one kind in these queues, in claim order, read without
    locks from the READY index: per queue a recursive query steps through the priorities
    present (one index probe each: max(priority) below the last), and for each priority a
    range scan of the due rows (run_after <= now) reads up to k. Stepping by priority is
    what keeps tasks scheduled for later at a higher priority from being read on every
    claim. gate: for ox.flow.gate (run-time limited queues included, paused ones not)."""
    ready = f"FROM ox_task t WHERE t.status = 'READY' AND t.queue = l.queue AND t.is_async = {flag}"
    starts = " UNION ALL ".join("SELECT CAST(%s AS text)" for _q in queues)
    skip, skip_params = _skip(gate)
    sql = (
        "WITH RECURSIVE levels(queue, priority) AS ("
        f"SELECT l.queue, (SELECT max(t.priority) {ready}) FROM ({starts}) AS l(queue) WHERE {skip}"
        f" UNION ALL SELECT l.queue, (SELECT max(t.priority) {ready} AND t.priority < l.priority)"
        " FROM levels l WHERE l.priority IS NOT NULL"
        f") SELECT {columns} FROM levels l CROSS JOIN LATERAL ("
        f"SELECT t.id, t.run_after, t.queue, t.limit_key {ready} AND t.priority = l.priority AND t.run_after <= %s"
        " ORDER BY t.run_after, t.id LIMIT %s) AS c"
        " WHERE l.priority IS NOT NULL ORDER BY l.priority DESC, c.run_after, c.id LIMIT %s"
    )
    return sql, [*queues, *skip_params, now, k, limit]


def _pick_sql(
    flag: str, queues: Sequence[str], now: object, limit: int, gate: Gate = False
) -> tuple[str, list[object]]:
    """PostgreSQL: the ids of up to `limit` due READY tasks of one kind in these queues, in
    claim order (candidates_sql), so that what a claim costs does not depend on how many
    tasks wait. Candidates are read without locks; only the best `limit` of them are locked,
    in claim order, skipping any another worker holds (SKIP LOCKED: workers never wait for
    each other, and a row taken meanwhile fails the status re-check). So a claim locks no
    more than it takes, and a concurrent claim is never kept from rows nobody will claim."""
    k = _candidates(limit)
    candidates, params = candidates_sql(flag, queues, now, k, k, gate=gate)
    sql = (
        f"SELECT w.id FROM ox_task w WHERE w.id IN ({candidates}) AND w.status = 'READY'"
        " ORDER BY w.priority DESC, w.run_after, w.id LIMIT %s FOR UPDATE SKIP LOCKED"
    )
    return sql, [*params, limit]


def _sqlite_pick(
    conn: BaseDatabaseWrapper, flag: int, queues: Sequence[str], levels: "Levels", now: object, limit: int
) -> list[object]:
    """SQLite, inside the claim's IMMEDIATE transaction (nothing to lock, one writer): the
    ids of up to `limit` due READY tasks of one kind, in claim order. Priorities from the
    highest down; per priority one range scan of the READY index per queue that has it,
    merged here; it stops as soon as `limit` are found. Statements cost no round trip."""
    chosen: list[object] = []
    priorities = sorted({p for q in queues for p in levels.get((q, flag), [])}, reverse=True)
    with conn.cursor() as cursor:
        for priority in priorities:
            need = limit - len(chosen)
            found: list[tuple[datetime, str, object]] = []
            for queue in queues:
                if priority not in levels.get((queue, flag), []):
                    continue
                cursor.execute(
                    "SELECT run_after, id FROM ox_task WHERE status = 'READY' AND queue = %s AND is_async = %s"
                    " AND priority = %s AND run_after <= %s ORDER BY run_after, id LIMIT %s",
                    [queue, flag, priority, now, need],
                )
                found += [(_read_ts(r[0]), str(r[1]), r[1]) for r in cursor.fetchall()]
            found.sort()  # run_after, then id
            chosen += [raw for _at, _id, raw in found[:need]]
            if len(chosen) >= limit:
                break
    return chosen


def _claim_parts(
    conn: BaseDatabaseWrapper,
    worker_id: str,
    queues: Sequence[str],
    limits: tuple[int, int],
    now: datetime,
    lease_expires_at: datetime,
    gate: Gate = False,
) -> ClaimSql:
    """PostgreSQL. limits: how many sync and how many async tasks to claim. Each kind is
    picked by its own scans of the READY index (_pick_sql), so a worker never claims tasks
    of a kind it has no free slot for. started_at and last_attempted_at are left to the
    first write after the body starts: a claimed task that has not started reads as READY
    (ox.results)."""
    kinds = [(flag, limit) for flag, limit in zip(("false", "true"), limits, strict=True) if limit > 0]
    picks = [_pick_sql(flag, _distinct(queues), now, limit, gate) for flag, limit in kinds]
    ctes = [f"pick_{flag} AS ({pick})" for (flag, _limit), (pick, _params) in zip(kinds, picks, strict=True)]
    pick_params: list[object] = [p for _pick, params in picks for p in params]
    ids = " UNION ALL ".join(f"SELECT id FROM pick_{flag}" for flag, _limit in kinds)
    update = f"{_SET_RUNNING} WHERE id IN ({ids}) RETURNING {CLAIM_COLUMNS}"
    return ClaimSql(ctes, pick_params, update, [worker_id, lease_expires_at])


_SET_RUNNING = (
    "UPDATE ox_task SET status = 'RUNNING', attempts = attempts + 1, worker_id = %s,"
    " lease_expires_at = %s, fence = fence + 1, last_attempted_at = NULL"
)


def _read_claimed(rows: Iterable[Sequence[Any]]) -> list[Claimed]:
    claimed = [
        Claimed(
            id=_read_id(r[0]),
            task_path=r[1],
            queue=r[2],
            priority=r[3],
            args_json=_read_json_text(r[4]),
            kwargs_json=_read_json_text(r[5]),
            scheduled_for=_read_opt_ts(r[6]),
            enqueued_at=_read_ts(r[7]),
            started_at=_read_opt_ts(r[8]),
            attempts=r[9],
            max_attempts=r[10],
            fence=r[11],
            is_async=bool(r[12]),
            run_after=_read_ts(r[13]),
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
    limits: int | tuple[int, int],
    now: datetime,
    lease_expires_at: datetime,
    gate: Gate = False,
) -> list[Claimed]:
    """Claim due READY tasks in priority order, in one statement: `limits` sync and async
    tasks (an int: that many of each kind). gate: queues limited at run time are claimed
    too (ox.flow.slots: the caller holds their slots); paused ones never are."""
    limits = (limits, limits) if isinstance(limits, int) else limits
    if max(limits) <= 0 or not queues:
        return []
    if not is_postgres(conn):
        with transaction(conn):
            return _claim_sqlite(conn, worker_id, queues, limits, now, lease_expires_at, gate)
    parts = _claim_parts(conn, worker_id, queues, limits, now, lease_expires_at, gate)
    with conn.cursor() as cursor:
        cursor.execute(f"WITH {', '.join(parts.picks)} {parts.update}", [*parts.pick_params, *parts.update_params])
        return _read_claimed(cursor.fetchall())


def _claim_sqlite(
    conn: BaseDatabaseWrapper,
    worker_id: str,
    queues: Sequence[str],
    limits: tuple[int, int],
    now: datetime,
    lease_expires_at: datetime,
    gate: Gate = False,
) -> list[Claimed]:
    """SQLite, inside the caller's IMMEDIATE transaction: the priorities waiting, the picks
    (_sqlite_pick), then one UPDATE of the ids picked."""
    queues = _distinct(queues)
    if not queues:
        return []
    levels = _sqlite_levels(conn, queues, gate)
    ts = _ts(conn, now)
    ids = [
        i for flag, limit in enumerate(limits) if limit > 0 for i in _sqlite_pick(conn, flag, queues, levels, ts, limit)
    ]
    if not ids:
        return []
    with conn.cursor() as cursor:
        cursor.execute(
            f"{_SET_RUNNING} WHERE id IN (SELECT value FROM json_each(%s)) AND status = 'READY'"
            f" RETURNING {CLAIM_COLUMNS}",
            [worker_id, _ts(conn, lease_expires_at), json.dumps(ids)],
        )
        return _read_claimed(cursor.fetchall())


def complete_and_claim(
    conn: BaseDatabaseWrapper,
    done: Sequence["Completion"],
    worker_id: str,
    queues: Sequence[str],
    limits: tuple[int, int],
    now: datetime,
    lease_expires_at: datetime,
    gate: Gate = False,
) -> tuple[set[tuple[uuid.UUID, int]], list[Claimed]]:
    """Write finished tasks and claim the next ones in one round trip and one commit (on
    PostgreSQL one statement; on SQLite, whose statements cost no round trip, one
    transaction). Returns the claims written (the rest were fenced out) and the claimed.
    gate: as for claim()."""
    if not done:
        return set(), claim(conn, worker_id, queues, limits, now, lease_expires_at, gate)
    if max(limits) <= 0 or not queues:
        return complete(conn, done), []
    if not is_postgres(conn):
        with transaction(conn):
            return complete(conn, done), _claim_sqlite(conn, worker_id, queues, limits, now, lease_expires_at, gate)
    complete_sql, complete_params = _complete_sql(conn, done)
    parts = _claim_parts(conn, worker_id, queues, limits, now, lease_expires_at, gate)
    # The completion's rows share the claim's columns: id first, fence at its place.
    nulls = ", ".join(["NULL"] * 10)
    sql = (
        f"WITH done AS ({complete_sql}), {', '.join(parts.picks)}, claimed AS ({parts.update})"
        f" SELECT true, {CLAIM_COLUMNS} FROM claimed UNION ALL SELECT false, id, {nulls}, fence, NULL, NULL FROM done"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [*complete_params, *parts.pick_params, *parts.update_params])
        rows = cursor.fetchall()
    written = {(_read_id(r[1]), int(r[12])) for r in rows if not r[0]}
    return written, _read_claimed(r[1:] for r in rows if r[0])


_LEVEL_READY = "FROM ox_task t WHERE t.status = 'READY' AND t.queue = l.queue AND t.is_async = l.is_async"


def _levels_cte(queues: Sequence[str], flags: Sequence[str], gate: Gate = False) -> tuple[str, list[object]]:
    """`levels(queue, is_async, priority)`: per queue and kind, every priority of a READY task
    there, found by stepping from one to the next lower (one probe of the READY index each)
    instead of reading the tasks. Rows with a NULL priority end each walk. Paused queues
    (and unless `gate`, queues limited at run time) are left out."""
    starts = " UNION ALL ".join(f"SELECT CAST(%s AS text), {flag}" for _q in queues for flag in flags)
    skip, skip_params = _skip(gate)
    sql = (
        f"pairs(queue, is_async) AS ({starts}), levels(queue, is_async, priority) AS ("
        f"SELECT l.queue, l.is_async, (SELECT max(t.priority) {_LEVEL_READY}) FROM pairs l WHERE {skip}"
        f" UNION ALL SELECT l.queue, l.is_async, (SELECT max(t.priority) {_LEVEL_READY} AND t.priority < l.priority)"
        " FROM levels l WHERE l.priority IS NOT NULL)"
    )
    return sql, [*(q for q in queues for _flag in flags), *skip_params]


def earliest_ready(
    conn: BaseDatabaseWrapper, queues: Sequence[str], kinds: tuple[bool, bool] = (True, True), gate: Gate = False
) -> datetime | None:
    """When the next READY task in these queues becomes due (None: none waiting); kinds:
    whether to look at (sync, async) tasks, the ones the worker has room to claim.

    The READY index is ordered by priority before run_after, so MIN(run_after) over it is a
    scan of the whole backlog. Instead the first run_after of each priority present is
    taken (_levels_cte): the cost grows with the number of distinct priorities waiting (a
    handful; at most 201), never with the number of tasks."""
    pg = is_postgres(conn)
    flags = [flag for flag, wanted in zip(("false", "true") if pg else ("0", "1"), kinds, strict=True) if wanted]
    queues = _distinct(queues)
    if not flags or not queues:
        return None
    levels, params = _levels_cte(queues, flags, gate)
    sql = (
        f"WITH RECURSIVE {levels} SELECT min((SELECT min(t.run_after) {_LEVEL_READY} AND t.priority = l.priority))"
        " FROM levels l WHERE l.priority IS NOT NULL"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return _read_ts(row[0]) if row and row[0] is not None else None


def _sqlite_levels(
    conn: BaseDatabaseWrapper, queues: Sequence[str], gate: Gate = False
) -> dict[tuple[str, int], list[int]]:
    """(queue, is_async) -> the priorities of its READY tasks, highest first."""
    levels, params = _levels_cte(queues, ("0", "1"), gate)
    out: dict[tuple[str, int], list[int]] = {}
    with conn.cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE {levels} SELECT queue, is_async, priority FROM levels WHERE priority IS NOT NULL",
            params,
        )
        for queue, flag, priority in cursor.fetchall():
            out.setdefault((queue, int(flag)), []).append(int(priority))
    for found in out.values():
        found.sort(reverse=True)
    return out


# Constants stay in the text; the READY row's other columns take their model defaults.
_INSERT_COLUMNS = (
    "id, task_path, queue, priority, status, args, kwargs, run_after, enqueued_at,"
    " attempts, max_attempts, worker_id, fence, cancel_requested, is_async, scheduled_for,"
    " unique_key, unique_states, unique_until, limit_key"
)

# ox.models.UNIQUE_HELD as SQL: the rows that hold their unique key.
# The finished rows whose unique_states keep the key (bits 1 SUCCESSFUL, 2 FAILED, 4 CANCELLED).
HELD_FINISHED = (
    "(status = 'SUCCESSFUL' AND unique_states IN (1, 3, 5, 7))"
    " OR (status = 'FAILED' AND unique_states IN (2, 3, 6, 7))"
    " OR (status = 'CANCELLED' AND unique_states IN (4, 5, 6, 7))"
)
UNIQUE_HELD = f"unique_key IS NOT NULL AND (status IN ('READY', 'RUNNING') OR {HELD_FINISHED})"


def _one_row(conn: BaseDatabaseWrapper, r: NewTask) -> tuple[str, list[object]]:
    false = "false" if is_postgres(conn) else "0"
    sql = (
        f"INSERT INTO ox_task ({_INSERT_COLUMNS})"
        f" VALUES (%s, %s, %s, %s, 'READY', %s, %s, %s, %s, 0, %s, '', 0, {false}, %s, %s, %s, %s, %s, %s)"
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
        r.is_async,
        _ts(conn, r.scheduled_for),
        r.unique_key,
        r.unique_states,
        _ts(conn, r.unique_until),
        r.limit_key,
    ]
    return sql, params


def insert_unique(conn: BaseDatabaseWrapper, row: NewTask) -> bool:
    """Insert a unique task unless its key is held (ox_task_unique): True if inserted. ON
    CONFLICT DO NOTHING, so a duplicate neither raises nor, on PostgreSQL, aborts the
    caller's transaction; a concurrent insert of the same key waits for that one to commit
    or roll back, so exactly one of them inserts."""
    sql, params = _one_row(conn, row)
    with conn.cursor() as cursor:
        # The row count says whether it went in (no RETURNING to fetch: cheaper on both).
        cursor.execute(f"{sql} ON CONFLICT DO NOTHING", params)
        return cursor.rowcount == 1


def holder_of(conn: BaseDatabaseWrapper, key: str) -> uuid.UUID | None:
    """The task that holds a unique key now, if any."""
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT id FROM ox_task WHERE unique_key = %s AND {UNIQUE_HELD}", [key])
        row = cursor.fetchone()
    return None if row is None else _read_id(row[0])


def insert_tasks(conn: BaseDatabaseWrapper, rows: Sequence[NewTask]) -> None:
    """Insert READY tasks in one statement (written out: compiling the ORM's INSERT costs
    more than the round trip). Many rows travel as one JSON document. Unique tasks go
    through insert_unique, one by one."""
    if not rows:
        return
    pg = is_postgres(conn)
    if len(rows) == 1:
        sql, params = _one_row(conn, rows[0])
    elif pg:
        _copy_tasks(conn, rows)
        return
    else:
        x = [f"json_extract(value, '$[{i}]')" for i in range(15)]
        sql = (
            f"INSERT INTO ox_task ({_INSERT_COLUMNS})"
            f" SELECT {x[0]}, {x[1]}, {x[2]}, {x[3]}, 'READY', {x[4]}, {x[5]}, {x[6]}, {x[7]}, 0, {x[8]}, '', 0, 0,"
            f" {x[9]}, {x[10]}, {x[11]}, {x[12]}, {x[13]}, {x[14]} FROM json_each(%s)"
        )
        payload = [
            [r.id.hex, r.task_path, r.queue, r.priority, r.args, r.kwargs]
            + [_ts(conn, r.run_after), _ts(conn, r.enqueued_at), r.max_attempts, int(r.is_async)]
            + [_ts(conn, r.scheduled_for), r.unique_key, r.unique_states, _ts(conn, r.unique_until), r.limit_key]
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
            f"\t{run_after}\t{enqueued_at}\t0\t{r.max_attempts}\t\t0\tf\t{'t' if r.is_async else 'f'}"
            f"\t{r.scheduled_for.isoformat() if r.scheduled_for else '\\N'}"
            f"\t{_copy_field(r.unique_key) if r.unique_key else '\\N'}\t{r.unique_states}"
            f"\t{r.unique_until.isoformat() if r.unique_until else '\\N'}"
            f"\t{_copy_field(r.limit_key) if r.limit_key is not None else '\\N'}\n"
        )
    with conn.cursor() as cursor:
        with cursor.cursor.copy(f"COPY ox_task ({_INSERT_COLUMNS}) FROM STDIN") as copy:
            copy.write("".join(lines))


def _complete_sql(conn: BaseDatabaseWrapper, done: Sequence[Completion]) -> tuple[str, list[object]]:
    if is_postgres(conn):
        # One JSON document rather than arrays: building it is a string join, where adapting
        # arrays element by element costs the worker more CPU than the task.
        sql = (
            "UPDATE ox_task AS t SET status = 'SUCCESSFUL', return_value = v.rv,"
            " finished_at = v.at, lease_expires_at = NULL,"
            " started_at = COALESCE(t.started_at, v.st), last_attempted_at = v.st"
            " FROM jsonb_to_recordset(%s::jsonb) AS v(id uuid, fence bigint, rv jsonb, st timestamptz, at timestamptz)"
            " WHERE t.id = v.id AND t.fence = v.fence AND t.status = 'RUNNING' RETURNING t.id, t.fence"
        )
        rows = ",".join(
            f'{{"id":"{d.id}","fence":{d.fence},"rv":{d.return_json},'
            f'"st":"{d.started_at.isoformat()}","at":"{d.finished_at.isoformat()}"}}'
            for d in done
        )
        return sql, [f"[{rows}]"]
    sql = (
        "UPDATE ox_task SET status = 'SUCCESSFUL', return_value = json_extract(v.value, '$[2]'),"
        " finished_at = json_extract(v.value, '$[4]'), lease_expires_at = NULL,"
        " started_at = COALESCE(ox_task.started_at, json_extract(v.value, '$[3]')),"
        " last_attempted_at = json_extract(v.value, '$[3]')"
        " FROM json_each(%s) AS v"
        " WHERE ox_task.id = json_extract(v.value, '$[0]') AND ox_task.fence = json_extract(v.value, '$[1]')"
        " AND ox_task.status = 'RUNNING' RETURNING ox_task.id, ox_task.fence"
    )
    payload = [[d.id.hex, d.fence, d.return_json, _ts(conn, d.started_at), _ts(conn, d.finished_at)] for d in done]
    return sql, [json.dumps(payload)]


def complete(conn: BaseDatabaseWrapper, done: Sequence[Completion]) -> set[tuple[uuid.UUID, int]]:
    """Mark tasks SUCCESSFUL in one statement; returns the claims written (the rest were
    fenced out)."""
    if not done:
        return set()
    sql, params = _complete_sql(conn, done)
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return {(_read_id(r[0]), int(r[1])) for r in cursor.fetchall()}


def fail(conn: BaseDatabaseWrapper, failure: Failure) -> str | None:
    """Record a failed attempt and send the task back to READY (retry_at) or to its final
    status; a cancel requested while it ran ends it CANCELLED instead of a retry. Returns
    the status written, or None when fenced out (nothing is written)."""
    if failure.retry_at is not None:
        status = "READY"
    elif failure.outcome == "cancelled":
        status = "CANCELLED"
    else:
        status = "FAILED"
    finished_at = None if status == "READY" else failure.finished_at
    run_after = failure.retry_at or failure.finished_at
    ts_done = _ts(conn, failure.finished_at)
    with transaction(conn) as cursor:
        cursor.execute(
            "UPDATE ox_task SET status = CASE WHEN cancel_requested THEN 'CANCELLED' ELSE %s END,"
            " run_after = %s, finished_at = CASE WHEN cancel_requested THEN %s ELSE %s END,"
            " lease_expires_at = NULL, started_at = COALESCE(started_at, %s), last_attempted_at = %s"
            " WHERE id = %s AND fence = %s AND status = 'RUNNING' RETURNING status",
            [
                status,
                _ts(conn, run_after),
                ts_done,
                _ts(conn, finished_at),
                _ts(conn, failure.started_at),
                _ts(conn, failure.started_at),
                _id(conn, failure.id),
                failure.fence,
            ],
        )
        row = cursor.fetchone()
        if row is None:
            return None
        cursor.execute(
            "INSERT INTO ox_attempt (task_id, number, worker_id, started_at, finished_at, outcome,"
            " exception_class_path, traceback) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [
                _id(conn, failure.id),
                failure.attempt,
                failure.worker_id,
                _ts(conn, failure.started_at),
                ts_done,
                failure.outcome,
                failure.exception_class_path,
                failure.traceback,
            ],
        )
    return str(row[0])


def _keys_param(
    conn: BaseDatabaseWrapper, held: Sequence[tuple[uuid.UUID, int, datetime | None]]
) -> tuple[str, list[object]]:
    """(id, fence, started_at) rows as one JSON document the statement reads as a table."""
    if is_postgres(conn):
        rows = ",".join(
            f'{{"id":"{i}","fence":{f},"st":{json.dumps(st.isoformat()) if st else "null"}}}' for i, f, st in held
        )
        return ("jsonb_to_recordset(%s::jsonb) AS v(id uuid, fence bigint, st timestamptz)", [f"[{rows}]"])
    payload = [[i.hex, f, _ts(conn, st) if st else None] for i, f, st in held]
    return (
        "(SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS fence,"
        " json_extract(value, '$[2]') AS st FROM json_each(%s)) AS v",
        [json.dumps(payload)],
    )


def renew(
    conn: BaseDatabaseWrapper,
    held: Sequence[tuple[uuid.UUID, int, datetime | None]],
    lease_expires_at: datetime,
) -> dict[tuple[uuid.UUID, int], bool]:
    """Extend the leases this worker still holds, in one statement, and record when bodies
    started since the last write (started_at None: not started, or already recorded).
    Returns {(id, fence): cancel_requested} for each lease kept; a claim missing from it
    was fenced out."""
    if not held:
        return {}
    source, params = _keys_param(conn, held)
    t = "t" if is_postgres(conn) else "ox_task"
    sql = (
        f"UPDATE ox_task{' AS t' if t == 't' else ''} SET lease_expires_at = %s,"
        f" started_at = COALESCE({t}.started_at, v.st), last_attempted_at = COALESCE(v.st, {t}.last_attempted_at)"
        f" FROM {source} WHERE {t}.id = v.id AND {t}.fence = v.fence AND {t}.status = 'RUNNING'"
        f" RETURNING {t}.id, {t}.fence, {t}.cancel_requested"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [_ts(conn, lease_expires_at), *params])
        return {(_read_id(r[0]), int(r[1])): bool(r[2]) for r in cursor.fetchall()}


def hand_back(conn: BaseDatabaseWrapper, held: Sequence[tuple[uuid.UUID, int]], now: datetime) -> int:
    """Return claimed-but-unstarted tasks to READY without spending an attempt (CANCELLED if
    a cancel was requested meanwhile)."""
    if not held:
        return 0
    source, params = _keys_param(conn, [(i, f, None) for i, f in held])
    t = "t" if is_postgres(conn) else "ox_task"
    sql = (
        f"UPDATE ox_task{' AS t' if t == 't' else ''} SET"
        f" status = CASE WHEN {t}.cancel_requested THEN 'CANCELLED' ELSE 'READY' END,"
        f" finished_at = CASE WHEN {t}.cancel_requested THEN %s END,"
        f" attempts = {t}.attempts - 1, fence = {t}.fence + 1, lease_expires_at = NULL, worker_id = ''"
        f" FROM {source} WHERE {t}.id = v.id AND {t}.fence = v.fence AND {t}.status = 'RUNNING'"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [_ts(conn, now), *params])
        return cursor.rowcount


def attempt_history(conn: BaseDatabaseWrapper, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[tuple[str, str, str]]]:
    """Earlier attempts of claimed tasks: id -> [(exception class path, traceback, worker id)]."""
    if not ids:
        return {}
    marks = ", ".join(["%s"] * len(ids))
    out: dict[uuid.UUID, list[tuple[str, str, str]]] = {}
    with conn.cursor() as cursor:
        cursor.execute(
            "SELECT task_id, exception_class_path, traceback, worker_id FROM ox_attempt"
            f" WHERE task_id IN ({marks}) ORDER BY task_id, number, id",
            [_id(conn, i) for i in ids],
        )
        for task_id, path, text, worker in cursor.fetchall():
            out.setdefault(_read_id(task_id), []).append((path, text, worker))
    return out


LOST_TRACEBACK = (
    "The lease of worker {worker} on this attempt expired or its process died; the rescuer took the task back."
)


def rescue(
    conn: BaseDatabaseWrapper, now: datetime, max_lost: int = 5, liveness_grace: float = 1.0
) -> list[tuple[uuid.UUID, str, str]]:
    return rescue_and_mark(conn, now, max_lost, liveness_grace)[0]


def rescue_and_mark(
    conn: BaseDatabaseWrapper, now: datetime, max_lost: int = 5, liveness_grace: float = 1.0
) -> tuple[list[tuple[uuid.UUID, str, str]], list[str]]:
    """Take back RUNNING tasks whose lease expired or whose worker died, recording a `lost`
    attempt. A lost attempt does not spend the task's budget (max_attempts grows with it):
    the worker may have died before the task even started (it may have been prefetched).
    Only a task lost `max_lost` times (it may be what kills its workers) becomes FAILED; one
    whose cancel was requested becomes CANCELLED. run_after is kept, so the task goes back
    to its place in the queue, not to the end. A dead worker's slots (ox.flow.slots) are
    freed with its tasks. One rescuer at a time. Returns (task id,
    worker id, new status) per rescued task, and the workers newly found without their lock."""
    lost_path = class_path(WorkerLost)
    if is_postgres(conn):
        # A live worker holds a session advisory lock on (LOCK_NAMESPACE, lock_key). When the
        # lock is free its connection is gone: the first look marks the worker, and a worker
        # still without its lock `liveness_grace` seconds later is dead, whatever its leases
        # say. A live worker that reconnects meanwhile takes its lock again and keeps its tasks.
        sql = f"""
            WITH holders AS (
                SELECT worker_id FROM ox_task WHERE status = 'RUNNING'
                UNION SELECT worker_id FROM ox_slot WHERE worker_id <> ''
            ), lockless AS (
                SELECT w.id, w.lock_lost_at FROM ox_worker w JOIN holders h ON h.worker_id = w.id
                WHERE w.lock_key > 0 AND NOT EXISTS (
                    SELECT 1 FROM pg_locks l
                    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
                      AND l.classid = {LOCK_NAMESPACE} AND l.objid = w.lock_key::oid
                      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
            ), marked AS (
                UPDATE ox_worker w SET lock_lost_at = %(now)s FROM lockless l
                WHERE w.id = l.id AND l.lock_lost_at IS NULL RETURNING w.id
            ), dead AS (
                SELECT id FROM lockless WHERE lock_lost_at <= %(now)s - make_interval(secs => %(grace)s)
            ), freed AS (
                UPDATE ox_slot SET worker_id = '', expires_at = NULL
                WHERE worker_id IN (SELECT id FROM dead)
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
                    status = CASE WHEN t.cancel_requested THEN 'CANCELLED'
                                  WHEN c.give_up THEN 'FAILED' ELSE 'READY' END,
                    finished_at = CASE WHEN c.give_up OR t.cancel_requested THEN %(now)s END,
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
            SELECT id, worker_id, status FROM moved UNION ALL SELECT NULL, id, 'MARKED' FROM marked
        """
        params = {"now": now, "path": lost_path, "tb": LOST_TRACEBACK, "max_lost": max_lost, "grace": liveness_grace}
        with transaction(conn) as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, RESCUER_KEY])
            if not cursor.fetchone()[0]:
                return [], []
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        return [(_read_id(r[0]), r[1], r[2]) for r in rows if r[0] is not None], [r[1] for r in rows if r[0] is None]
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
            f" status = CASE WHEN cancel_requested THEN 'CANCELLED' WHEN {lost_count} >= %s THEN 'FAILED'"
            " ELSE 'READY' END,"
            f" finished_at = CASE WHEN cancel_requested OR {lost_count} >= %s THEN %s END,"
            " max_attempts = max_attempts + 1, lease_expires_at = NULL, fence = fence + 1"
            " WHERE status = 'RUNNING' AND lease_expires_at < %s RETURNING id, worker_id, status",
            [max_lost, max_lost, ts, ts],
        )
        return [(_read_id(r[0]), r[1], r[2]) for r in cursor.fetchall()], []


def hold_worker_lock(conn: BaseDatabaseWrapper, lock_key: int) -> None:
    """PostgreSQL: hold the worker's liveness lock for the life of this session."""
    if is_postgres(conn):
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [LOCK_NAMESPACE, lock_key])


def heartbeat(conn: BaseDatabaseWrapper, worker_id: str, now: datetime, clear_idle: bool = False) -> None:
    with conn.cursor() as cursor:
        # stopped_at and lock_lost_at cleared: a rescuer may have seen this worker's lock
        # free while its connection was down; it is back. idle_since: see ox.idle.
        cursor.execute(
            "UPDATE ox_worker SET heartbeat_at = %s, stopped_at = NULL, lock_lost_at = NULL"
            + (", idle_since = NULL" if clear_idle else "")
            + " WHERE id = %s",
            [_ts(conn, now), worker_id],
        )


def mark_idle(conn: BaseDatabaseWrapper, worker_id: str, now: datetime) -> None:
    """The worker waits with free slots: enqueues of its queues notify again (ox.idle)."""
    with conn.cursor() as cursor:
        cursor.execute("UPDATE ox_worker SET idle_since = %s WHERE id = %s", [_ts(conn, now), worker_id])


@dataclass(slots=True)
class WorkerRow:
    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    lock_key: int
    now: datetime


def register_worker(conn: BaseDatabaseWrapper, row: WorkerRow) -> None:
    """The worker's ox_worker row, written on its own connection (so the main thread's
    Django connection need not stay open for the worker's life)."""
    ts = _ts(conn, row.now)
    with conn.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ox_worker (id, host, pid, queues, concurrency, lock_key, started_at, heartbeat_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",  # a retried start
            [row.id, row.host, row.pid, json.dumps(row.queues), row.concurrency, row.lock_key, ts, ts],
        )


def worker_stopped(conn: BaseDatabaseWrapper, worker_id: str, now: datetime) -> None:
    with conn.cursor() as cursor:
        cursor.execute("UPDATE ox_worker SET stopped_at = %s WHERE id = %s", [_ts(conn, now), worker_id])
