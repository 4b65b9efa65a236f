"""The join counted over batches (ox.workflow.join.succeeded; on PostgreSQL one statement,
ox.db.postgresql.join): one completion batch holding several members of one group counts its
callback down by as many, a group after a group counts every edge, what is written twice counts
once, and a fenced-out member counts not at all. On every database, without a worker."""

from datetime import timedelta

import pytest
from django.db import connection

import ox
from ox import clock, sql
from ox.models import Edge, Status, Task
from tests import workflow_tasks as wt

pytestmark = pytest.mark.django_db(transaction=True)


def _claim_all(n: int) -> list[sql.Claimed]:
    now = clock.db_now(connection)
    return sql.claim(connection, "join-test", ["default"], (n, 0), now, now + timedelta(seconds=60))


def _done(claimed: list[sql.Claimed], value: str = "1") -> list[sql.Completion]:
    now = clock.db_now(connection)
    return [sql.Completion(c.id, c.fence, value, now, now, True) for c in claimed]


def _row(result) -> Task:
    return Task.objects.get(id=result.id)


def test_members_of_one_group_in_one_batch_count_its_callback_down_by_as_many():
    run = ox.group([wt.add.s(i, 1) for i in range(5)]).then(wt.total.s()).enqueue()
    callback = run.results[-1]
    claimed = _claim_all(10)
    assert len(claimed) == 5  # the callback waits: never claimed
    assert sql.complete(connection, _done(claimed[:3])) == {c.key for c in claimed[:3]}
    assert _row(callback).status == Status.PENDING and _row(callback).waiting == 2
    # Written again (a retried flush): fenced by status, counts nothing more.
    assert sql.complete(connection, _done(claimed[:3])) == set()
    assert _row(callback).waiting == 2
    sql.complete(connection, _done(claimed[3:]))
    row = _row(callback)
    assert row.status == Status.READY and row.waiting == 0
    assert Edge.objects.filter(child_id=callback.id, done=True).count() == 5
    assert set(Edge.objects.filter(child_id=callback.id).values_list("result", flat=True)) == {"1"}


def test_a_group_after_a_group_counts_every_edge_of_each_follower():
    run = ox.chain(
        ox.group([wt.add.s(1, 1), wt.add.s(2, 2)]), ox.group([wt.total.s(), wt.total.s(), wt.total.s()])
    ).enqueue()
    followers = run.results[2:]
    claimed = _claim_all(10)
    assert len(claimed) == 2
    sql.complete(connection, _done(claimed[:1], "2"))
    assert [(_row(f).status, _row(f).waiting) for f in followers] == [(Status.PENDING, 1)] * 3
    sql.complete(connection, _done(claimed[1:], "4"))
    assert [(_row(f).status, _row(f).waiting) for f in followers] == [(Status.READY, 0)] * 3


def test_a_fenced_out_member_counts_nothing():
    run = ox.group([wt.add.s(1, 1), wt.add.s(2, 2)]).then(wt.total.s()).enqueue()
    callback = run.results[-1]
    first, second = _claim_all(10)
    Task.objects.filter(id=first.id).update(fence=first.fence + 1)  # a rescue took it
    assert sql.complete(connection, _done([first, second])) == {second.key}
    row = _row(callback)
    assert row.status == Status.PENDING and row.waiting == 1
    assert Edge.objects.filter(parent_id=first.id, done=False).count() == 1


def test_a_cancelled_follower_is_not_made_ready():
    run = ox.chain(wt.add.s(1, 1), wt.total.s()).enqueue()
    first, follower = run.results
    (claimed,) = _claim_all(10)
    ox.cancel(follower.id)
    sql.complete(connection, _done([claimed]))
    assert _row(follower).status == Status.CANCELLED
