"""An adversarial review of the one-statement join on PostgreSQL (ox.db.postgresql.join)
against the generic path (ox.workflow.join): batch shapes, followers not PENDING, counts and
NOTIFY, workflow retry, two and four connections at once. Every database. Found by the review
and fixed (older than the one-statement join): on PostgreSQL a workflow task's success written
through the gate's round trips (ox.db.postgresql.gate) never joined, so its follower waited for
the repair sweep; such completions are written with their join first now (ox.flow.gate)."""

import random
import threading
import uuid
from datetime import timedelta

import pytest
from django.db import close_old_connections, connection, connections
from django.db import transaction as dj_transaction

import ox
from ox import clock, sql
from ox.db import driver
from ox.flow import gate
from ox.flow.limits import QueueLimits
from ox.models import Edge, Status, Task
from ox.workflow import join
from tests import workflow_tasks as wt
from tests.test_attack_metadata_end import _claim_all, _now, _row

pytestmark = pytest.mark.django_db(transaction=True)

PG = connection.vendor == "postgresql"


# -------------------------------------------------------------------------------------------- join


def _done(claimed, value="1"):
    now = _now()
    return [sql.Completion(c.id, c.fence, value, now, now, True) for c in claimed]


def test_join_two_by_three_group_after_group_in_mixed_batches():
    """A 2x3 group after a group of 2 then a callback after the 3: every follower counted per
    edge, the callback READY once its three parents are in."""
    run = ox.chain(
        ox.group([wt.add.s(1, 1), wt.add.s(2, 2)]),
        ox.group([wt.total.s(), wt.total.s(), wt.total.s()]),
        wt.total.s(),
    ).enqueue()
    mids, last = run.results[2:5], run.results[5]
    first = _claim_all(10)
    assert len(first) == 2
    sql.complete(connection, _done(first, "2"))
    assert [(_row(m).status, _row(m).waiting) for m in mids] == [(Status.READY, 0)] * 3
    assert (_row(last).status, _row(last).waiting) == (Status.PENDING, 3)
    second = _claim_all(10)
    assert len(second) == 3
    sql.complete(connection, _done(second[:2], "4"))
    assert (_row(last).status, _row(last).waiting) == (Status.PENDING, 1)
    sql.complete(connection, _done(second[2:], "4"))
    assert (_row(last).status, _row(last).waiting) == (Status.READY, 0)
    assert list(Edge.objects.filter(child_id=last.id).values_list("result", flat=True)) == ["4", "4", "4"]


def test_join_follower_already_ready_running_or_finished_is_left_alone():
    """A follower not PENDING (made READY by hand, running, finished) keeps its status, its
    run_after and a waiting of 0, whatever counts it down; the count is as the generic path's."""
    runs = [ox.chain(wt.add.s(1, 1), wt.total.s()).enqueue() for _ in range(4)]
    followers = [r.results[1] for r in runs]
    claimed = _claim_all(10)
    long_ago = _now() - timedelta(days=3)
    for f, status in zip(followers, [Status.READY, Status.RUNNING, Status.SUCCESSFUL, Status.FAILED], strict=True):
        Task.objects.filter(id=f.id).update(status=status, waiting=0, run_after=long_ago)
    claimed = [c for c in claimed if str(c.id) in {r.results[0].id for r in runs}]
    assert len(claimed) == 4
    with dj_transaction.atomic():
        written = driver(connection).complete(connection, _done(claimed))
        with connection.cursor() as cursor:
            became = join.succeeded(connection, cursor, [(c.id, "2") for c in claimed], _now())
    assert len(written) == 4 and became == 0
    for f, status in zip(followers, [Status.READY, Status.RUNNING, Status.SUCCESSFUL, Status.FAILED], strict=True):
        row = _row(f)
        assert (row.status, row.waiting, row.run_after) == (status, 0, long_ago)


def test_join_a_follower_not_pending_with_a_count_left_is_counted_down_like_the_generic_path():
    """A CANCELLED follower whose count was left above 0 (a cancel by hand): counted down by
    the edges closed, never below 0, never READY."""
    run = ox.group([wt.add.s(1, 1), wt.add.s(2, 2), wt.add.s(3, 3)]).then(wt.total.s()).enqueue()
    callback = run.results[-1]
    Task.objects.filter(id=callback.id).update(status=Status.CANCELLED)
    claimed = _claim_all(10)
    sql.complete(connection, _done(claimed[:2]))
    assert (_row(callback).status, _row(callback).waiting) == (Status.CANCELLED, 1)
    sql.complete(connection, _done(claimed[2:]))
    assert (_row(callback).status, _row(callback).waiting) == (Status.CANCELLED, 0)


def test_join_returns_how_many_became_ready_and_notifies_only_for_them():
    """join.succeeded's count: only followers that became READY (not those already READY,
    not those still waiting)."""
    a = ox.chain(wt.add.s(1, 1), wt.total.s()).enqueue()
    b = ox.group([wt.add.s(1, 1), wt.add.s(2, 2)]).then(wt.total.s()).enqueue()
    claimed = _claim_all(10)
    ids_a = {a.results[0].id}
    part = [c for c in claimed if str(c.id) in ids_a] + [c for c in claimed if str(c.id) == b.results[0].id]
    with dj_transaction.atomic():
        driver(connection).complete(connection, _done(part))
        with connection.cursor() as cursor:
            became = join.succeeded(connection, cursor, [(c.id, "2") for c in part], _now())
    assert became == 1
    assert _row(a.results[1]).status == Status.READY
    assert (_row(b.results[-1]).status, _row(b.results[-1]).waiting) == (Status.PENDING, 1)


def test_join_after_a_workflow_retry_counts_only_the_retried_member():
    """A group of two under "stop": one member fails (callback CANCELLED), the other succeeds;
    the failed part is retried; the retried member's success makes the callback READY."""
    from ox.workflow.retry import retry_failed_part

    run = ox.group([wt.add.s(1, 1), wt.add.s(2, 2)]).then(wt.total.s()).enqueue()
    m1, m2, callback = run.results
    claimed = {str(c.id): c for c in _claim_all(10)}
    now = _now()
    sql.fail(
        connection,
        sql.Failure(
            id=uuid.UUID(m1.id),
            fence=claimed[m1.id].fence,
            attempt=1,
            worker_id="atk",
            started_at=now,
            finished_at=now,
            outcome="failed",
            exception_class_path="x.Y",
            traceback="tb",
            retry_at=None,
            workflow=True,
        ),
    )
    assert _row(callback).status == Status.CANCELLED
    sql.complete(connection, _done([claimed[m2.id]], "4"))
    assert retry_failed_part(run.id) == 2
    assert (_row(callback).status, _row(callback).waiting) == (Status.PENDING, 1)
    (again,) = _claim_all(10)
    assert str(again.id) == m1.id
    sql.complete(connection, _done([again], "2"))
    assert (_row(callback).status, _row(callback).waiting) == (Status.READY, 0)
    assert sorted(Edge.objects.filter(child_id=callback.id).values_list("result", flat=True)) == ["2", "4"]


def test_a_workflow_success_written_by_the_gate_counts_its_followers_down():
    """A chain's first task on a queue with a limit: its success rides on the gate's claim
    (ox.flow.gate.claim_limited; on PostgreSQL ox.db.postgresql.gate writes it with
    complete_sql in its own query). Its follower must become READY in that transaction,
    as sql.complete does it (SQLite/MariaDB's gate path calls sql.complete, which joins).

    Found by review on PostgreSQL: the fast gate path wrote the completion but never joined;
    the follower stayed PENDING with waiting 1 until the repair sweep found it."""
    run = ox.chain(wt.add.s(1, 1), wt.total.s()).enqueue()
    first, follower = run.results
    lim = {"default": QueueLimits(concurrency=4)}
    now = _now()
    _w, gated = gate.claim_limited(connection, "atk", lim, (1, 0), now, now + timedelta(seconds=30))
    (c,) = gated.claimed
    assert str(c.id) == first.id and c.workflow_id is not None
    now = _now()
    done = [sql.Completion(c.id, c.fence, "2", now, now, True)]
    written, gated2 = gate.claim_limited(connection, "atk", lim, (1, 0), now, now + timedelta(seconds=30), done)
    assert written == {c.key}
    assert _row(first).status == Status.SUCCESSFUL
    row = _row(follower)
    # Either READY, or already claimed by the same gate transaction.
    assert row.status in (Status.READY, Status.RUNNING) and row.waiting == 0, (row.status, row.waiting)
    assert Edge.objects.get(child_id=follower.id).done is True


def test_a_workflow_task_with_metadata_riding_on_a_claim_joins_and_writes_both():
    """A chain's first task succeeds with new metadata, its completion riding on the next
    claim: the metadata written, the follower counted down (READY) in that transaction."""
    run = ox.chain(wt.add.s(1, 1), wt.total.s()).enqueue()
    first, follower = run.results
    (c,) = _claim_all(10)
    now = _now()
    done = [sql.Completion(c.id, c.fence, "2", now, now, True, '{"stage":"done","🦊":[1,{"a":null}]}')]
    written, more = sql.complete_and_claim(
        connection, done, "atk", ["default"], (5, 0), now, now + timedelta(seconds=60)
    )
    assert written == {c.key}
    assert _row(first).metadata == {"stage": "done", "🦊": [1, {"a": None}]}
    assert (_row(follower).status, _row(follower).waiting) == (Status.READY, 0)
    assert Edge.objects.get(child_id=follower.id).result == "2"


# ---------------------------------------------------------------- join: two connections at once


def _in_thread(fn, *args):
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001
            out["error"] = exc
        finally:
            connections.close_all()

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _complete_holding(claimed, started: threading.Event, release: threading.Event, value="1"):
    """Complete these members (completion + join) in a transaction kept open until `release`."""
    close_old_connections()
    conn = connections["default"]
    with dj_transaction.atomic():
        written = driver(conn).complete(conn, _done_on(conn, claimed, value))
        with conn.cursor() as cursor:
            became = join.succeeded(
                conn, cursor, [(c.id, value) for c in claimed if c.key in written], clock.db_now(conn)
            )
        started.set()
        release.wait(20)
    return became


def _done_on(conn, claimed, value):
    now = clock.db_now(conn)
    return [sql.Completion(c.id, c.fence, value, now, now, True) for c in claimed]


def test_two_connections_ending_the_last_two_members_make_the_callback_ready_once():
    """Transaction A ends member 1 and holds its lock on the callback; transaction B ends
    member 2 and waits for it; A commits, B sees waiting 1 (its re-check) and makes it READY.
    Exactly one of the two returns 1."""
    run = ox.group([wt.add.s(1, 1), wt.add.s(2, 2)]).then(wt.total.s()).enqueue()
    callback = run.results[-1]
    m1, m2 = _claim_all(10)
    a_in, a_go = threading.Event(), threading.Event()
    b_in, b_go = threading.Event(), threading.Event()
    b_go.set()
    ta, out_a = _in_thread(_complete_holding, [m1], a_in, a_go)
    assert a_in.wait(20)
    tb, out_b = _in_thread(_complete_holding, [m2], b_in, b_go)
    if connection.vendor != "sqlite":
        assert not b_in.wait(1.0), "B went through while A held the callback's lock"
    a_go.set()
    ta.join(30)
    tb.join(30)
    assert "error" not in out_a and "error" not in out_b, (out_a, out_b)
    assert out_a["value"] + out_b["value"] == 1
    row = _row(callback)
    assert (row.status, row.waiting) == (Status.READY, 0)


def test_a_follower_cancelled_by_a_concurrent_transaction_is_not_made_ready():
    """A cancel holds the follower's lock (status CANCELLED, uncommitted) while the last member
    ends on another connection: after the cancel commits, the join's re-check sees CANCELLED."""
    if connection.vendor == "sqlite":
        pytest.skip("one writer at a time on SQLite: nothing interleaves")
    run = ox.chain(wt.add.s(1, 1), wt.total.s()).enqueue()
    first, follower = run.results
    (c,) = _claim_all(10)
    locked, release = threading.Event(), threading.Event()

    def canceller():
        close_old_connections()
        with dj_transaction.atomic():
            Task.objects.select_for_update().filter(id=follower.id).update(status=Status.CANCELLED, waiting=0)
            locked.set()
            release.wait(20)

    tc, out_c = _in_thread(canceller)
    assert locked.wait(20)
    done_in, done_go = threading.Event(), threading.Event()
    done_go.set()
    tj, out_j = _in_thread(_complete_holding, [c], done_in, done_go)
    assert not done_in.wait(1.0)
    release.set()
    tc.join(30)
    tj.join(30)
    assert "error" not in out_c and "error" not in out_j, (out_c, out_j)
    assert out_j["value"] == 0
    assert _row(follower).status == Status.CANCELLED


def test_a_follower_counted_down_concurrently_by_two_several_per_batch():
    """Two transactions each end two members of one group of four (counts of 2 per follower
    per batch), interleaved on the callback's lock: READY once, waiting 0, never below."""
    if connection.vendor == "sqlite":
        pytest.skip("one writer at a time on SQLite: nothing interleaves")
    run = ox.group([wt.add.s(i, 1) for i in range(4)]).then(wt.total.s()).enqueue()
    callback = run.results[-1]
    members = _claim_all(10)
    a_in, a_go = threading.Event(), threading.Event()
    b_in, b_go = threading.Event(), threading.Event()
    b_go.set()
    ta, out_a = _in_thread(_complete_holding, members[:2], a_in, a_go)
    assert a_in.wait(20)
    tb, out_b = _in_thread(_complete_holding, members[2:], b_in, b_go)
    assert not b_in.wait(1.0)
    a_go.set()
    ta.join(30)
    tb.join(30)
    assert "error" not in out_a and "error" not in out_b, (out_a, out_b)
    assert (out_a["value"], out_b["value"]) == (0, 1)
    assert (_row(callback).status, _row(callback).waiting) == (Status.READY, 0)


def test_many_groups_ended_by_four_connections_at_once_no_deadlock_each_callback_once():
    """12 groups of 4, members spread over 4 threads in shuffled batches of 3-5 (so batches
    cross groups in every order): no deadlock, no error, each callback READY exactly once
    and the READY counts add up to the number of groups."""
    rng = random.Random(7)
    runs = [ox.group([wt.add.s(i, g) for i in range(4)]).then(wt.total.s()).enqueue() for g in range(12)]
    members = _claim_all(100)
    assert len(members) == 48
    rng.shuffle(members)
    shares = [members[i::4] for i in range(4)]
    barrier = threading.Barrier(4)

    def worker(share):
        close_old_connections()
        conn = connections["default"]
        barrier.wait()
        i = 0
        while i < len(share):
            n = rng.randint(3, 5)
            part = share[i : i + n]
            i += n
            for attempt in range(5):
                try:
                    written = sql.complete(conn, _done_on(conn, part, "1"))
                    break
                except Exception as exc:  # noqa: BLE001
                    if "database is locked" in str(exc) and attempt < 4:  # SQLite's busy writer
                        continue
                    raise
            assert written == {c.key for c in part}

    threads = [_in_thread(worker, s) for s in shares]
    for t, _out in threads:
        t.join(120)
    errors = [out.get("error") for _t, out in threads if "error" in out]
    assert not errors, errors
    for r in runs:
        row = _row(r.results[-1])
        assert (row.status, row.waiting) == (Status.READY, 0)
        assert Edge.objects.filter(child_id=r.results[-1].id, done=True).count() == 4


@pytest.mark.skipif(not PG, reason="NOTIFY: PostgreSQL only")
def test_join_notifies_an_idle_worker_only_for_followers_that_became_ready():
    """With an idle worker marked: a join that makes nothing READY sends no NOTIFY; one that
    makes a follower READY sends one for its queue (as count_down's notify_idle)."""
    import psycopg

    from ox.db.dialect import CHANNEL
    from ox.models import Worker

    now = _now()
    Worker.objects.create(id="idle-atk", host="h", pid=1, started_at=now, heartbeat_at=now, idle_since=now)
    run = ox.group([wt.add.s(1, 1), wt.add.s(2, 2)]).then(wt.total.s()).enqueue()
    m1, m2 = _claim_all(10)
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    listener = psycopg.connect(**params, autocommit=True)
    try:
        listener.execute(f"LISTEN {CHANNEL}")

        def heard():
            return [n.payload for n in listener.notifies(timeout=0.5)]

        assert heard() == []
        sql.complete(connection, _done([m1]))
        assert heard() == [], "a NOTIFY for a join that made nothing READY"
        sql.complete(connection, _done([m2]))
        assert heard() == ["default"]
        assert _row(run.results[-1]).status == Status.READY
    finally:
        listener.close()


def test_a_chain_on_a_worker_with_a_rate_limited_queue_is_not_held_up_by_the_repair_sweep(start_worker):
    """End to end: a worker serving a limited queue writes its successes through the gate.
    A four-step chain: its last three steps must take well under a repair interval (2 s).

    Found by review on PostgreSQL (the gate test above): each step's follower waited for the
    repair sweep (REPAIR_INTERVAL, 5 s) instead of being made READY by its predecessor's end."""
    import time

    from ox.flow import queues
    from ox.workflow.repair import REPAIR_INTERVAL
    from tests.helpers import wait_until

    queues.set_limits("emails", {"rate": "1000/s"})
    # A long task keeps the worker busy: its successes then ride on its claims (not written
    # at once as an idle worker's are).
    wt.slow_step.enqueue(seconds=20)
    run = ox.chain(wt.add.s(1, 1), wt.echo_all.s(), wt.echo_all.s(), wt.echo_all.s()).enqueue()
    start_worker("--queues", "default,emails", "--concurrency", "3")
    wait_until(lambda: _row(run.results[0]).status == Status.SUCCESSFUL, 60)
    started = time.monotonic()
    wait_until(lambda: _row(run.results[-1]).status in (Status.SUCCESSFUL, Status.FAILED), 60)
    took = time.monotonic() - started
    assert took < 2.0, f"three chain steps took {took:.1f}s (repair interval {REPAIR_INTERVAL}s)"
