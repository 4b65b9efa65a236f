"""A database's dialect: the facts ox's statements are written with (literals, locking
clauses, what the database can do) and the small statement forms that differ, each with the
form most databases take here and a driver overriding what its database spells otherwise."""

import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar

from django.db import Error
from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("ox")

# Set on a connection while one of ox's own transactions is open on it (Dialect.transaction).
_OPEN = "_ox_transaction_open"
CHANNEL = "ox_task"  # PostgreSQL: the enqueue trigger's (migrations 0005, 0010, 0012)
# PostgreSQL: a payload of this mark and a queue name says the queue's state changed (paused,
# resumed, limits set), not that a task was enqueued (ox.flow.queues, Dialect.notify_state).
STATE_MARK = "\x1e"
_AFTER = "_ox_after_commit"  # key -> what runs once that transaction commits
_ON_COMMIT = "_ox_on_commit"  # (key, savepoint level) -> what was last given to Django's on_commit


DEADLOCK_TRIES = 10  # runs of a deadlock victim's transaction, at most (ox.sql, ox.db.mysql)
# And for at most this long (seconds, from the first deadlock): PostgreSQL finds a deadlock only
# deadlock_timeout (1 s by default) into a lock wait, and the worker's loop, heartbeat included,
# waits for these runs; past this the error goes to the worker's reconnect path (ox.sql).
DEADLOCK_BUDGET = 5.0


def runs_again(conn: BaseDatabaseWrapper) -> bool:
    """Whether a transaction ox opens on this connection now would be the outermost: a
    deadlock victim's is then ox's to run again. Inside the caller's atomic() or another of
    ox's transactions, or with autocommit turned off by the caller (a transaction of theirs is
    open without atomic()), the victim's work is the outer transaction's and the error theirs."""
    return not conn.in_atomic_block and not getattr(conn, _OPEN, False) and conn.get_autocommit()


def after_deadlock(attempt: int) -> None:
    """Pause before a deadlock victim runs again. Victims that go again at once meet each other
    again (InnoDB: producers of one key each hold a shared lock on it and each want it
    exclusively), so on a busy machine ten quick tries could all lose: a random pause, doubling
    with the attempt up to 0.2 s, lets one of them through first."""
    time.sleep(random.uniform(0, min(0.2, 0.005 * 2**attempt)))  # noqa: S311 (not crypto)


def pending_commit(conn: BaseDatabaseWrapper, key: str, make: Callable[[], Callable[[], None]]) -> Any:
    """The callable that runs once the open transaction commits, made by `make` the first
    time `key` is asked for in that transaction or savepoint (and forgotten if it rolls
    back); None when no transaction is open (autocommit: act now). In the caller's atomic()
    it goes to Django's on_commit (robust: an error in it is logged, the commit stands)."""
    if conn.in_atomic_block:
        # One per savepoint level: what a savepoint's enqueues registered goes with it when
        # it rolls back (Django drops the callbacks made inside it).
        level = (key, tuple(conn.savepoint_ids))
        made = conn.__dict__.setdefault(_ON_COMMIT, {})
        fn = made.get(level)
        if fn is None or not any(f is fn for _sids, f, _robust in conn.run_on_commit):
            fn = made[level] = make()
            conn.on_commit(fn, robust=True)
        return fn
    if getattr(conn, _OPEN, False):
        after = conn.__dict__.setdefault(_AFTER, {})
        if key not in after:
            after[key] = make()
        return after[key]
    return None


def _run_after_commit(conn: BaseDatabaseWrapper) -> None:
    for fn in conn.__dict__.pop(_AFTER, {}).values():
        try:
            fn()
        except Exception:  # noqa: BLE001  (committed is committed; what follows is a courtesy)
            logger.exception("ox: an after-commit step failed")


class Dialect:
    vendor: ClassVar[str] = ""
    true: ClassVar[str] = "true"
    false: ClassVar[str] = "false"
    begin: ClassVar[str] = "BEGIN"
    # Row locks where the database has them ("" where one writer at a time is the lock).
    for_update: ClassVar[str] = " FOR UPDATE"
    skip_locked: ClassVar[str] = " FOR UPDATE SKIP LOCKED"
    # Whether a worker's liveness is a lock its session holds (the rescue then need not wait
    # for a lease to run out), and whether enqueues can wake workers (LISTEN/NOTIFY).
    session_locks: ClassVar[bool] = False
    notifies: ClassVar[bool] = False
    # Whether a wake-up can be lost on the way (then a short claim it led to looks again).
    lossy_wakeups: ClassVar[bool] = False
    vacuums: ClassVar[bool] = False  # whether ox's vacuum duty (ox.vacuum) applies
    # The server's clock (ox.clock), read now and then; "" where the database has none of
    # its own (SQLite: this machine's).
    clock_sql: ClassVar[str] = ""
    # Whether move_rows runs its pick more than once (then the pick's order must be total).
    repeats_pick: ClassVar[bool] = True
    # Whether complete_and_claim also joins the workflow tasks among its completions
    # (ox.workflow.join.succeeded) in its own statement; elsewhere ox.sql runs the join after
    # it, in one transaction.
    joins_in_claim: ClassVar[bool] = False
    # Whether a CTE inside a subquery may refer to the outer query's columns (ox.flow.keywalk).
    correlates_into_cte: ClassVar[bool] = True
    text_type: ClassVar[str] = "text"  # what a queue name is cast to in the walks' seeds

    # ------------------------------------------------------------------ dialect
    def id(self, value: uuid.UUID) -> object:
        return value.hex

    def ts(self, conn: BaseDatabaseWrapper, value: datetime | None) -> object:
        return conn.ops.adapt_datetimefield_value(value)

    def flag(self, value: bool | int) -> str:
        return self.true if value else self.false

    def in_list(self, values: Sequence[object]) -> tuple[str, list[object]]:
        """`IN (...)` over a list of any length as one parameter: (text, params)."""
        return "IN (SELECT value FROM json_each(%s))", [json.dumps(list(values))]

    def skip_duplicate(self, key: str) -> str:
        """What follows an INSERT's VALUES so that a row whose unique `key` exists is left
        as it is, without an error."""
        return " ON CONFLICT DO NOTHING"

    def upsert(self, conflict: Sequence[str], update: Sequence[str]) -> str:
        """What follows an INSERT's VALUES so that a row whose `conflict` columns exist
        takes the new values of `update` instead."""
        sets = ", ".join(f"{c} = excluded.{c}" for c in update)
        return f" ON CONFLICT ({', '.join(conflict)}) DO UPDATE SET {sets}"

    def notify(self, cursor: Any, channel: str, payload: str) -> None:
        """Wake the idle workers of queue `payload` once the open transaction commits (where
        the database can; elsewhere workers poll)."""

    def notify_state(self, cursor: Any, queue: str) -> None:
        """Wake the idle workers of `queue`: its pause or limits changed, so each reads its
        queues' state again before it claims (an enqueue's wake-up lets the claim go first)."""
        self.notify(cursor, CHANNEL, queue)

    def notify_idle(self, cursor: Any, channel: str, payload: str) -> None:
        """notify(), where a worker has marked itself idle (ox.idle): a busy one needs none."""
        self.notify(cursor, channel, payload)

    def listen(
        self,
        conn: BaseDatabaseWrapper,
        lock_key: int,
        queues: frozenset[str],
        wake: Callable[..., None],
        stopped: threading.Event,
        ready: Callable[[], None],
    ) -> None:
        """On this session of its own, call `ready` once listening, then `wake` whenever
        tasks of `queues` may have been enqueued, until `stopped` (ox.listener; only where
        `notifies`): `wake(enqueued=True)` where the wake-up is known to be an enqueue's, a
        plain `wake()` where it may also be a queue's state change. Raises what the session
        raises: the listener reconnects."""
        raise NotImplementedError(f"{self.vendor}: workers poll")

    def begin_read_committed(self) -> list[str]:
        """The statements that open a READ COMMITTED transaction (each statement then sees
        what others committed before it: the gate counts after its lock)."""
        return [self.begin]

    @contextmanager
    def transaction(self, conn: BaseDatabaseWrapper, read_committed: bool = False) -> Iterator[Any]:
        """A transaction on a connection left in autocommit; inside the caller's atomic()
        (Django code calling ox.sql), a savepoint of it (at the caller's isolation). Inside
        another of these (an operation that is itself a transaction, run in one, such as a
        completion in the gate's claim), the statements simply join it: a second BEGIN would
        be ignored on PostgreSQL and would commit the first on MariaDB, and a COMMIT of its
        own would end the outer one early, releasing the outer one's locks."""
        if getattr(conn, _OPEN, False):
            with conn.cursor() as cursor:
                yield cursor
            return
        nested = conn.in_atomic_block
        with conn.cursor() as cursor:
            for statement in (
                ["SAVEPOINT ox_sql"] if nested else self.begin_read_committed() if read_committed else [self.begin]
            ):
                cursor.execute(statement)
            setattr(conn, _OPEN, True)
            try:
                yield cursor
            except BaseException:
                setattr(conn, _OPEN, False)
                conn.__dict__.pop(_AFTER, None)
                try:
                    cursor.execute("ROLLBACK TO SAVEPOINT ox_sql" if nested else "ROLLBACK")
                except Error:
                    # The server already ended the transaction (InnoDB rolls back all of a
                    # deadlock victim's, savepoints and all) or the session is gone: the
                    # error that got here is the one to raise, not the rollback's. Inside
                    # the caller's atomic() Django must not write on in it (its start is
                    # gone); on our own, a session whose ROLLBACK failed is closed, so that
                    # no transaction of it stays open for the next statement to commit.
                    if nested:
                        conn.needs_rollback = True
                    else:
                        conn.close()
                raise
            setattr(conn, _OPEN, False)
            try:
                cursor.execute("RELEASE SAVEPOINT ox_sql" if nested else "COMMIT")
            except BaseException:
                conn.__dict__.pop(_AFTER, None)
                raise
        _run_after_commit(conn)

    def deadlocked(self, exc: BaseException) -> bool:
        """Whether a statement failed as a deadlock victim (its transaction rolled back)."""
        return False

    def update_returning(
        self,
        conn: BaseDatabaseWrapper,
        table: str,
        sets: str,
        set_params: Sequence[object],
        where: str,
        where_params: Sequence[object],
        columns: str,
        order: str = "",
        limit: int | None = None,
        cursor: Any = None,
    ) -> list[tuple[Any, ...]]:
        """`UPDATE table SET sets WHERE where`, and the `columns` of the rows it wrote,
        which the update must not change; with a `limit`, only that many rows in `order`
        nobody else holds (SKIP LOCKED where the database has row locks). On the caller's
        `cursor` inside its transaction, or else atomic by itself."""
        if limit is None:
            text, params = f"UPDATE {table} SET {sets} WHERE {where} RETURNING {columns}", [*set_params, *where_params]
        else:
            text = (
                f"UPDATE {table} SET {sets} WHERE id IN"
                f" (SELECT id FROM {table} WHERE {where} ORDER BY {order} LIMIT %s{self.skip_locked})"
                f" RETURNING {columns}"
            )
            params = [*set_params, *where_params, limit]
        if cursor is not None:
            cursor.execute(text, params)
            return cursor.fetchall()
        with conn.cursor() as own:  # one statement: atomic on its own
            own.execute(text, params)
            return own.fetchall()

    def insert_new(self, conn: BaseDatabaseWrapper, cursor: Any, insert: str, params: Sequence[object]) -> bool:
        """Run an `INSERT ... VALUES (...)` unless a row with one of its unique keys exists;
        whether it inserted. The caller's transaction goes on either way."""
        cursor.execute(f"{insert} ON CONFLICT DO NOTHING RETURNING 1", list(params))
        return cursor.fetchone() is not None
