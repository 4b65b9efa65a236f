"""A database's dialect: the facts ox's statements are written with (literals, locking
clauses, what the database can do) and the small statement forms that differ, each with the
form most databases take here and a driver overriding what its database spells otherwise."""

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, ClassVar

from django.db.backends.base.base import BaseDatabaseWrapper

# Set on a connection while one of ox's own transactions is open on it (Dialect.transaction).
_OPEN = "_ox_transaction_open"


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
    vacuums: ClassVar[bool] = False  # whether ox's vacuum duty (ox.vacuum) applies
    # The server's clock (ox.clock), read now and then; "" where the database has none of
    # its own (SQLite: this machine's).
    clock_sql: ClassVar[str] = ""
    # Whether move_rows runs its pick more than once (then the pick's order must be total).
    repeats_pick: ClassVar[bool] = True
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
        """Wake whoever listens on `channel` (where the database can; elsewhere workers poll)."""

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
                cursor.execute("ROLLBACK TO SAVEPOINT ox_sql" if nested else "ROLLBACK")
                raise
            setattr(conn, _OPEN, False)
            cursor.execute("RELEASE SAVEPOINT ox_sql" if nested else "COMMIT")

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
