"""Concurrency and rate limits (ox.flow.gate) with real worker subprocesses: exact across
workers, slots freed by every way a task stops running, order kept within a key, starts
spread by a rate, and no polling while a limit holds tasks back."""

import re
import signal
import time

import pytest
from django.db import connection

from ox import enqueue_many
from ox.models import Status, Task
from tests import flow_tasks as f
from tests.helpers import wait_until
from tests.test_durability import options
from tests.testapp.models import Span

pytestmark = pytest.mark.django_db(transaction=True)


def most_at_once(spans, group: str | None = None) -> int:
    """The largest number of spans (of one group) open at the same instant."""
    edges = []
    for s in spans:
        if group is None or s.group == group:
            edges += [(s.started, 1), (s.ended, -1)]
    edges.sort(key=lambda e: (e[0], e[1]))  # an end before a start at the same instant
    now = peak = 0
    for _at, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def drained(timeout: float) -> None:
    wait_until(lambda: not Task.objects.filter(status__in=[Status.READY, Status.RUNNING]).exists(), timeout=timeout)


def limits(**queues) -> dict[str, str]:
    return options(limits=queues, heartbeat=0.5, rescue_interval=0.5)


def test_global_concurrency_is_exact_across_workers(start_worker):
    """4 workers x 8 threads, limit 3: never more than 3 running, and 3 are used."""
    enqueue_many(f.limited, [((f"t{i}", 0.15), {}) for i in range(60)])
    env = limits(emails={"concurrency": 3})
    for _ in range(4):
        start_worker("--concurrency", "8", "--queues", "emails", env=env)
    drained(timeout=120)
    spans = list(Span.objects.all())
    assert len(spans) == 60 and len({s.key for s in spans}) == 60  # each ran once
    assert all(s.ended for s in spans)
    assert most_at_once(spans) == 3


def test_per_key_concurrency_keeps_order_within_a_key(start_worker):
    calls = [((f"{k}{i:02d}", 0.05), {"account": k}) for i in range(8) for k in "abc"]
    enqueue_many(f.per_account, calls)
    env = limits(emails={"key_concurrency": 1})
    for _ in range(2):
        start_worker("--concurrency", "4", "--queues", "emails", env=env)
    drained(timeout=120)
    spans = list(Span.objects.all())
    assert len(spans) == 24
    for k in "abc":
        assert most_at_once(spans, k) == 1
        ordered = [s.key for s in sorted((s for s in spans if s.group == k), key=lambda s: s.started)]
        assert ordered == [f"{k}{i:02d}" for i in range(8)]  # FIFO within the key
    assert most_at_once(spans) >= 2  # other keys ran alongside


def test_a_timed_out_task_frees_its_slot(start_worker):
    """Limit 1: a task that times out gives the slot to the next one."""
    from tests import tasks

    first = tasks.times_out.using(queue_name="emails").enqueue()  # timeout 0.5 s
    time.sleep(0.01)
    after = enqueue_many(f.limited, [((f"n{i}", 0.01), {}) for i in range(3)])
    start_worker("--queues", "emails", "--concurrency", "2", env=limits(emails={"concurrency": 1}))
    drained(timeout=60)
    assert Task.objects.get(pk=first.id).status == Status.FAILED
    assert all(Task.objects.get(pk=r.id).status == Status.SUCCESSFUL for r in after)


def test_a_killed_workers_slot_is_freed_by_the_rescue(start_worker):
    """Limit 1, the slot held by a worker that is SIGKILLed mid-task: the other worker
    rescues the task, and the slot is free again: the rescued task (first in line, it has
    attempts left) starts its second run there."""
    long = f.limited.enqueue("long", 60.0)
    env = limits(emails={"concurrency": 1})
    if connection.vendor == "sqlite":  # no liveness lock there: rescue waits for the lease
        env = options(limits={"emails": {"concurrency": 1}}, lease=3.0, heartbeat=0.5, rescue_interval=0.5)
    holder = start_worker("--queues", "emails", env=env)
    wait_until(lambda: Span.objects.filter(key="long").exists(), timeout=30)
    rest = enqueue_many(f.limited, [((f"r{i}", 0.01), {}) for i in range(3)])
    other = start_worker("--queues", "emails", env=env)
    time.sleep(1.0)
    assert not Span.objects.filter(key__startswith="r").exists()  # the limit holds them back
    holder.signal(signal.SIGKILL)
    holder.wait(timeout=10)
    wait_until(lambda: Span.objects.filter(key="long").count() == 2, timeout=60)
    assert Task.objects.get(pk=long.id).attempts == 2
    assert not Span.objects.filter(key__startswith="r").exists()  # one at a time still
    Task.objects.filter(pk=long.id).update(cancel_requested=True)
    wait_until(lambda: all(Task.objects.get(pk=r.id).status == Status.SUCCESSFUL for r in rest), timeout=60)
    other.signal(signal.SIGTERM)


def test_rate_limit_spreads_starts_and_the_worker_sleeps_until_the_next_token(start_worker):
    """50/s for 20 s across two workers: 950-1050 starts, no second far above the rate, and
    the workers claim about once per start each (they sleep to the next token, they do not poll)."""
    enqueue_many(f.rated, [((f"s{i}",), {}) for i in range(1500)])
    env = limits(reports={"rate": "50/s"})
    workers = [start_worker("--concurrency", "4", "--queues", "reports", env=env) for _ in range(2)]
    first = wait_until(lambda: Span.objects.order_by("started").values_list("started", flat=True).first(), timeout=60)
    time.sleep(max(0.0, first + 21.0 - time.time()))
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(timeout=60) == 0
    starts = sorted(Span.objects.values_list("started", flat=True))
    in_window = [s for s in starts if first <= s < first + 20.0]
    # MariaDB's limited claim is six statements under the queue's row lock: there the two
    # workers fall short of the rate by up to ~8% (917, 938 out of 1,000 on this machine,
    # idle, at 89e76d8), never over it. The rate's promise is the upper bound.
    low = 900 if connection.vendor == "mysql" else 950
    assert low <= len(in_window) <= 1050, len(in_window)
    per_second = [sum(1 for s in in_window if first + i <= s < first + i + 1) for i in range(20)]
    # Never a burst above the rate, and starts spread over the whole window: every second
    # near the rate. (CI once saw 775 starts, with seconds of 2: a worker whose next token
    # came due while it was still deciding how long to sleep slept a whole poll interval;
    # with two CPU-bound processes beside it on two cores it now gives ~980.)
    # The floor catches a stalled second (a poll interval slept: a second of 0-2 starts), not
    # a slow one: on a loaded two-core CI machine one second of SQLite's once had 39.
    assert max(per_second) <= 60 and min(per_second) >= 30, per_second
    claims = sum(int(m) for w in workers for m in re.findall(r"worker stopped .*?claims=(\d+)", w.output()))
    # Each token wakes both workers (one gets the start): about two claims per start. A
    # finished task is no reason to claim while the queue's rate holds it back (it was a
    # third claim per start: 3,204 for 1,032 starts in CI on MariaDB).
    assert claims <= 2.5 * len(starts) + 100, (claims, len(starts))


def test_a_rate_wake_that_came_due_while_deciding_is_now_not_a_poll_interval_away():
    """The gate refused a start because the next token was 0.2 ms away; by the time the
    worker worked out its sleep that moment had passed. It must look again at once (it
    dropped past wakes and slept the poll interval: 2 starts a second instead of 50)."""
    from ox.flow.decide import RATE, Gated
    from ox.flow.limits import QueueLimits, parse_rate
    from ox.flow.watch import FlowWatch

    watch = FlowWatch({"reports": QueueLimits(rate=parse_rate("50/s"))}, ["reports"])
    due = time.time() - 0.0002
    watch.saw(["reports"], Gated(blocked={"reports": RATE}, wake_at={"reports": due}, hold_until={"reports": due}))
    assert watch.wakes() == [due]
    assert watch.open_limited(time.time()) == ["reports"]
    # A claim with no free slot clears what the gate said, so a past wake never spins.
    watch.saw(["reports"], Gated())
    assert watch.wakes() == []


def test_per_key_rate(start_worker):
    """5/s per account: two accounts each start about 5 a second, together about 10."""
    calls = [((f"{k}{i}", k), {}) for i in range(40) for k in "xy"]
    enqueue_many(f.rated_per_account, [((key,), {"account": acct}) for (key, acct), _kw in calls])
    env = limits(reports={"key_rate": "5/s"})
    workers = [start_worker("--concurrency", "4", "--queues", "reports", env=env) for _ in range(2)]
    first = wait_until(lambda: Span.objects.order_by("started").values_list("started", flat=True).first(), timeout=60)
    time.sleep(max(0.0, first + 4.0 - time.time()))
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        w.wait(timeout=60)
    for k in "xy":
        starts = sorted(s for s in Span.objects.filter(group=k).values_list("started", flat=True))
        window = [s for s in starts if first <= s < first + 4.0]
        assert 17 <= len(window) <= 22, (k, len(window))
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        assert min(gaps) >= 0.15, (k, min(gaps))  # 0.2 s apart, less the clock's jitter


def test_a_worker_with_limited_and_unlimited_queues_serves_both(start_worker):
    """emails limited to 1 at a time, default unlimited, one worker of 4 threads serving both:
    the limited queue runs one at a time while the unlimited one fills the other slots."""
    enqueue_many(f.limited, [((f"e{i}", 0.2), {}) for i in range(6)])
    enqueue_many(f.limited.using(queue_name="default"), [((f"d{i}", 0.2), {}) for i in range(12)])
    start_worker("--concurrency", "4", "--queues", "emails,default", env=limits(emails={"concurrency": 1}))
    drained(timeout=60)
    spans = list(Span.objects.all())
    emails = [s for s in spans if s.key.startswith("e")]
    assert len(spans) == 18 and most_at_once(emails) == 1
    assert most_at_once(spans) >= 3  # default's tasks ran beside the one emails task


def test_a_key_rate_in_the_settings_gives_the_worker_the_pruning_duty():
    from types import SimpleNamespace

    from ox.conf import OxOptions
    from ox.duties import worker_duties

    def duties(limits):
        options = OxOptions.from_dict({"LIMITS": limits, "ARCHIVE_AFTER": None, "VACUUM": False})
        worker = SimpleNamespace(options=options, conn=connection, alias="default", backend=None)
        return [d.name for d in worker_duties(worker)]

    assert "key rates" in duties({"sms": {"key_rate": "5/s"}})
    assert "key rates" not in duties({"sms": {"rate": "5/s"}})


def test_a_batch_worker_waits_for_a_held_back_queue_without_spinning(start_worker):
    """runworker --batch on a queue whose one slot another worker holds: it neither exits
    while due tasks wait nor claims in a loop; it finishes them once the slot frees."""
    long = f.limited.enqueue("holder", 4.0)
    env = limits(emails={"concurrency": 1})
    holder = start_worker("--queues", "emails", "--max-tasks", "1", env=env)
    wait_until(lambda: Span.objects.filter(key="holder").exists(), timeout=30)
    enqueue_many(f.limited, [((f"b{i}", 0.01), {}) for i in range(3)])
    batch = start_worker("--queues", "emails", "--batch", "--concurrency", "2", env=env)
    assert batch.wait(timeout=60) == 0
    assert Task.objects.get(pk=long.id).status == Status.SUCCESSFUL
    assert Task.objects.filter(status=Status.SUCCESSFUL).count() == 4
    claims = int(re.search(r"worker stopped .*?claims=(\d+)", batch.output()).group(1))
    assert claims < 40, claims  # about one a poll interval while held back, not thousands
    holder.wait(timeout=30)


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_a_held_back_worker_is_not_woken_by_every_enqueue(start_worker, tmp_path):
    """The queue's one slot is another worker's: the waiting worker unmarks itself (ox.idle),
    so 100 enqueues one by one notify no one and it makes about one claim a poll interval."""
    from ox.models import Worker
    from tests import gated_tasks
    from tests.testapp.models import Ledger

    # Held until the end: a task of fixed length could free the slot while the waiting worker
    # boots and the enqueues run on a busy machine, and every enqueue after would wake it.
    gate = tmp_path / "gate"
    gated_tasks.hold.using(queue_name="emails").enqueue("holder", str(gate))
    env = limits(emails={"concurrency": 1})
    holder = start_worker("--queues", "emails", "--max-tasks", "1", env=env)
    wait_until(lambda: Ledger.objects.filter(key="holder").exists(), timeout=30)
    f.limited.enqueue("first", 0.01)
    waiting = start_worker("--queues", "emails", env=env)
    wait_until(lambda: Worker.objects.filter(pid=waiting.pid).exists(), timeout=30)
    time.sleep(1.5)  # two heartbeats (0.5 s): a mark from its first look is gone
    assert Worker.objects.get(pid=waiting.pid).idle_since is None
    for i in range(100):
        f.limited.enqueue(f"n{i}", 0.0)
        time.sleep(0.01)
    waiting.signal(signal.SIGTERM)
    waiting.wait(timeout=30)
    claims = int(re.search(r"worker stopped .*?claims=(\d+)", waiting.output()).group(1))
    gate.touch()
    assert claims < 15, claims  # one a poll interval (1 s) and a few at start, not one per enqueue
    holder.wait(timeout=30)


def test_a_limited_queue_claims_as_its_slots_free_not_at_the_poll(start_worker):
    """40 tasks of 50 ms, 4 threads, a limit that does not bind (8): the drain takes about
    0.5 s. (It once took a poll interval per batch of 4, 10 s: the gate's claim was counted
    short whenever the async probe found nothing, so a freed slot did not claim again.)"""
    enqueue_many(f.limited, [((f"s{i}", 0.05), {}) for i in range(40)])
    start_worker("--concurrency", "4", "--queues", "emails", env=limits(emails={"concurrency": 8}))
    wait_until(lambda: Span.objects.exists(), timeout=30)
    drained(timeout=60)
    spans = list(Span.objects.all())
    took = max(s.ended for s in spans) - min(s.started for s in spans)
    assert took < 4.0, took
    assert most_at_once(spans) == 4
