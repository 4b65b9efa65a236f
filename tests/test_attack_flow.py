"""Adversarial tests of flow control (unique tasks, the gate's limits, pause). Each test
failed, when written, because of the bug its docstring names. Five of them (the two
--batch spin tests and the three burst-override tests) pass since commit ce05084 fixed
those bugs; they stay as regression tests."""

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
    first start the rest are due but held by the rate; ox.ending.done() asks earliest_ready
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
            "INSERT INTO ox_queue (name, paused, overrides, limited, updated_by)"
            " VALUES ('emails', false, '{}', false, '') ON CONFLICT DO NOTHING"
        )

    a = open_worker_connection(connection.alias)
    try:
        a.connection.autocommit = True
        with a.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("SELECT name FROM ox_queue WHERE name = 'emails' FOR UPDATE")
        result = {}

        def gate_b():
            try:
                b_conn = connections_rr()
                now = clock.db_now(b_conn)
                result["b"] = claim_limited(b_conn, "b", limits, (0, 1), now, now + timedelta(seconds=60))
                b_conn.close()
            except Exception as exc:  # noqa: BLE001
                result["error"] = exc

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
        assert "error" not in result, result
    finally:
        a.close()
    running = Task.objects.filter(queue="emails", status=Status.RUNNING).count()
    assert running <= 1, f"{running} RUNNING in a queue limited to 1"


def connections_rr():
    """A worker connection to a server whose default isolation is REPEATABLE READ (ALTER
    DATABASE/ROLE ... SET default_transaction_isolation), as the worker's raw BEGIN gets it."""
    from ox.connection import open_worker_connection

    conn = open_worker_connection(connection.alias)
    with conn.cursor() as cur:
        cur.execute("SET default_transaction_isolation = 'repeatable read'")
    return conn


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
    assert [str(c.id) for c in gated.claimed] == [str(other.id)], (
        "the free key's task was hidden behind the full key's backlog"
    )


def test_raising_a_rate_at_run_time_takes_effect_without_waiting_out_the_old_schedule():
    """Promise: run-time overrides of a queue's limits are in force within a second; a rate
    of N/s gives N starts per second. Broken: the queue's GCRA schedule (ox_queue.rate_tat)
    is stored as an absolute time computed with the old rate's interval. After one start at
    1/h, raising the rate to 100/s (ox_queue --rate, the dashboard) claims nothing: the
    stored tat is an hour ahead, and take() refuses until then, so the queue stays shut for
    up to the old interval (a week, for a 1/7d rate)."""
    from ox.flow.gate import claim_limited
    from ox.flow.limits import QueueLimits, parse_rate

    enqueue_many(f.rated, [((f"r{i}",), {}) for i in range(5)])
    now = clock.db_now(connection) + timedelta(seconds=1)
    lease = now + timedelta(minutes=5)
    slow = {"reports": QueueLimits(rate=parse_rate("1/h"))}
    _w, first = claim_limited(connection, "w", slow, (1, 0), now, lease)
    assert len(first.claimed) == 1
    # Raised at run time (the dashboard, ox_queue limits): set_limits starts the schedule
    # afresh. (Review fix: the test passed the new limits to the gate without the override.)
    from ox.flow import queues

    queues.set_limits("reports", {"rate": "100/s"})
    fast = {"reports": QueueLimits(rate=parse_rate("100/s"))}
    later = now + timedelta(seconds=2)
    _w, second = claim_limited(connection, "w", fast, (4, 0), later, lease)
    assert len(second.claimed) >= 1, f"100/s, yet held back until {second.wake_at}: the 1/h schedule still rules"


def test_a_run_time_override_of_a_queue_whose_rate_has_a_burst_is_not_silently_dropped():
    """Promise: run-time overrides are in force within a second; bad input gets a clear
    error and nothing is lost. Broken: limits.merged() turns the settings into their text
    form (QueueLimits.as_dict: str(Rate)), and a rate with a burst prints as
    "50/s (burst 5)", which parse_rate does not read back; the ValueError is swallowed
    ("an override written by hand that no longer parses: the settings hold"), so EVERY
    override of such a queue (here concurrency=1 during an incident) is ignored, silently,
    by the workers and by `ox_queue status`."""
    from ox.flow import queues
    from ox.flow.limits import merged, parse_limits

    settings = parse_limits({"rate": {"count": 50, "period": 1, "burst": 5}})
    queues.set_limits("reports", {"concurrency": 1})
    state = next(v for v in queues.views({"reports": settings}, ["reports"]) if v.name == "reports")
    assert state.limits.concurrency == 1, f"override {state.overrides} ignored: limits in force {state.limits}"
    assert merged(settings, {"concurrency": 1}).concurrency == 1


def test_a_run_time_rate_override_with_a_burst_is_in_force():
    """Promise: an override written through ox.flow.queues.set_limits (the dashboard, the
    ox_queue command) is in force. Broken: set_limits stores the parsed rate in its text
    form, "10/s (burst 5)", which merged() cannot parse back, so the override is dropped
    silently and the queue runs with its settings (here: no limit at all)."""
    from ox.flow import queues
    from ox.flow.limits import QueueLimits

    queues.set_limits("reports", {"rate": {"count": 10, "period": 1, "burst": 5}})
    state = next(v for v in queues.views({}, ["reports"]) if v.name == "reports")
    assert state.limits.rate is not None and state.limits.rate.burst == 5, (state.overrides, state.limits)
    assert state.limits != QueueLimits()


def test_an_absurd_unique_period_is_refused_with_a_clear_error():
    """Promise: bad input gets a clear error. Broken: Unique accepts any positive finite
    period, so period=1e-300 (or 1e300) passes @task/.using(), and every enqueue then dies
    with a bare OverflowError from unique_key() (window arithmetic / datetime range) instead
    of InvalidTask."""
    from django.tasks.exceptions import InvalidTask

    for period in (1e-300, 1e300):
        with pytest.raises(InvalidTask):
            f.unique_all.using(unique={"period": period}).enqueue(1)


def test_a_run_time_rate_override_with_a_burst_does_not_stop_the_queue(start_worker):
    """Promise: a run-time limit override limits a queue; it never stops it. Broken: the
    override {"rate": {"count": 10, "period": 1, "burst": 5}} is stored as "10/s (burst 5)"
    with ox_queue.limited = true. Workers cannot parse it back (merged() falls back to the
    settings: no limit), so they claim "reports" through the unlimited claim, which skips
    every queue with limited = true (_SKIP_QUEUE), and the gate is never asked: no task of
    the queue ever runs."""
    from ox.flow import queues

    queues.set_limits("reports", {"rate": {"count": 10, "period": 1, "burst": 5}})
    enqueue_many(f.rated, [((f"q{i}",), {}) for i in range(5)])
    worker = start_worker("--queues", "reports", env=options(heartbeat=0.5))
    try:
        wait_until(lambda: Span.objects.count() == 5, timeout=15)
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait(timeout=30)


def test_with_a_period_each_window_has_its_own_task():
    """Decided semantics (docs/flow-control.md, ox.flow.unique): with a period the window is
    part of the key, one task per window, as Oban's and River's periods; a task still READY
    from the previous window does not refuse the next window's call. (The review found this
    contradicting the module's "never a twin" line; the line now says so.) Simulated: the
    READY row's key recomputed as of an hour earlier (the previous window, period 3600)."""
    from ox.flow.unique import is_duplicate, unique_key

    first = f.unique_hourly.enqueue(n=7)
    row = Task.objects.get(pk=first.id)
    earlier = clock.db_now(connection) - timedelta(hours=1)
    key, until = unique_key(f.unique_hourly.unique, f.unique_hourly, row.args, row.kwargs, earlier)
    Task.objects.filter(pk=first.id).update(unique_key=key, unique_until=until)
    second = f.unique_hourly.enqueue(n=7)
    assert not is_duplicate(second) and f.unique_hourly.enqueue(n=7).id == second.id


def test_gate_keeps_claim_order_within_a_key_across_sync_and_async_tasks():
    """Promise: FIFO/priority order holds within a key (and within a queue's concurrency).
    Broken: claim_limited reads the candidates per kind and offers all the sync ones before
    any async one, so with key_concurrency 1 a key's newer sync task takes the slot ahead of
    its older (or higher-priority) async task, whenever the worker has room for both kinds."""
    from ox.flow.gate import claim_limited
    from ox.flow.limits import QueueLimits

    old = f.per_account.using(priority=10).enqueue("old", 0.0, account="k")
    Task.objects.filter(pk=old.id).update(is_async=True)
    time.sleep(0.01)
    f.per_account.enqueue("new", 0.0, account="k")
    limits = {"emails": QueueLimits(key_concurrency=1)}
    now = clock.db_now(connection) + timedelta(seconds=1)
    _w, gated = claim_limited(connection, "w", limits, (1, 1), now, now + timedelta(minutes=5))
    assert [str(c.id) for c in gated.claimed] == [str(old.id)], "the newer, lower-priority sync task went first"


def test_retry_of_a_unique_task_never_reopens_a_row_that_is_running_by_then(monkeypatch):
    """Promise: retry moves FAILED/CANCELLED tasks back to READY, never anything else, and a
    unique task never runs twice at once. Broken: ox.operations._reopen reads the unique
    rows' ids (filtered by status), then updates each by primary key alone, without the
    status condition. A row that changed between the two (a concurrent retry reopened it and
    a worker claimed it: RUNNING) is set back to READY with its lease cleared and its fence
    kept, so a second worker claims it while the first still runs it. Simulated by making the
    row RUNNING between the id read and the per-row UPDATE (the savepoint the loop opens)."""
    from django.db import transaction as dj_transaction
    from django.db.models import F

    from ox import operations

    r = f.unique_fails.enqueue(3)
    Task.objects.filter(pk=r.id).update(status=Status.FAILED, finished_at=clock.db_now(connection))
    orig = dj_transaction.atomic
    calls = []

    def hooked(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # inside _reopen, after the ids were read: a worker claims it now
            Task.objects.filter(pk=r.id).update(
                status=Status.RUNNING, worker_id="other", fence=F("fence") + 1, finished_at=None
            )
        return orig(*args, **kwargs)

    monkeypatch.setattr(operations.transaction, "atomic", hooked)
    operations.retry([r.id])
    monkeypatch.setattr(operations.transaction, "atomic", orig)
    row = Task.objects.get(pk=r.id)
    assert row.status == Status.RUNNING, f"a RUNNING task (worker {row.worker_id!r}) was reopened to {row.status}"


def test_one_keys_rate_does_not_hold_back_the_other_keys_of_its_queue(start_worker):
    """Promise: per-key limits hold back only that key (the gate passes over a held key and
    takes the tasks of other keys); the worker sleeps until the next token of what it waits
    for. Broken: a KEY_RATE hold is recorded per queue (Gated.wake_at[queue], the key's next
    token), and FlowWatch.open_limited leaves the whole queue out until then. Key "a" at
    1/h with a second task waiting: once the gate has seen it, key "b"'s tasks behind it
    wait for a's next token, an hour, though nothing limits b."""
    # (Review fix: the b tasks are five keys of their own, b1..b5; one key "b" at 1/h would
    # rightly start once an hour.)
    calls = [(("a1",), {"account": "a"}), (("a2",), {"account": "a"})]
    calls += [((f"b{i}",), {"account": f"b{i}"}) for i in range(1, 6)]
    for args, kwargs in calls:  # one by one: claim order is enqueue order
        f.rated_per_account.enqueue(*args, **kwargs)
        time.sleep(0.002)
    env = options(limits={"reports": {"key_rate": "1/h"}}, heartbeat=0.5, rescue_interval=0.5)
    worker = start_worker("--concurrency", "1", "--queues", "reports", env=env)
    try:
        wait_until(lambda: Span.objects.filter(group__startswith="b").count() == 5, timeout=15)
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait(timeout=30)
    assert Span.objects.filter(group="a").count() == 1


def test_the_same_call_spelled_positionally_or_by_keyword_is_one_unique_task():
    """Promise: duplicates return the existing task; exactly one live row per unique call.
    Broken: unique=True hashes the raw (args, kwargs) pair, not the call bound to the
    function's signature, so unique_all(1) and unique_all(n=1), the same call of
    `def unique_all(n)`, get different keys and both run. (by=["n"] instead refuses the
    positional spelling outright.)"""
    from ox.flow.unique import is_duplicate

    first = f.unique_all.enqueue(1)
    second = f.unique_all.enqueue(n=1)
    live = Task.objects.filter(task_path=first.task.module_path, status=Status.READY).count()
    assert is_duplicate(second) and live == 1, f"{live} READY copies of unique_all(n=1)"


def test_a_run_time_rate_override_that_does_not_print_back_does_not_stop_the_queue(start_worker):
    """Promise: an override limits a queue, never stops it; bad input gets a clear error.
    Broken: set_limits() accepts {"count": 1, "period": 0.00001} and stores it as the text
    str(Rate) gives, "1/1e-05s" (f"{period:g}s"), which parse_rate cannot read back; with
    ox_queue.limited = true. Workers' merged() falls back to the settings (no limit), so
    they claim the queue through the unlimited claim, which skips limited queues: nothing
    of the queue ever runs, and no error was ever raised."""
    from django.db import DatabaseError

    from ox.flow import queues

    try:
        queues.set_limits("reports", {"rate": {"count": 1, "period": 0.00001}})
    except (ValueError, DatabaseError):
        return  # refused with an error: fine
    state = next(v for v in queues.views({}, ["reports"]) if v.name == "reports")
    enqueue_many(f.rated, [((f"z{i}",), {}) for i in range(3)])
    worker = start_worker("--queues", "reports", env=options(heartbeat=0.5))
    try:
        wait_until(lambda: Span.objects.count() == 3, timeout=15)
    except AssertionError:
        raise AssertionError(f"queue stopped: overrides {state.overrides}, limits in force {state.limits}") from None
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait(timeout=30)
