"""A successful attempt's last metadata rides on its completion (ox.metadata.end_text): the
statement that records the success writes it, fenced like the rest, and the attempt makes no
write of its own at its end. On every database."""

from datetime import timedelta

import pytest
from django.db import connection
from django.tasks import task_backends
from django.test.utils import CaptureQueriesContext

from ox import clock, sql
from ox.completer import Completer
from ox.conf import OxOptions
from ox.execution import SUCCESSFUL, Finished
from ox.metadata import context_for, end_text, flush_waiting
from ox.models import Status, Task
from tests import tasks
from tests.test_metadata import _claim_one

pytestmark = pytest.mark.django_db(transaction=True)


def _completion(claimed, metadata_json=None) -> sql.Completion:
    now = clock.db_now(connection)
    return sql.Completion(claimed.id, claimed.fence, "1", now, now, metadata_json=metadata_json)


def _statements(done) -> tuple[int, set]:
    with CaptureQueriesContext(connection) as queries:
        written = sql.complete(connection, done)
    return len(queries.captured_queries), written


def test_the_last_metadata_is_written_by_the_completion_and_nothing_else():
    tasks.echo.enqueue(1)
    claimed, running = _claim_one()
    context = context_for(running, claimed.id, claimed.fence, connection.alias)
    context.metadata["progress"] = 0.1
    assert context.save_metadata() is True  # the first save: written at once
    context.metadata["progress"] = 1.0
    assert context.save_metadata() is True  # inside the interval: waits for the heartbeat
    with CaptureQueriesContext(connection) as queries:
        text = end_text(context)
    assert not queries.captured_queries  # the end itself writes nothing
    assert text is not None
    assert flush_waiting(connection) == 0  # the heartbeat has nothing left of it to write
    assert Task.objects.get(id=claimed.id).metadata == {"progress": 0.1}

    tasks.echo.enqueue(2)
    other, _running = _claim_one()
    plain_count, _ = _statements([_completion(other)])
    count, written = _statements([_completion(claimed, text)])
    assert count == plain_count  # no statement more than a completion without metadata
    assert written == {(claimed.id, claimed.fence)}
    row = Task.objects.get(id=claimed.id)
    assert row.status == Status.SUCCESSFUL and row.metadata == {"progress": 1.0}


def test_a_completion_with_nothing_new_leaves_the_metadata_as_it_was():
    tasks.echo.using(metadata={"owner": "a"}).enqueue(1)
    tasks.echo.using(metadata={"owner": "b"}).enqueue(2)
    first, running = _claim_one()
    second, _ = _claim_one()
    context = context_for(running, first.id, first.fence, connection.alias)
    assert end_text(context) is None  # unchanged since the claim
    context.metadata["owner"] = "changed"
    assert end_text(context) == '{"owner":"changed"}'
    # One batch: one row with metadata, one without.
    written = sql.complete(connection, [_completion(first, '{"owner":"changed"}'), _completion(second)])
    assert len(written) == 2
    assert Task.objects.get(id=first.id).metadata == {"owner": "changed"}
    assert Task.objects.get(id=second.id).metadata == {"owner": "b"}


def test_odd_but_storable_metadata_survives_the_completion_unchanged():
    tasks.echo.enqueue(1)
    claimed, running = _claim_one()
    context = context_for(running, claimed.id, claimed.fence, connection.alias)
    odd = {"emoji": "🦊", "quote": 'a "b" \\ c', "nested": {"n": [1, 2.5, None, True]}, "big": 10**18, "": "empty key"}
    context.metadata.update(odd)
    sql.complete(connection, [_completion(claimed, end_text(context))])
    assert Task.objects.get(id=claimed.id).metadata == odd
    assert task_backends["default"].get_result(str(claimed.id)).metadata == odd


def test_a_fenced_out_completion_writes_no_metadata():
    tasks.echo.using(metadata={"owner": "first"}).enqueue(1)
    claimed, running = _claim_one()
    context = context_for(running, claimed.id, claimed.fence, connection.alias)
    context.metadata["owner"] = "stale attempt"
    text = end_text(context)
    Task.objects.filter(id=claimed.id).update(fence=claimed.fence + 1)  # a rescue and a new claim
    assert sql.complete(connection, [_completion(claimed, text)]) == set()
    row = Task.objects.get(id=claimed.id)
    assert row.status == Status.RUNNING and row.metadata == {"owner": "first"}


def test_an_attempt_that_lost_the_task_carries_nothing_to_its_completion():
    tasks.echo.enqueue(1)
    claimed, running = _claim_one()
    context = context_for(running, claimed.id, claimed.fence, connection.alias)
    Task.objects.filter(id=claimed.id).update(fence=claimed.fence + 1)
    context.metadata["x"] = 1
    assert context.save_metadata() is False  # the write finds the row taken
    context.metadata["x"] = 2
    assert end_text(context) is None


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a return value only PostgreSQL's jsonb refuses")
def test_metadata_of_a_success_whose_result_is_refused_is_still_written():
    """The completion it rode on is refused for the return value: the metadata is written on
    its own, then the attempt fails with the reason."""
    for i in range(3):
        tasks.echo.enqueue(i)
    now = clock.db_now(connection)
    claimed = sql.claim(connection, "w", ["default"], 3, now, now + timedelta(minutes=1))
    completer = Completer("w", OxOptions(), object)
    for i, c in enumerate(claimed):
        value = '"\\udcff"' if i == 1 else str(i)  # an escape jsonb rejects
        completer.add(Finished(c, SUCCESSFUL, now, now, return_json=value, metadata_json=f'{{"step":{i}}}'))
    completer.isolate(connection, lambda batch: sql.complete(connection, batch))
    rows = [Task.objects.get(pk=c.id) for c in claimed]
    assert [r.status for r in rows] == [Status.SUCCESSFUL, Status.FAILED, Status.SUCCESSFUL]
    assert [r.metadata for r in rows] == [{"step": 0}, {"step": 1}, {"step": 2}]
