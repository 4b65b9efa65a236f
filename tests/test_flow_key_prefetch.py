"""A queue limited by key concurrency alone is claimed through the gate with prefetch, like
an unlimited queue: short tasks come in batches, one claim for many. A task claimed ahead of
a free thread is RUNNING and holds its key, which no other worker could start then anyway;
the limit and the order within a key still hold, and a task waiting behind a long one goes
back for another worker. Where a prefetched task would hold more than its key (a queue-wide
concurrency limit, a rate), the gate claims for free threads only."""

import re
import time

import pytest

from ox import enqueue_many
from ox.models import Status, Task
from tests import flow_tasks as f
from tests.helpers import wait_until
from tests.test_durability import options
from tests.test_flow_limits import drained, limits, most_at_once
from tests.testapp.models import Span

pytestmark = pytest.mark.django_db(transaction=True)


def claims_of(worker) -> tuple[int, int]:
    """(claims made, tasks claimed), from the worker's stop event."""
    found = re.search(r"worker stopped .*?claimed=(\d+) claims=(\d+)", worker.output())
    assert found, worker.output()[-2000:]
    return int(found.group(2)), int(found.group(1))


def always_prefetch(**emails: object) -> dict[str, str]:
    """These limits on "emails", and PREFETCH_WINDOW None: prefetch PREFETCH whatever the
    tasks' durations (a test task writing its span takes ~10 ms on PostgreSQL, which the
    50 ms window sizes at 5)."""
    return options(limits={"emails": emails}, heartbeat=0.5, rescue_interval=0.5, prefetch_window=None)


def keyed_backlog(n: int, keys: int, seconds: float = 0.0) -> None:
    enqueue_many(
        f.per_account, [((f"k{i % keys}-{i // keys:03d}", seconds), {"account": f"k{i % keys}"}) for i in range(n)]
    )


def check_keys(spans: list[Span], keys: int, per_key: int) -> None:
    """Each ran once, one at a time per key, in order within its key."""
    assert len(spans) == keys * per_key and len({s.key for s in spans}) == len(spans)
    for k in range(keys):
        mine = [s for s in spans if s.group == f"k{k}"]
        assert most_at_once(mine) == 1
        ordered = [s.key for s in sorted(mine, key=lambda s: s.started)]
        assert ordered == [f"k{k}-{i:03d}" for i in range(per_key)]


def test_a_key_limited_queue_is_claimed_in_batches(start_worker):
    """600 short tasks over 60 keys, key_concurrency 1, one worker of 2 threads: far fewer
    claims than the 300 a claim per free thread would take; limit and order hold."""
    keyed_backlog(600, 60)
    env = always_prefetch(key_concurrency=1)
    worker = start_worker("--queues", "emails", "--concurrency", "2", "--batch", env=env)
    assert worker.wait(timeout=120) == 0
    claims, claimed = claims_of(worker)
    assert claimed == 600
    assert claims < 100, claims
    check_keys(list(Span.objects.all()), 60, 10)


@pytest.mark.parametrize(
    "extra",
    [{"concurrency": 50}, {"rate": "10000/s"}, {"key_rate": "10000/s"}],
    ids=["with-concurrency", "with-rate", "with-key-rate"],
)
def test_no_prefetch_where_a_task_would_hold_more_than_its_key(start_worker, extra):
    """The same backlog with a limit that does not bind but that a waiting task would hold
    (a queue-wide slot, a rate's token): claims are for free threads only, at least one per
    two tasks with 2 threads."""
    keyed_backlog(120, 60)
    env = always_prefetch(key_concurrency=1, **extra)
    worker = start_worker("--queues", "emails", "--concurrency", "2", "--batch", env=env)
    assert worker.wait(timeout=120) == 0
    claims, claimed = claims_of(worker)
    assert claimed == 120
    assert claims >= 60, claims
    check_keys(list(Span.objects.all()), 60, 2)


def test_tasks_prefetched_behind_a_long_one_go_back_to_another_worker(start_worker):
    """A worker of one thread learns the task is short, then claims a long one with eight
    short ones of other keys behind it (held, their keys with them). Past the prefetch
    window it gives them back, and a second worker runs them while the long one still runs:
    each once, none of its key beside another."""
    env = limits(emails={"key_concurrency": 1})
    first = start_worker("--queues", "emails", "--concurrency", "1", env=env)
    enqueue_many(f.per_account, [((f"warm{i}", 0.0), {"account": f"w{i}"}) for i in range(5)])
    drained(timeout=60)
    long = f.per_account.enqueue("long", 6.0, account="slow")
    shorts = enqueue_many(f.per_account, [((f"s{i}", 0.0), {"account": f"s{i}"}) for i in range(8)])
    wait_until(lambda: Span.objects.filter(key="long").exists(), timeout=30)
    second = start_worker("--queues", "emails", "--concurrency", "2", env=env)
    started = time.monotonic()
    wait_until(
        lambda: Task.objects.filter(pk__in=[r.id for r in shorts], status=Status.SUCCESSFUL).count() == 8,
        timeout=30,
    )
    assert Task.objects.get(pk=long.id).status == Status.RUNNING  # they did not wait for it
    assert time.monotonic() - started < 5.5
    drained(timeout=30)
    spans = [s for s in Span.objects.all() if s.key.startswith("s")]
    assert sorted(s.key for s in spans) == [f"s{i}" for i in range(8)]  # each once
    assert all(Task.objects.get(pk=r.id).attempts == 1 for r in shorts)  # given back unstarted: not an attempt
    assert "gave back prefetched tasks waiting behind long ones" in first.output()  # they were held there
    assert second.proc.poll() is None


@pytest.mark.parametrize("settings", [{"key_concurrency": 1}, {}], ids=["key-limited", "unlimited"])
def test_a_limit_set_at_run_time_sends_back_what_was_claimed_ahead(start_worker, settings):
    """A worker of 4 threads holds 36 tasks claimed ahead of them (always prefetch) when an
    operator limits the queue to 1 at a time: within the refresh it gives the unstarted ones
    back, and from then on they run one at a time (not 4 at once until its inbox is empty)."""
    from ox.flow import queues

    keyed_backlog(40, 40, 0.3)
    worker = start_worker("--queues", "emails", "--concurrency", "4", env=always_prefetch(**settings))
    wait_until(lambda: Span.objects.count() >= 4, timeout=30)
    queues.set_limits("emails", {"concurrency": 1}, by="test")
    since = time.time() + 1.5  # the worker's refresh (1 s) and the tasks running then (0.3 s)
    drained(timeout=120)
    spans = list(Span.objects.all())
    assert len(spans) == 40 and len({s.key for s in spans}) == 40  # each once
    later = [s for s in spans if s.started >= since]
    assert len(later) >= 20
    assert most_at_once(later) == 1
    assert "gave back tasks claimed ahead" in worker.output()
