"""Second adversarial pass over flow control (after the fixes of commit 1632216). Each test
fails, when written, because of the bug its docstring names: the promise (docs/flow-control.md)
and how it is broken."""

import json
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.tasks import task
from django.tasks.exceptions import InvalidTask
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ox import clock, enqueue_many
from ox.flow.gate import claim_limited
from ox.flow.limits import QueueLimits, Rate, merged, parse_rate, take
from ox.models import QueueState, Status, Task
from tests import flow_tasks as f
from tests.conftest import ROOT
from tests.helpers import wait_until
from tests.test_durability import options
from tests.testapp.models import Span

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = timedelta(minutes=5)

# A sentinel default, the usual Python idiom for "not given".
_UNSET = object()


@task(unique=True)
def unique_with_sentinel(n: int, since: object = _UNSET) -> int:
    return n


@task(unique={"by": [0]})
def unique_by_position(n: int) -> int:
    return n


def claims_of(worker) -> int:
    return sum(int(m) for m in re.findall(r"worker stopped .*?claims=(\d+)", worker.output()))


def _gate(limits, demand, now=None):
    now = now or clock.db_now(connection) + timedelta(seconds=1)
    _w, gated = claim_limited(connection, "w-attack", limits, demand, now, now + LEASE)
    return gated


def _full_key_backlog(n: int = 1100, account: str = "big") -> None:
    """n due tasks of one key in "emails", the first RUNNING (key_concurrency 1: the key is full)."""
    enqueue_many(f.per_account, [((f"{account}{i}", 0.0), {"account": account}) for i in range(n)])
    first = Task.objects.filter(limit_key=f'"{account}"').order_by("run_after", "id").first()
    Task.objects.filter(pk=first.pk).update(
        status=Status.RUNNING, worker_id="x", lease_expires_at=clock.db_now(connection) + LEASE
    )
    time.sleep(0.01)


# ------------------------------------------------------------------ the window and the key walk


def test_a_keyless_task_behind_a_window_of_a_full_key_is_claimed():
    """Promise: "a task whose key is full is passed over and the tasks behind it of other
    keys start"; "a task without a key is not held by key limits"; "tasks of full keys at the
    head never hide the rest". Broken: past WINDOW_MAX the gate only walks the queue's keys
    (ox.flow.keywalk: `limit_key IS NOT NULL`): a task with no limit key behind 1,000+ tasks
    of a full key is never a candidate, so the claim takes nothing while slots are free, for
    as long as the full key's backlog lasts."""
    _full_key_backlog()
    free = f.limited.enqueue("keyless", 0.0)  # queue "emails", no limit key
    limits = {"emails": QueueLimits(key_concurrency=1)}
    gated = _gate(limits, (4, 0))
    assert [str(c.id) for c in gated.claimed] == [str(free.id)], "the keyless task is hidden behind the full key"


def test_an_unlimited_queues_task_behind_a_full_keys_backlog_is_claimed():
    """Promise: "A worker serving limited and unlimited queues claims all of them through the
    gate, in one priority order (a limited queue's backlog never runs ahead of a more urgent
    task of an unlimited one)" -- and, before the fix, the unlimited queue was claimed on its
    own. Broken: the gate's window is one list over all the worker's queues; when its first
    1,000 due tasks are a full key's backlog in the limited queue, the key walk skips the
    unlimited queue (`if not decision.limits[queue].keyed: continue`), so an unlimited
    queue's task enqueued after the backlog is never claimed by such a worker."""
    _full_key_backlog()
    other = f.limited.using(queue_name="other").enqueue("other", 0.0)
    limits = {"emails": QueueLimits(key_concurrency=1), "other": QueueLimits()}
    gated = _gate(limits, (4, 0))
    assert [str(c.id) for c in gated.claimed] == [str(other.id)], "the unlimited queue's task is hidden"


def test_a_worker_serving_a_limited_and_an_unlimited_queue_runs_the_unlimited_ones_task(start_worker):
    """Promise: as the test above, with a real worker (`runworker --queues emails,other`,
    LIMITS emails key_concurrency 1): the unlimited queue "other" is not held by any limit.
    Broken: one account's backlog of 1,100 tasks in "emails" (its first running for 20 s)
    fills the gate's window; the worker's free slot claims nothing, and the task of "other"
    waits for the whole backlog (here: 20 s and more) though nothing limits "other"."""
    f.per_account.enqueue("big-long", 20.0, account="big")
    time.sleep(0.01)
    enqueue_many(f.per_account, [((f"big{i}", 0.0), {"account": "big"}) for i in range(1100)])
    time.sleep(0.01)
    f.limited.using(queue_name="other").enqueue("other-task", 0.0)
    env = options(limits={"emails": {"key_concurrency": 1}}, heartbeat=0.5)
    worker = start_worker("--concurrency", "2", "--queues", "emails,other", env=env)
    try:
        wait_until(lambda: Span.objects.filter(key="big-long").exists(), timeout=20)
        wait_until(lambda: Span.objects.filter(key="other-task").exists(), timeout=8)
    finally:
        worker.signal(signal.SIGKILL)
        worker.wait(timeout=30)


def test_the_key_walk_reaches_a_free_key_past_a_thousand_keys_with_nothing_due():
    """Promise: "tasks of full keys at the head never hide the rest", the walk "takes the
    first due task of each" other key. Broken: the walk steps through the keys of every READY
    task, due or not, and stops after WALK_MAX (1,000) keys: 1,000 keys whose only task is
    scheduled an hour ahead (say, one reminder per customer) sort before the free key "b",
    so its due task is never reached behind a full key's backlog; nothing is claimed."""
    later = f.per_account.using(run_after=timedelta(hours=1))
    enqueue_many(later, [((f"a{i}", 0.0), {"account": f"a{i:04d}"}) for i in range(1000)])
    _full_key_backlog()
    free = f.per_account.enqueue("b", 0.0, account="b")
    gated = _gate({"emails": QueueLimits(key_concurrency=1)}, (4, 0))
    assert [str(c.id) for c in gated.claimed] == [str(free.id)], "the free key past 1,000 keys is never walked to"


def test_the_key_walk_keeps_claim_order_within_a_key_across_sync_and_async_tasks():
    """Promise: "order holds within a key, for sync and async tasks alike" (the fix "sync and
    async candidates merged in claim order"). Broken in the key walk: it walks the sync kind,
    offers its heads, and only then the async kind; so past a full key's window, key k's newer
    sync task takes k's slot (key_concurrency 1) ahead of k's older async task, though the
    worker asked for both kinds."""
    _full_key_backlog(1100)
    more = enqueue_many(f.per_account, [((f"bigA{i}", 0.0), {"account": "big"}) for i in range(1100)])
    Task.objects.filter(pk__in=[r.id for r in more]).update(is_async=True)
    time.sleep(0.01)
    old = f.per_account.enqueue("k-old-async", 0.0, account="k")
    Task.objects.filter(pk=old.id).update(is_async=True)
    time.sleep(0.01)
    f.per_account.enqueue("k-new-sync", 0.0, account="k")
    gated = _gate({"emails": QueueLimits(key_concurrency=1)}, (1, 1))
    assert [str(c.id) for c in gated.claimed] == [str(old.id)], "k's newer sync task went before its older async one"


def test_claim_order_within_a_key_holds_when_the_claim_has_no_room_for_the_other_kind():
    """Promise: "order holds within a key, for sync and async tasks alike". Broken: a claim
    with no async room (every worker between its async probes asks for 0 async tasks, and a
    worker whose async slots are busy) reads no async candidates, so key k's newer sync task
    starts while k's older async task waits behind it (key_concurrency 1)."""
    old = f.per_account.enqueue("old", 0.0, account="k")
    Task.objects.filter(pk=old.id).update(is_async=True)
    time.sleep(0.01)
    f.per_account.enqueue("new", 0.0, account="k")
    gated = _gate({"emails": QueueLimits(key_concurrency=1)}, (1, 0))
    assert gated.claimed == [], "k's newer sync task started ahead of k's older async task"


def test_past_the_window_free_keys_start_in_claim_order():
    """Promise: "within a queue tasks start in claim order (priority, then due time, then
    id); a task whose key is full is passed over". Broken past the window: the key walk takes
    free keys' heads in key (alphabetical) order, not claim order: key "z"'s task, enqueued
    first, waits while key "a"'s later one starts. (Documented as "in key order", but it
    contradicts the order promise: a low key name jumps the queue.)"""
    _full_key_backlog()
    first = f.per_account.enqueue("z-first", 0.0, account="z")
    time.sleep(0.01)
    f.per_account.enqueue("a-second", 0.0, account="a")
    gated = _gate({"emails": QueueLimits(key_concurrency=1)}, (1, 0))
    assert [str(c.id) for c in gated.claimed] == [str(first.id)], "a later task of a lower key name went first"


# ------------------------------------------------------------------ rates


def test_resaving_unrelated_limits_does_not_reset_the_rate():
    """Promise: "at most N starts per period"; "A rate changed at run time starts its
    schedule afresh" (only a changed rate). Broken: the dashboard's limit form is prefilled
    with the overrides in force (initial_for), so raising the concurrency submits the same
    rate again; set_limits resets ox_queue.rate_tat whenever "rate" is among the fields, so
    a queue at 1/h that started a task a second ago starts another at once. An operator (or
    anyone re-saving the form) gets one extra start per save."""
    from dashboard.queue_forms import LimitForm, initial_for
    from ox.flow import queues

    enqueue_many(f.rated, [((f"r{i}",), {}) for i in range(5)])
    queues.set_limits("reports", {"rate": "1/h"})
    state = QueueState.objects.get(name="reports")
    now = clock.db_now(connection) + timedelta(seconds=1)
    first = _gate({"reports": merged(QueueLimits(), state.overrides)}, (4, 0), now)
    assert len(first.claimed) == 1
    # The operator raises the concurrency on the Queues page: the form carries the rate as shown.
    data = {**initial_for("reports", state.overrides), "concurrency": "5"}
    form = LimitForm(data)
    assert form.is_valid(), form.errors
    queues.set_limits("reports", form.overrides())
    state = QueueState.objects.get(name="reports")
    lim = merged(QueueLimits(), state.overrides)
    assert lim.rate == parse_rate("1/h") and lim.concurrency == 5
    second = _gate({"reports": lim}, (4, 0), now + timedelta(seconds=1))
    assert second.claimed == [], "the unchanged 1/h rate allowed a second start a second after the first"


_BURSTY = st.integers(min_value=2, max_value=12).flatmap(
    lambda count: st.tuples(
        st.just(count), st.sampled_from([1.0, 10.0, 60.0]), st.integers(min_value=1, max_value=count)
    )
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(rate=(10, 1.0, 5), gaps=[0.0] * 5 + [0.1] * 9)
@given(rate=_BURSTY, gaps=st.lists(st.floats(min_value=0.0, max_value=0.5), min_size=1, max_size=60))
def test_a_rate_never_allows_more_than_its_count_and_burst_in_any_period(rate, gaps):
    """Promise: "rate limits (at most N starts per period per queue, or per key)"; limits.py:
    "rate: at most N starts per period ... with `burst` starts allowed at once". Broken with
    burst B > 1: the GCRA lets B start at once after a quiet spell and then one every
    period/N, so a window of one period holds N + B - 1 starts (10/s burst 5: 14 starts in
    the first second). Claim attempts at arbitrary times (gaps in periods), counted in every
    window of one period (less a microsecond, so float noise of the 1e-9 slack is not
    counted)."""
    count, period, burst = rate
    r = Rate(count, period, burst)
    tat, now, starts = None, 1_000_000.0, []
    for gap in gaps:
        now += gap * period
        new = take(tat, now, r)
        if new is not None:
            tat = new
            starts.append(now)
    # Decided (docs/flow-control.md): a burst B is on top of the rate, as a token bucket of
    # B: at most N + B - 1 starts in any one period, and exactly N with burst 1 (the default).
    for i, s in enumerate(starts):
        inside = [t for t in starts[i:] if t < s + period - 1e-6]
        assert len(inside) <= count + burst - 1, f"{len(inside)} starts within one period of {r}"


def test_a_worker_held_by_its_queues_rate_does_not_spin_on_a_keys_earlier_wake(start_worker):
    """Promise: "A worker held back by a rate sleeps until the next start is allowed; it does
    not poll." Broken: one claim that is refused both by a key's rate (a's next token in 2 s)
    and by the queue's own rate (its next in 10 s) records wake_at = the key's (earlier) and
    hold_until = the queue's. At the key's wake the worker skips the queue (held until
    later), so the gate never replaces wake_at, which is now in the past: _schedule_poll
    sleeps 1 ms, over and over, for the 8 s until the queue's hold ends: thousands of claim
    rounds where one is due. (Rates: queue 2 per 20 s with burst 2, key 1 per 2 s.)"""
    for key, account in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("c1", "c")):
        f.rated_per_account.enqueue(key, account=account)
        time.sleep(0.005)
    limits = {"reports": {"rate": {"count": 2, "period": 20, "burst": 2}, "key_rate": "1/2s"}}
    env = options(limits=limits, heartbeat=0.5, rescue_interval=0.5)
    worker = start_worker("--concurrency", "4", "--queues", "reports", env=env)
    try:
        wait_until(lambda: Span.objects.filter(key__in=["a1", "b1"]).count() == 2, timeout=20)
        time.sleep(8)  # the key's token is due at 2 s, the queue's at 10 s
    finally:
        worker.signal(signal.SIGTERM)
        worker.wait(timeout=30)
    claims = claims_of(worker)
    assert claims < 60, f"{claims} claim rounds in about 8 s while a rate held the queue back"


# ------------------------------------------------------------------ unique keys


def test_a_unique_task_with_a_sentinel_default_is_one_task_across_processes(worker_env):
    """Promise: "equal calls hash equally however they are spelled"; "Of 8 processes
    enqueueing the same 50 keys at the same instant, exactly one row per key is written".
    Broken: bound() fills in the defaults and _text() writes a value JSON cannot say as its
    repr(); the repr of `_UNSET = object()` (the usual "not given" sentinel), of a function
    or of any object without its own __repr__ holds its memory address, different in every
    process (and every restart). So the same call unique_with_sentinel(1), enqueued by two
    processes, gets two keys and two READY rows."""
    code = (
        "import django; django.setup();"
        " from tests.test_attack_flow2 import unique_with_sentinel as t; print(t.enqueue(1).id)"
    )
    for _ in range(2):
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=worker_env, check=True, timeout=120)
    path = unique_with_sentinel.module_path
    live = Task.objects.filter(task_path=path, status=Status.READY).count()
    assert live == 1, f"{live} READY copies of the same unique call, one per process"


def test_unique_by_position_accepts_the_same_call_spelled_by_keyword():
    """Promise: "The call is bound to the function's signature first, defaults filled in, so
    f(1), f(n=1) ... are one call" (by: "argument names or positional indexes"). Broken: a
    `by` position reads the raw positional arguments, not the bound call: with by=[0],
    f(1) is enqueued and f(n=1), the same call, is refused with InvalidTask ("uses
    positional argument 0, but the call has 0"). The same holds for limit_by=[0]."""
    from ox.flow.unique import is_duplicate

    first = unique_by_position.enqueue(1)
    try:
        second = unique_by_position.enqueue(n=1)
    except InvalidTask as exc:
        pytest.fail(f"the keyword spelling of the same call was refused: {exc}")
    assert is_duplicate(second) and second.id == first.id


def test_a_rate_raised_at_run_time_frees_a_running_worker_held_by_the_old_one(start_worker):
    """Promise: "running workers read the new limits within a second"; "A rate changed at run
    time starts its schedule afresh". Broken where no NOTIFY reaches the worker (SQLite; a
    PostgreSQL worker with NOTIFY off or pooled without LISTEN_DATABASE): FlowWatch.refresh reads the new rate, but the
    queue's hold_until from the old rate (1/h: an hour ahead) is kept, and open_limited
    leaves the queue out until then; raised to 100/s, the queue still starts nothing for
    the rest of the hour. (On PostgreSQL with a listener the NOTIFY clears the hold.)"""
    from ox.flow import queues

    enqueue_many(f.rated, [((f"r{i}",), {}) for i in range(4)])
    # NOTIFY off (PostgreSQL workers then poll, as behind a transaction pooler): what SQLite does.
    env = options(limits={"reports": {"rate": "1/h"}}, heartbeat=0.5, rescue_interval=0.5, notify=False)
    worker = start_worker("--concurrency", "2", "--queues", "reports", env=env)
    try:
        wait_until(lambda: Span.objects.count() == 1, timeout=20)
        time.sleep(1.5)  # the worker has met the 1/h hold (its second slot asked the gate)
        assert Span.objects.count() == 1
        queues.set_limits("reports", {"rate": "100/s"})
        wait_until(lambda: Span.objects.count() == 4, timeout=6)
    finally:
        worker.signal(signal.SIGKILL)
        worker.wait(timeout=30)


SCHEDULED_PG = """
INSERT INTO ox_task (id, task_path, queue, priority, status, args, kwargs, run_after, enqueued_at,
                     attempts, max_attempts, worker_id, fence, cancel_requested, is_async, limit_key)
SELECT gen_random_uuid(), 'tests.flow_tasks.per_account', 'emails', %s, 'READY', '[]', '{}',
       now() + interval '1 day' + i * interval '1 millisecond', now(), 0, 3, '', 0, false, false, '"sched"'
FROM generate_series(1, %s) AS i
"""


def _walk_buffers() -> int:
    """Shared buffers one key walk of "emails" (sync, "big" skipped) touches."""
    from ox.flow import keywalk

    seen: list[tuple[str, list]] = []

    def capture(execute, sql, params, many, context):
        seen.append((sql, params))
        return execute(sql, params, many, context)

    now = clock.db_now(connection) + timedelta(seconds=1)
    with connection.execute_wrapper(capture):
        keywalk.free_key_heads(connection, "emails", now, ['"big"'])
    walk_sql, params = seen[0]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {walk_sql}", params)
        plan = cursor.fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    top = plan[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


@pytest.mark.skipif(connection.vendor != "postgresql", reason="buffers are PostgreSQL's")
@pytest.mark.parametrize("priority", [0, 5], ids=["same priority", "higher priority"])
def test_the_key_walk_does_not_read_a_keys_scheduled_backlog(priority):
    """Promise: "past that it walks the queue's other keys ... tasks of full keys at the head
    never hide the rest, and what a claim reads does not grow with the backlog". Broken: the
    walk's head probe per key (`limit_key = k AND run_after <= now ORDER BY priority DESC,
    run_after, id LIMIT 1` over ox_task_ready_key) cannot bound the scan by run_after (the
    index has priority before it), so a free key with N tasks scheduled for tomorrow is read
    entry by entry on every walk: the buffers grow with N (fivefold backlog, about fivefold
    reads), on every claim of every worker while a full key's backlog fills the window."""
    _full_key_backlog()
    with connection.cursor() as cursor:
        cursor.execute(SCHEDULED_PG, [priority, 4000])
        cursor.execute("VACUUM (ANALYZE) ox_task")
    small = _walk_buffers()
    with connection.cursor() as cursor:
        cursor.execute(SCHEDULED_PG, [priority, 16000])
        cursor.execute("VACUUM (ANALYZE) ox_task")
    large = _walk_buffers()
    assert large <= small * 1.5 + 12, f"the walk read {small} buffers, then {large} with a fivefold scheduled backlog"


def test_a_claim_that_fills_the_queue_reads_no_further(monkeypatch):
    """Promise: "Waiting on a limit costs nothing"; the longer windows and the key walk are
    for "when full keys fill it". Broken: once any key was refused, _offer goes on reading
    windows four times as long (up to 1,000 tasks) and then walks up to 1,000 keys even after
    the queue reached its concurrency limit in this very claim, when nothing it finds can be
    taken: here one full key's tasks at the head (key_concurrency 1), a free task behind them
    filling concurrency 2, and the claim still reads three more windows and walks the keys."""
    from ox.flow import gate

    _full_key_backlog(11)
    enqueue_many(f.per_account, [((f"o{i}", 0.0), {"account": f"o{i:04d}"}) for i in range(1100)])
    reads = {"windows": 0, "walks": 0}
    real_candidates, real_walk = gate._candidates, gate.free_key_heads

    def candidates(*args, **kwargs):
        reads["windows"] += 1
        return real_candidates(*args, **kwargs)

    def walk(*args, **kwargs):
        reads["walks"] += 1
        return real_walk(*args, **kwargs)

    monkeypatch.setattr(gate, "_candidates", candidates)
    monkeypatch.setattr(gate, "free_key_heads", walk)
    gated = _gate({"emails": QueueLimits(concurrency=2, key_concurrency=1)}, (4, 0))
    assert len(gated.claimed) == 1 and gated.blocked == {"emails": gate.CONCURRENCY}
    # PostgreSQL reads the first windows with the lock; SQLite reads one per kind (a queue with
    # key limits is read for both kinds, for order within a key).
    first_read = 0 if connection.vendor == "postgresql" else 2
    assert reads["walks"] == 0 and reads["windows"] == first_read, (
        f"a queue already full read {reads['windows'] - first_read} more windows, walked its keys {reads['walks']}x"
    )


def test_a_batch_worker_does_not_spin_on_a_task_the_gate_never_offers(start_worker):
    """Promise: "runworker --batch waits for due tasks a limit holds back instead of exiting,
    claiming once a poll interval" (no busy claim loop). Broken, with the hidden unlimited
    task above: ox.ending.due_waiting looks at the queues no limit holds back ("other"), finds its
    task due and sets more_waiting; the claim (through the gate) never sees it behind the
    full key's window, and the loop claims again at once: back-to-back gate claims, each
    reading 1,000 candidates and walking the keys, for as long as the backlog lasts."""
    env = options(limits={"emails": {"key_concurrency": 1}}, heartbeat=0.5)
    f.per_account.enqueue("big-long", 30.0, account="big")
    holder = start_worker("--concurrency", "1", "--queues", "emails", env=env)
    wait_until(lambda: Span.objects.filter(key="big-long").exists(), timeout=20)
    enqueue_many(f.per_account, [((f"big{i}", 0.0), {"account": "big"}) for i in range(1100)])
    time.sleep(0.01)
    f.limited.using(queue_name="other").enqueue("other-task", 0.0)
    batch = start_worker("--batch", "--concurrency", "2", "--queues", "emails,other", env=env)
    try:
        time.sleep(5)
    finally:
        batch.signal(signal.SIGTERM)
        batch.wait(timeout=30)
        holder.signal(signal.SIGKILL)
        holder.wait(timeout=30)
    claims = claims_of(batch)
    assert claims < 30, f"the batch worker made {claims} claims in 5 s"


def test_the_key_walk_is_not_used_up_by_keys_that_are_full_too():
    """Promise: "a task whose key is full is passed over and the tasks behind it of other
    keys start"; "tasks of full keys at the head never hide the rest". Broken: the walk skips
    only the keys refused within the window, and takes LIMIT `want` heads in key order before
    the limits look at them: four keys a0..a3 each running a task (key_concurrency 1) with
    one more waiting behind the full key's backlog use up a claim of four; their heads are
    refused, and the free key "b" is never reached, on every claim, for as long as a0..a3 run."""
    _full_key_backlog()
    for i in range(4):
        running = f.per_account.enqueue(f"a{i}-run", 0.0, account=f"a{i}")
        Task.objects.filter(pk=running.id).update(
            status=Status.RUNNING, worker_id="x", lease_expires_at=clock.db_now(connection) + LEASE
        )
        f.per_account.enqueue(f"a{i}-next", 0.0, account=f"a{i}")
    free = f.per_account.enqueue("b", 0.0, account="b")
    gated = _gate({"emails": QueueLimits(key_concurrency=1)}, (4, 0))
    assert [str(c.id) for c in gated.claimed] == [str(free.id)], "full keys a0..a3 used up the walk; b never reached"
