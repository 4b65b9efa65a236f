"""ox's own transactions (ox.db.dialect.Dialect.transaction) nest: an operation that is a
transaction by itself on some database (a completion on MariaDB: lock, then update) run
inside another (the gate's claim) joins it. A BEGIN of its own would commit the outer one on
MariaDB, and its COMMIT would end the outer one early, releasing the locks it holds: two
workers' gates then claimed the same tasks (found by test_attack_key_prefetch on MariaDB)."""

from datetime import timedelta

import pytest
from django.db import connection

from ox import clock, sql
from ox.db import driver
from ox.models import Status, Task
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def _claimed(n: int) -> list[sql.Claimed]:
    for i in range(n):
        tasks.echo.enqueue(i)
    now = clock.db_now(connection)
    return sql.claim(connection, "tx-worker", ["default"], (n, 0), now, now + timedelta(seconds=30))


def test_an_operation_inside_an_ox_transaction_is_rolled_back_with_it():
    (c,) = _claimed(1)
    now = clock.db_now(connection)
    with pytest.raises(Boom):
        with driver(connection).transaction(connection, read_committed=True):
            assert sql.complete(connection, [sql.Completion(c.id, c.fence, "1", now, now)]) == {(c.id, c.fence)}
            raise Boom
    assert Task.objects.get(pk=c.id).status == Status.RUNNING  # the inner write went with the outer


def test_an_operation_inside_an_ox_transaction_commits_with_it_once():
    a, b = _claimed(2)
    now = clock.db_now(connection)
    with driver(connection).transaction(connection, read_committed=True):
        sql.complete(connection, [sql.Completion(a.id, a.fence, "1", now, now)])
        sql.complete(connection, [sql.Completion(b.id, b.fence, "2", now, now)])
    assert set(Task.objects.values_list("status", flat=True)) == {Status.SUCCESSFUL}
    # and the connection is back in autocommit, with no transaction of ox's left open
    with driver(connection).transaction(connection):
        pass
    assert not getattr(connection, "_ox_transaction_open")
