"""The join riding on the worker's claim (ox.sql.complete_and_claim; on PostgreSQL completion,
join and next claim are one statement, ox.db.postgresql.join.IN_CLAIM): the same end state as
completing first and claiming after, over random workflow shapes and batch splits; fenced-out
completions count nothing; a follower that is RUNNING or READY in the same statement keeps its
own completion or claim (a row updated twice in one statement keeps only one update); an idle
worker is notified only when a follower became READY. Every database, without a worker."""

import random
from datetime import timedelta

import pytest
from django.db import connection

import ox
from ox import clock, sql
from ox.models import Edge, Status, Task
from tests import workflow_tasks as wt

pytestmark = pytest.mark.django_db(transaction=True)

PG = connection.vendor == "postgresql"


def _now():
    return clock.db_now(connection)


def _done(claimed, value="1"):
    now = _now()
    return [sql.Completion(c.id, c.fence, value, now, now, c.workflow_id is not None) for c in claimed]


def _claim(n: int) -> list[sql.Claimed]:
    now = _now()
    return sql.claim(connection, "jic", ["default"], (n, 0), now, now + timedelta(seconds=60))


def _complete_and_claim(done, n: int) -> tuple[set, list[sql.Claimed]]:
    now = _now()
    return sql.complete_and_claim(connection, done, "jic", ["default"], (n, 0), now, now + timedelta(seconds=60))


def _row(r) -> Task:
    return Task.objects.get(id=getattr(r, "id", r))


def _shapes(rng: random.Random) -> None:
    """A few workflows of random shape: chains, groups with a callback, a group after a group."""
    for _ in range(rng.randint(2, 5)):
        kind = rng.choice(["chain", "group", "group_group"])
        if kind == "chain":
            ox.chain(*[wt.add.s(1, 1)] + [wt.total.s() for _ in range(rng.randint(1, 4))]).enqueue()
        elif kind == "group":
            ox.group([wt.add.s(i, 1) for i in range(rng.randint(2, 5))]).then(wt.total.s()).enqueue()
        else:
            heads = ox.group([wt.add.s(i, i) for i in range(rng.randint(1, 3))])
            ox.chain(heads, ox.group([wt.total.s() for _ in range(rng.randint(1, 3))]), wt.total.s()).enqueue()


def _drain(rng: random.Random, riding: bool) -> list[list[tuple]]:
    """Run every task to SUCCESSFUL by claims of random sizes, the completions of a random part
    of what is held riding on each claim (riding) or written by sql.complete just after a claim
    (which, like the riding claim's snapshot, cannot see the followers that completion makes
    READY). Returns what each step wrote and claimed, in counts (ids differ between runs)."""
    held: list[sql.Claimed] = []
    steps = []
    for _round in range(200):
        rng.shuffle(held)
        k = rng.randint(0, len(held))
        done, held = held[:k], held[k:]
        n = rng.randint(1, 4)
        if riding:
            written, claimed = _complete_and_claim(_done(done), n)
        else:
            claimed = _claim(n)
            written = sql.complete(connection, _done(done))
        assert written == {c.key for c in done}
        held += claimed
        steps.append((len(done), len(claimed)))
        if not held and not Task.objects.exclude(status=Status.SUCCESSFUL).exists():
            return steps
    raise AssertionError("not drained in 200 rounds")


@pytest.mark.parametrize("seed", range(6))
def test_riding_on_the_claim_ends_as_completing_then_claiming(seed):
    """The same workflows and the same random choices through both paths end the same: every
    task SUCCESSFUL, every edge closed with its parent's result, and at every step the same
    number written and claimed (a follower the riding join makes READY is claimed by the next
    claim)."""
    ends = []
    for riding in (True, False):
        Task.objects.all().delete()
        Edge.objects.all().delete()
        _shapes(random.Random(seed))
        steps = _drain(random.Random(seed * 7 + 1), riding)
        assert not Edge.objects.filter(done=False).exists()
        assert not Edge.objects.filter(result__isnull=True).exists()
        ends.append((steps, Task.objects.count(), sorted(Task.objects.values_list("status", flat=True))))
    assert ends[0] == ends[1]


def test_a_fenced_out_member_riding_on_a_claim_counts_nothing():
    run = ox.group([wt.add.s(1, 1), wt.add.s(2, 2)]).then(wt.total.s()).enqueue()
    callback = run.results[-1]
    first, second = _claim(10)
    Task.objects.filter(id=first.id).update(fence=first.fence + 1)  # a rescue took it
    written, claimed = _complete_and_claim(_done([first, second]), 5)
    assert written == {second.key} and claimed == []
    assert (_row(callback).status, _row(callback).waiting) == (Status.PENDING, 1)
    assert Edge.objects.filter(parent_id=first.id, done=False).count() == 1
    # The member's own attempt ends later: the callback is READY, claimed by the next claim.
    Task.objects.filter(id=first.id).update(fence=first.fence)
    written, claimed = _complete_and_claim(_done([first]), 5)
    assert written == {first.key} and claimed == []
    assert _row(callback).status == Status.READY
    ((_w, (nxt,))) = _complete_and_claim([], 5)
    assert str(nxt.id) == callback.id


def test_a_running_follower_completed_in_the_same_statement_keeps_its_success():
    """A follower RUNNING (made READY by hand and claimed) whose parent ends in the same batch:
    both successes are written, the edge closed with the parent's result."""
    run = ox.chain(wt.add.s(1, 1), wt.total.s()).enqueue()
    parent_r, follower_r = run.results
    (parent,) = _claim(10)
    Task.objects.filter(id=follower_r.id).update(status=Status.READY, waiting=0)
    (follower,) = _claim(10)
    assert str(follower.id) == follower_r.id
    written, _claimed = _complete_and_claim(_done([parent], "2") + _done([follower], "9"), 5)
    assert written == {parent.key, follower.key}
    assert _row(parent_r).status == Status.SUCCESSFUL and _row(follower_r).status == Status.SUCCESSFUL
    assert _row(follower_r).return_value == 9
    assert list(Edge.objects.filter(child_id=follower_r.id).values_list("done", "result")) == [(True, "2")]


def test_a_ready_follower_claimed_by_the_same_statement_is_claimed_once():
    """A follower READY (by hand) that the same statement's claim picks while its parent's
    completion closes the edge into it: claimed (RUNNING, its fence moved on), edge closed."""
    run = ox.chain(wt.add.s(1, 1), wt.total.s()).enqueue()
    parent_r, follower_r = run.results
    (parent,) = _claim(10)
    Task.objects.filter(id=follower_r.id).update(status=Status.READY, waiting=0)
    before = _row(follower_r).fence
    written, claimed = _complete_and_claim(_done([parent], "2"), 5)
    assert written == {parent.key}
    assert [str(c.id) for c in claimed] == [follower_r.id]
    row = _row(follower_r)
    assert row.status == Status.RUNNING and row.fence == before + 1 == claimed[0].fence
    assert list(Edge.objects.filter(child_id=follower_r.id).values_list("done", "result")) == [(True, "2")]


@pytest.mark.skipif(not PG, reason="NOTIFY: PostgreSQL only")
def test_the_join_on_a_claim_notifies_an_idle_worker_only_when_a_follower_became_ready(listener):
    from ox.models import Worker

    now = _now()
    Worker.objects.create(id="idle-jic", host="h", pid=1, started_at=now, heartbeat_at=now, idle_since=now)
    run = ox.group([wt.add.s(1, 1), wt.add.s(2, 2)]).then(wt.total.s()).enqueue()
    m1, m2 = _claim(10)
    assert listener(0.5) == []  # the conftest fixture: a LISTEN session of its own
    _complete_and_claim(_done([m1]), 5)
    assert listener(0.5) == [], "a NOTIFY for a join that made nothing READY"
    _complete_and_claim(_done([m2]), 5)
    assert listener(0.5) == ["default"]
    assert _row(run.results[-1]).status == Status.READY


def test_the_inputs_a_claim_reads_are_those_join_inputs_reads():
    """Claimed.inputs (read by the claim where the database allows) against a read of the
    edges after it: a chain step, a group's callback (results gathered in position order), a
    "continue" follower whose parent failed (result None), a head (no inputs)."""
    from ox.workflow import join

    ox.chain(wt.add.s(1, 1), wt.total.s()).enqueue()
    ox.group([wt.add.s(i, 1) for i in range(3)]).then(wt.total.s()).enqueue()
    cont = ox.group([wt.add.s(1, 1), wt.add.s(2, 2)]).then(wt.total.s()).enqueue(policy="continue")
    heads = _claim(20)
    failed = next(c for c in heads if str(c.id) == cont.results[1].id)
    rest = [c for c in heads if c.id != failed.id]
    now = _now()
    failure = sql.Failure(failed.id, failed.fence, 1, "jic", now, now, "failed", "x.E", "tb", None, workflow=True)
    sql.fail(connection, failure)
    for i, c in enumerate(rest):
        _complete_and_claim(_done([c], str(10 + i)), 0)
    claimed = _complete_and_claim([], 20)[1]
    assert len(claimed) == 3
    expected = join.inputs(connection, [c.id for c in claimed])
    for c in claimed:
        if connection.vendor == "postgresql":
            assert c.inputs == expected[c.id]
        else:
            assert c.inputs is None  # read after the claim (ox.claims)
    by_count = sorted(len(v) for v in expected.values())
    assert by_count == [1, 2, 3]
    assert any(None in [r for _g, r in v] for v in expected.values())  # the failed parent's
    if connection.vendor == "postgresql":
        assert all(c.inputs == [] for c in heads)
