"""One transaction on whichever connection a job was handed."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ox import sql


@contextmanager
def atomic_on(conn: BaseDatabaseWrapper) -> Iterator[Any]:
    """A transaction (or a savepoint inside the caller's) on `conn`, yielding a cursor.

    Django's own connection for the thread goes through atomic(), so a caller's atomic block
    (a command run from code, a test) nests instead of being committed under it; a worker's
    private connection (autocommit, unknown to atomic()) gets ox.sql.transaction.
    """
    if conn == connections[conn.alias]:  # also true for the django.db.connection proxy
        with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
            yield cursor
    else:
        with sql.transaction(conn) as cursor:
            yield cursor
