"""Adversarial tests of flow control (unique tasks, the gate's limits, pause). Each test
fails today because of the bug its docstring names."""

import re
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection

from ox import clock, enqueue_many
from ox.archive import archive
from ox.models import Status, Task
from tests import flow_tasks as f
from tests.helpers import wait_until
from tests.test_durability import options
from tests.testapp.models import Span

pytestmark = pytest.mark.django_db(transaction=True)


def claims_of(worker) -> int:
    return sum(int(m) for m in re.findall(r"worker stopped .*?claims=(\d+)", worker.output()))


def test_batch_worker_does_not_spin_while_a_rate_holds_its_queue_back(start_worker):
    """Promise: tasks waiting only for a limit are not hammered; a rate-held worker sleeps
    until the next token. Broken: `runworker --batch` on a rate-limited queue. After the
    first start the rest are due but held by the rate; Worker._done() asks earliest_ready
    (which ignores limits), sees due tasks, sets more_waiting, and the loop claims again at
    once, over and over, until the next token: thousands of claims for 3 starts."""
    enqueue_many(f.rated, [((f"b{i}",), {}) for i in range(3)])
    env = options(limits={"reports": {"rate": "1/2s"}}, heartbeat=0.5, rescue_interval=0.5)
    worker = start_worker("--batch", "--queues", "reports", env=env)
    assert worker.wait(timeout=60) == 0
    assert Span.objects.count() == 3
    # 3 starts, 2 s apart: a sleeping worker claims a handful of times (a poll a second).
    claims = claims_of(worker)
    assert claims <= 30, f"{claims} claims for 3 starts in about 4 s: a busy claim loop"


def test_batch_worker_does_not_spin_while_another_worker_holds_the_concurrency_slot(start_worker, tmp_path):
    """Promise: tasks waiting only for a limit are not hammered (no busy claim loop).
    Broken: a `--batch` worker on a queue whose one slot (concurrency 1) another worker
    holds: every round finds the due tasks (earliest_ready does not know the queue is full),
    so the batch loop claims back to back for as long as the slot is held."""
    from tests import gated_tasks

    gate = tmp_path / "gate"
    held = gated_tasks.hold.using(queue_name="emails").enqueue("held", str(gate))
    env = options(limits={"emails": {"concurrency": 1}}, heartbeat=0.5, rescue_interval=0.5)
    holder = start_worker("--queues", "emails", env=env)
    wait_until(lambda: Task.objects.get(pk=held.id).status == Status.RUNNING, timeout=30)
    time.sleep(0.5)
    enqueue_many(f.limited, [((f"w{i}", 0.0), {}) for i in range(2)])
    batch = start_worker("--batch", "--queues", "emails", env=env)
    time.sleep(3.0)
    gate.touch()
    assert batch.wait(timeout=60) == 0
    holder.signal(signal.SIGTERM)
    holder.wait(timeout=30)
    claims = claims_of(batch)
    assert claims <= 40, f"{claims} claims in about 3 s blocked by a full slot: a busy claim loop"


def test_priority_across_a_limited_and_an_unlimited_queue(start_worker):
    """Promise: a worker claims in priority order (the claim orders across its queues by
    priority, then due time), and unlimited queues are not starved by limited ones.
    Broken: Claims._claim_rows asks the gate (limited queues) first for every free slot and
    gives the unlimited queues only what is left; a worker with one slot serving a limited
    queue with a backlog of low-priority tasks runs all of them before one high-priority task
    of an unlimited queue enqueued before them."""
    urgent = f.limited.using(queue_name="default", priority=100).enqueue("urgent", 0.0)
    time.sleep(0.01)
    enqueue_many(f.limited.using(priority=-50), [((f"low{i}", 0.05), {}) for i in range(10)])
    env = options(limits={"emails": {"concurrency": 5}}, heartbeat=0.5)
    worker = start_worker("--concurrency", "1", "--queues", "emails,default", env=env)
    wait_until(lambda: Task.objects.get(pk=urgent.id).status == Status.SUCCESSFUL, timeout=60)
    worker.signal(signal.SIGTERM)
    worker.wait(timeout=30)
    order = [s.key for s in Span.objects.order_by("started")]
    assert order[0] == "urgent", f"the priority-100 task started after {order.index('urgent')} priority -50 tasks"


def test_archiver_moves_finished_unique_rows_that_no_longer_hold_their_key():
    """Promise: the archiver keeps only rows that still hold a key; nothing costs more as
    the table grows. Broken: archive.batch_sql keeps every row with unique_states != 0 and
    no period (`unique_states = 0 OR unique_until < cutoff`), whatever its status: a task
    unique over SUCCESSFUL (states=["SUCCESSFUL"]) that FAILED frees its key, yet stays in
    ox_task forever, so the hot table of such a task only grows."""
    r = f.unique_ever.enqueue(n=1)  # unique by n, SUCCESSFUL holds the key
    old = clock.db_now(connection) - timedelta(days=30)
    Task.objects.filter(pk=r.id).update(status=Status.FAILED, finished_at=old)
    # Its key is free: a new enqueue of the same call is a new task, not a duplicate.
    from ox.flow.unique import is_duplicate

    again = f.unique_ever.enqueue(n=1)
    assert not is_duplicate(again)
    Task.objects.filter(pk=again.id).delete()
    plain = f.limited.enqueue("plain", 0.0)  # control: an ordinary FAILED row of the same age
    Task.objects.filter(pk=plain.id).update(status=Status.FAILED, finished_at=old)
    archive(connection, timedelta(days=1), clock.db_now(connection))
    assert not Task.objects.filter(pk=plain.id).exists()
    assert not Task.objects.filter(pk=r.id).exists(), "a FAILED row holding no key was kept in ox_task"


def test_gate_under_repeatable_read_never_exceeds_the_concurrency_limit():
    """Promise: the concurrency limit is never exceeded across workers. Broken under a
    database configured with OPTIONS isolation_level REPEATABLE READ (which the worker's
    connection inherits): claim_limited's transaction takes its snapshot at its first
    statement (the INSERT ... ON CONFLICT into ox_queue), *before* it waits for the queue
    row's lock, so once it gets the lock it counts RUNNING rows as they were before the
    gate it waited for committed. Here gate A (simulated by a lock holder) claims a sync
    task and commits while gate B waits for the lock; B, asked for an async task, counts 0
    running and claims it: 2 RUNNING under concurrency 1."""
    if connection.vendor != "postgresql":
        pytest.skip("isolation levels are PostgreSQL's")
    from psycopg import IsolationLevel

    from ox.connection import open_worker_connection
    from ox.flow.gate import claim_limited
    from ox.flow.limits import QueueLimits

    sync_task = f.limited.enqueue("s", 0.0)
    async_row = f.limited.enqueue("a", 0.0)
    Task.objects.filter(pk=async_row.id).update(is_async=True)
    limits = {"emails": QueueLimits(concurrency=1)}
    # Both rows exist up front (the gate inserts them ON CONFLICT DO NOTHING).
    with connection.cursor() as c:
        c.execute(
            "INSERT INTO ox_queue (name, paused, overrides, limited, updated_by) VALUES ('emails', false, '{}', false, '')"
            " ON CONFLICT DO NOTHING"
        )

    a = open_worker_connection(connection.alias)
    b_conn = connections_rr()
    try:
        a.connection.autocommit = True
        with a.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("SELECT name FROM ox_queue WHERE name = 'emails' FOR UPDATE")
        result = {}

        def gate_b():
            now = clock.db_now(b_conn)
            result["b"] = claim_limited(b_conn, "b", limits, (0, 1), now, now + timedelta(seconds=60))
            b_conn.close()

        t = threading.Thread(target=gate_b)
        t.start()
        time.sleep(1.0)  # B has begun and waits for the lock
        with a.cursor() as cur:  # gate A's claim: the sync task, then commit
            cur.execute(
                "UPDATE ox_task SET status = 'RUNNING', worker_id = 'a', fence = fence + 1,"
                " attempts = attempts + 1, lease_expires_at = now() + interval '60 s' WHERE id = %s",
                [sync_task.id],
            )
            cur.execute("COMMIT")
        t.join(timeout=30)
        assert not t.is_alive()
    finally:
        a.close()
    running = Task.objects.filter(queue="emails", status=Status.RUNNING).count()
    assert running <= 1, f"{running} RUNNING in a queue limited to 1"
    del IsolationLevel


def connections_rr():
    """A worker connection of a database configured for REPEATABLE READ."""
    from django.db import connections
    from psycopg import IsolationLevel

    from ox.connection import open_worker_connection

    settings = connections[connection.alias].settings_dict
    saved = dict(settings.get("OPTIONS", {}))
    settings.setdefault("OPTIONS", {})["isolation_level"] = IsolationLevel.REPEATABLE_READ
    try:
        return open_worker_connection(connection.alias)
    finally:
        settings["OPTIONS"] = saved


def test_gate_takes_a_free_key_behind_more_than_a_window_of_a_full_key():
    """Promise: a READY task whose key is full is passed over, and tasks of other keys after
    it are taken (per-key limits never block other keys). Broken: the gate reads at most
    WINDOW_MAX (1000) candidates; a backlog of 1,500 tasks of one full key (key_concurrency 1,
    its slot taken) at the head of the queue hides every other key's task: the claim takes
    nothing while slots and keys are free, for as long as the full key's backlog lasts."""
    from ox.flow.gate import claim_limited
    from ox.flow.limits import QueueLimits

    enqueue_many(f.per_account, [((f"a{i}", 0.0), {"account": "big"}) for i in range(1500)])
    Task.objects.filter(pk=Task.objects.order_by("run_after", "id").first().pk).update(
        status=Status.RUNNING, worker_id="x", lease_expires_at=clock.db_now(connection) + timedelta(minutes=5)
    )
    time.sleep(0.01)
    other = f.per_account.enqueue("small", 0.0, account="small")
    limits = {"emails": QueueLimits(key_concurrency=1)}
    now = clock.db_now(connection) + timedelta(seconds=1)
    _written, gated = claim_limited(connection, "w", limits, (4, 0), now, now + timedelta(minutes=5))
    assert [str(c.id) for c in gated.claimed] == [str(other.id)], "the free key's task was hidden behind the full key's backlog"
