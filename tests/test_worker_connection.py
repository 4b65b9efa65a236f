"""The worker's own connection (ox.connection.open_worker_connection) is in autocommit whatever
the project's DATABASES say: with AUTOCOMMIT False there, a worker's claim or completion sat in
an open transaction no other session could see (the task looked unclaimed, its success
unwritten) until something happened to commit it."""

import pytest
from django.db import connection, connections

from ox import clock, sql
from ox.connection import open_worker_connection
from ox.db import driver
from ox.db.dialect import runs_again
from ox.models import Status, Task
from tests import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_connection_commits_each_write_though_the_project_turns_autocommit_off(monkeypatch):
    result = tasks.noop.enqueue()
    # Only while the worker's connection is made (the test's own must not reconnect with it).
    with monkeypatch.context() as m:
        m.setitem(connections.settings[connection.alias], "AUTOCOMMIT", False)
        worker = open_worker_connection(connection.alias)
    try:
        assert worker.get_autocommit()
        assert runs_again(worker)  # so a deadlock victim of its is ox's to run again
        now = clock.db_now(worker)
        (claimed,) = sql.claim(worker, "w1", ["default"], (1, 0), now, now)
        assert str(claimed.id) == result.id
        # Seen by another session at once: the claim committed.
        other = connections.create_connection(connection.alias)
        other.settings_dict = {**other.settings_dict, "AUTOCOMMIT": True}
        try:
            with other.cursor() as cursor:
                cursor.execute("SELECT status FROM ox_task WHERE id = %s", [driver(other).id(claimed.id)])
                assert cursor.fetchone()[0] == Status.RUNNING
        finally:
            other.close()
    finally:
        worker.close()
    assert Task.objects.get(pk=result.id).status == Status.RUNNING
