"""Slots (ox.flow.slots, ox.flow.keeper, ox.flow.local): a queue whose only limit is
`concurrency` is claimed under leased slots, with prefetch, by the ordinary claim. Exact
across workers and kinds, given back when a worker runs out of work or stops, freed when it
dies, taken away when the limit is lowered or another worker took a lapsed lease."""

import signal
import time
from types import SimpleNamespace

import pytest
from django.db import connection

from ox import enqueue_many
from ox.flow import slots
from ox.flow.local import LocalLimits
from ox.flow.queues import set_limits
from ox.models import Attempt, Slot, Status, Task
from tests import flow_tasks as f
from tests.helpers import wait_until
from tests.test_durability import options
from tests.test_flow_limits import drained, limits, most_at_once
from tests.testapp.models import Span

pytestmark = pytest.mark.django_db(transaction=True)


def test_short_tasks_under_slots_are_exact_and_the_slots_go_back_when_the_work_is_done(start_worker):
    """2 workers x 4 threads, limit 2, 300 short tasks: never more than 2 at once, each once,
    both slots used, and once drained every slot is free again (no worker hoards one)."""
    enqueue_many(f.limited, [((f"t{i}", 0.005), {}) for i in range(300)])
    env = limits(emails={"concurrency": 2})
    workers = [start_worker("--concurrency", "4", "--queues", "emails", env=env) for _ in range(2)]
    drained(timeout=120)
    spans = list(Span.objects.all())
    assert len(spans) == 300 and len({s.key for s in spans}) == 300
    assert most_at_once(spans) == 2
    assert Slot.objects.filter(queue="emails").count() == 2
    wait_until(lambda: not Slot.objects.exclude(worker_id="").exists(), timeout=10)
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(timeout=60) == 0


def test_async_and_sync_tasks_share_the_slots(start_worker):
    """Limit 2 over sync and async tasks of one queue, a worker with 4 threads and 20 async
    slots: never more than 2 at once, whatever the kind."""
    enqueue_many(f.limited_async, [((f"a{i}", 0.05), {}) for i in range(30)])
    enqueue_many(f.limited, [((f"s{i}", 0.05), {}) for i in range(30)])
    env = limits(emails={"concurrency": 2})
    start_worker("--concurrency", "4", "--async-concurrency", "20", "--queues", "emails", env=env)
    drained(timeout=120)
    spans = list(Span.objects.all())
    assert len(spans) == 60 and all(s.ended for s in spans)
    # Each ran once, by its own executor (a parked async task resumed into the thread pool
    # ran as a coroutine never awaited: a failed attempt, then a retry).
    assert not Attempt.objects.exists()  # attempts that did not succeed
    assert all(t.attempts == 1 for t in Task.objects.all())
    assert most_at_once(spans) == 2
    assert {s.group for s in spans} == {"", "async"}


def test_a_stopping_worker_gives_its_slots_back(start_worker):
    """SIGTERM while it holds both slots on long tasks: they finish, and the rows are free."""
    enqueue_many(f.limited, [((f"l{i}", 1.0), {}) for i in range(2)])
    env = limits(emails={"concurrency": 2})
    worker = start_worker("--concurrency", "4", "--queues", "emails", env=env)
    wait_until(lambda: Span.objects.count() == 2, timeout=30)
    assert Slot.objects.exclude(worker_id="").count() == 2
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0
    assert not Slot.objects.exclude(worker_id="").exists()
    assert Task.objects.filter(status=Status.SUCCESSFUL).count() == 2


def test_lowering_the_limit_at_run_time_takes_slots_away(start_worker):
    """Limit 4 lowered to 1 while 4 run: those finish, and from then on one at a time."""
    enqueue_many(f.limited, [((f"t{i}", 0.4), {}) for i in range(24)])
    env = limits(emails={"concurrency": 4})
    start_worker("--concurrency", "4", "--queues", "emails", env=env)
    wait_until(lambda: Span.objects.count() >= 4, timeout=30)
    set_limits("emails", {"concurrency": 1}, by="test")
    changed = time.time()
    drained(timeout=120)
    assert Slot.objects.filter(queue="emails").count() == 1
    # Within a second of the change (the worker reads ox_queue at most a second ago) plus
    # the 0.4 s of the tasks running then, one at a time.
    later = [s for s in Span.objects.all() if s.started > changed + 1.5]
    assert later and most_at_once(later) == 1


@pytest.mark.parametrize("window", ["default", None], ids=["prefetch-window", "always-prefetch"])
def test_slots_taken_over_after_a_lapsed_lease_stop_counting_here(start_worker, window):
    """Another worker took both slots (as after this one's lease ran out in an outage): at
    its next heartbeat this worker starts nothing more of the queue; when they are free
    again it goes on. Also with PREFETCH_WINDOW None (always prefetch): the tasks parked
    here with no slot to run on go back (held here they would count as running without a
    slot, and keep every worker, this one too, from taking the slots they wait for)."""
    enqueue_many(f.limited, [((f"t{i}", 0.1), {}) for i in range(40)])
    extra = {} if window == "default" else {"prefetch_window": None}
    env = options(limits={"emails": {"concurrency": 2}}, heartbeat=0.5, rescue_interval=0.5, **extra)
    start_worker("--concurrency", "4", "--queues", "emails", env=env)
    wait_until(lambda: Span.objects.count() >= 4, timeout=30)
    Slot.objects.filter(queue="emails").update(worker_id="elsewhere:1:x", expires_at="2999-01-01T00:00:00Z")
    stolen = time.time()
    time.sleep(2.0)
    quiet_from = stolen + 0.5 + 0.1 + 0.3  # a heartbeat, a task's length, and slack
    assert not Span.objects.filter(started__gt=quiet_from).exists()
    Slot.objects.filter(queue="emails").update(worker_id="", expires_at=None)
    drained(timeout=120)
    assert Span.objects.count() == 40
    assert most_at_once(list(Span.objects.all())) <= 2


def test_no_slot_no_claim(start_worker):
    """A worker that holds no slot (both held by a live worker running long tasks) claims
    none of the queue's tasks: nothing of it waits parked there for a slot it cannot get."""
    enqueue_many(f.limited, [((f"l{i}", 3.0), {}) for i in range(2)])
    env = limits(emails={"concurrency": 2})
    start_worker("--concurrency", "2", "--queues", "emails", env=env)
    wait_until(lambda: Span.objects.count() == 2, timeout=30)
    waiting = enqueue_many(f.limited, [((f"w{i}", 0.0), {}) for i in range(5)])
    other = start_worker("--concurrency", "4", "--queues", "emails", env=env)
    time.sleep(1.5)
    assert all(Task.objects.get(pk=r.id).status == Status.READY for r in waiting)
    other.signal(signal.SIGTERM)
    assert other.wait(timeout=30) == 0


def test_take_never_gives_one_slot_to_two_workers():
    """The statement itself, repeated from two connections' points of view: what two takers
    get never overlaps and never exceeds the rows; a lapsed lease is free; renewal returns
    only what is still held."""
    from datetime import timedelta

    from ox import clock

    slots.size(connection, "q", 3)
    now = clock.db_now(connection)
    a = slots.take(connection, "w:a", "q", 2, now, now + timedelta(seconds=30))
    b = slots.take(connection, "w:b", "q", 5, now, now + timedelta(seconds=30))
    assert len(a) == 2 and len(b) == 1 and not set(a) & set(b)
    assert slots.take(connection, "w:c", "q", 1, now, now + timedelta(seconds=30)) == []
    Slot.objects.filter(worker_id="w:b").update(expires_at=now - timedelta(seconds=1))
    c = slots.take(connection, "w:c", "q", 1, now, now + timedelta(seconds=30))
    assert c == b
    assert slots.renew(connection, "w:b", now + timedelta(seconds=30)) == {}
    # A lower limit deletes free rows past it; held ones stay until their holder retires
    # them (what runs on them finishes first), so a limit raised again meanwhile finds none free.
    slots.give_back(connection, "w:c", "q", c)
    slots.size(connection, "q", 1)
    assert sorted(Slot.objects.filter(queue="q").values_list("n", flat=True)) == [0, 1]
    slots.size(connection, "q", 2)
    assert slots.take(connection, "w:d", "q", 2, now, now + timedelta(seconds=30)) == []
    slots.retire(connection, "w:a", "q", [1], 1)
    assert slots.renew(connection, "w:a", now + timedelta(seconds=30)) == {"q": {0}}
    assert Slot.objects.filter(queue="q").count() == 1


_SEQ = iter(range(10**6))


def _prep(key: str, queue: str = "q", is_async: bool = False, priority: int = 0):
    claimed = SimpleNamespace(queue=queue, priority=priority, run_after=next(_SEQ), id=key)
    return SimpleNamespace(key=(key, 1), is_async=is_async, claimed=claimed)


def test_local_limits_park_in_order_and_release_as_slots_free():
    local = LocalLimits()
    assert local.admit(_prep("free", queue="other"))  # not slotted here: no limit
    local.set_allowance("q", 2)
    a, b, c, d = (_prep(k) for k in "abcd")
    assert local.admit(a) and local.admit(b)
    assert not local.admit(c) and not local.admit(d)
    assert local.finished(a) == [c]  # claim order kept
    assert local.admit(c)  # resumed ones are admitted already
    assert local.set_allowance("q", 3) == [d]
    assert local.finished(_prep("never-admitted")) == []
    assert local.in_use("q") == 3
    local.set_allowance("q", 0)
    e = _prep("e")
    assert not local.admit(e)
    assert local.take_parked(is_async=True) == [] and local.take_parked(is_async=False) == [e]
    f_ = _prep("f")
    assert not local.admit(f_)
    assert local.set_allowance("q", None) == [f_]  # no longer slotted: everything may start
    # A more urgent task claimed later starts before the ones parked earlier.
    local.set_allowance("r", 1)
    g, h, urgent = _prep("g", "r"), _prep("h", "r"), _prep("urgent", "r", priority=10)
    assert local.admit(g) and not local.admit(h) and not local.admit(urgent)
    assert local.finished(g) == [urgent]
    assert local.take_queue("r") == [h]


def test_a_parked_task_cancelled_ends_at_once_not_when_a_slot_frees(start_worker):
    """Limit 1, one long task running and short ones parked behind it in the same worker
    (prefetched): cancelling a parked one makes it CANCELLED within a few seconds, while the
    long task still holds the only slot."""
    from ox.operations import cancel as ox_cancel

    long = f.limited.enqueue("long", 20.0)
    time.sleep(0.01)
    parked = enqueue_many(f.limited, [((f"p{i}", 0.0), {}) for i in range(3)])
    # PREFETCH_WINDOW None: they stay parked behind the long task (with the window they go
    # back 50 ms after it starts, and the test would race that to see them parked).
    env = options(limits={"emails": {"concurrency": 1}}, heartbeat=0.5, rescue_interval=0.5, prefetch_window=None)
    worker = start_worker("--concurrency", "4", "--queues", "emails", env=env)
    wait_until(lambda: Span.objects.filter(key="long").exists(), timeout=30)
    wait_until(lambda: Task.objects.filter(pk=parked[0].id, status=Status.RUNNING).exists(), timeout=30)
    ox_cancel([parked[0].id])
    wait_until(lambda: Task.objects.get(pk=parked[0].id).status == Status.CANCELLED, timeout=10)
    assert Task.objects.get(pk=long.id).status == Status.RUNNING
    assert not Span.objects.filter(key="p0").exists()
    Task.objects.filter(pk=long.id).update(cancel_requested=True)
    drained(timeout=60)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_operators_see_the_slots_held_and_why_a_task_waits(start_worker):
    """queue_flows / why_waiting (the dashboard, `ox_queue status`) for a slotted queue: the
    slots held (not the RUNNING rows, which count parked prefetched tasks too) and the reason."""
    from ox.flow.waiting import queue_flows, why_waiting

    set_limits("emails", {"concurrency": 2}, by="test")
    enqueue_many(f.limited, [((f"l{i}", 5.0), {}) for i in range(2)])
    worker = start_worker("--concurrency", "4", "--queues", "emails", env=limits())
    wait_until(lambda: Span.objects.count() == 2, timeout=30)
    (waiting,) = enqueue_many(f.limited, [(("w", 0.0), {})])
    flow = queue_flows(["emails"])[0]
    assert flow.slots_held == 2 and flow.full
    assert "2 of 2 running" in " ".join(flow.reasons)
    task = Task.objects.get(pk=waiting.id)
    if task.status == Status.READY:  # not claimed (parked) by the worker yet
        assert "2 of 2 running" in (why_waiting(task) or "")
    Task.objects.filter(status=Status.RUNNING).update(cancel_requested=True)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0


def test_tasks_running_without_a_slot_use_the_limit_too():
    """A task the gate started (a worker serving a queue with a rate as well, or before the
    queue was slotted) runs without a slot: the slots free for the taking are fewer by it."""
    from datetime import timedelta

    from ox import clock

    slots.size(connection, "emails", 2)
    now = clock.db_now(connection)
    r = f.limited.enqueue("gated", 1.0)
    Task.objects.filter(pk=r.id).update(status=Status.RUNNING, worker_id="gate:1:x", lease_expires_at=now)
    assert slots.take(connection, "w:a", "emails", 2, now, now + timedelta(seconds=30)) == [0]
    Task.objects.filter(pk=r.id).update(status=Status.SUCCESSFUL)
    assert slots.take(connection, "w:a", "emails", 1, now, now + timedelta(seconds=30)) == [1]
    # A slot holder's own RUNNING tasks (parked ones too) are not counted twice.
    assert slots.take(connection, "w:b", "emails", 1, now, now + timedelta(seconds=30)) == []
