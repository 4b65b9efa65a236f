"""The gate's decisions in one process, with the database's rows and a fixed clock: exact
counts per limit, key order, the window past full keys, GCRA rates with and without burst,
pauses, and the spent rate rows pruned."""

import json
from datetime import timedelta

import pytest
from django.db import connection

from ox import clock, enqueue_many, sql
from ox.flow import gate, queues
from ox.flow.limits import QueueLimits, Rate, next_start, parse_rate, take
from ox.models import KeyRate, QueueState, Status, Task
from tests import flow_tasks as f

pytestmark = pytest.mark.django_db(transaction=True)


def claim(limits: dict, demand=(10, 0), now=None):
    now = now or clock.db_now(connection)
    _written, gated = gate.claim_limited(connection, "w-test", limits, demand, now, now + timedelta(seconds=30))
    return gated


def test_parse_rate():
    assert parse_rate("50/s") == Rate(50, 1.0)
    assert parse_rate("10/m") == Rate(10, 60.0)
    assert parse_rate("5/10s") == Rate(5, 10.0)
    assert parse_rate({"count": 6, "period": 2, "burst": 3}) == Rate(6, 2.0, 3)
    for bad in ("0/s", "5", "5/x", "-1/s", "1/0s", {"count": 1}, {"count": 2, "period": 1, "burst": 3}, True, 5):
        with pytest.raises(ValueError):
            parse_rate(bad)


def test_gcra_with_and_without_burst():
    smooth = Rate(10, 1.0)
    tat = take(None, 100.0, smooth)
    assert tat == pytest.approx(100.1)
    assert take(tat, 100.0, smooth) is None  # the next start waits 0.1 s
    assert next_start(tat, 100.0, smooth) == pytest.approx(100.1)
    bursty = Rate(10, 1.0, burst=3)
    tat, starts = None, 0
    while (new := take(tat, 100.0, bursty)) is not None:
        tat, starts = new, starts + 1
    assert starts == 3  # three at once, then one every 0.1 s
    assert next_start(tat, 100.0, bursty) == pytest.approx(100.1)


def test_concurrency_counts_what_runs():
    enqueue_many(f.limited, [((f"c{i}", 0), {}) for i in range(10)])
    lim = {"emails": QueueLimits(concurrency=3)}
    first = claim(lim)
    assert len(first.claimed) == 3 and first.blocked == {"emails": gate.CONCURRENCY}
    assert claim(lim).claimed == []  # three RUNNING: nothing more
    # One finishes (any way out of RUNNING frees it): exactly one more.
    Task.objects.filter(pk=first.claimed[0].id).update(status=Status.SUCCESSFUL)
    assert len(claim(lim).claimed) == 1
    assert Task.objects.filter(status=Status.RUNNING).count() == 3


def test_key_concurrency_passes_over_full_keys_in_order():
    # 100 tasks of key "a" first (more than the first window), then one each of b and c.
    calls = [((f"a{i:03d}", 0), {"account": "a"}) for i in range(100)]
    calls += [(("b0", 0), {"account": "b"}), (("c0", 0), {"account": "c"})]
    enqueue_many(f.per_account, calls)
    lim = {"emails": QueueLimits(key_concurrency=1)}
    got = claim(lim)
    assert [json.loads(c.args_json)[0] for c in got.claimed] == ["a000", "b0", "c0"]
    assert claim(lim).claimed == []
    Task.objects.filter(status=Status.RUNNING, limit_key='"a"').update(status=Status.SUCCESSFUL)
    assert [json.loads(c.args_json)[0] for c in claim(lim).claimed] == ["a001"]  # FIFO within the key


def test_rate_limit_with_a_fixed_clock():
    enqueue_many(f.rated, [((f"r{i}",), {}) for i in range(10)])
    lim = {"reports": QueueLimits(rate=Rate(10, 1.0))}
    now = clock.db_now(connection)
    assert len(claim(lim, now=now).claimed) == 1
    held = claim(lim, now=now)
    assert held.claimed == [] and held.blocked == {"reports": gate.RATE}
    assert held.wake_at["reports"] == pytest.approx(now.timestamp() + 0.1)
    assert len(claim(lim, now=now + timedelta(seconds=0.1)).claimed) == 1
    # Half a second later: one start, not five (no burst saved up beyond `burst`).
    assert len(claim(lim, now=now + timedelta(seconds=0.6)).claimed) == 1
    assert QueueState.objects.get(name="reports").rate_tat == pytest.approx(now.timestamp() + 0.7)


def test_key_rate_rows_are_kept_per_key_and_spent_ones_pruned():
    enqueue_many(f.rated_per_account, [((f"k{i}",), {"account": k}) for i in range(4) for k in "xy"])
    lim = {"reports": QueueLimits(key_rate=Rate(1, 1.0))}
    now = clock.db_now(connection)
    assert len(claim(lim, now=now).claimed) == 2  # one per key
    assert claim(lim, now=now).claimed == []
    assert KeyRate.objects.count() == 2
    assert gate.prune_key_rates(connection, now.timestamp()) == 0  # both still ahead
    assert gate.prune_key_rates(connection, now.timestamp() + 5) == 2
    assert len(claim(lim, now=now + timedelta(seconds=5)).claimed) == 2


def test_a_paused_queue_gives_nothing_and_the_fast_path_skips_it():
    enqueue_many(f.limited, [((f"p{i}", 0), {}) for i in range(3)])
    queues.pause("emails")
    assert claim({"emails": QueueLimits(concurrency=5)}).claimed == []
    now = clock.db_now(connection)
    assert sql.claim(connection, "w", ["emails"], (5, 5), now, now + timedelta(seconds=30)) == []
    assert sql.earliest_ready(connection, ["emails"]) is None
    queues.resume("emails")
    assert len(sql.claim(connection, "w", ["emails"], (5, 5), now, now + timedelta(seconds=30))) == 3


def test_the_fast_path_skips_a_queue_limited_at_run_time():
    enqueue_many(f.limited, [((f"l{i}", 0), {}) for i in range(3)])
    queues.set_limits("emails", {"concurrency": 1})
    now = clock.db_now(connection)
    assert sql.claim(connection, "w", ["emails"], (5, 5), now, now + timedelta(seconds=30)) == []
    assert len(claim({"emails": QueueLimits(concurrency=1)}).claimed) == 1
    queues.set_limits("emails", {})
    assert len(sql.claim(connection, "w", ["emails"], (5, 5), now, now + timedelta(seconds=30))) == 2


def test_completions_written_with_the_gate_free_their_slots():
    enqueue_many(f.limited, [((f"w{i}", 0), {}) for i in range(4)])
    lim = {"emails": QueueLimits(concurrency=2)}
    first = claim(lim)
    assert len(first.claimed) == 2
    now = clock.db_now(connection)
    done = [sql.Completion(c.id, c.fence, "null", now, now) for c in first.claimed]
    written, gated = gate.claim_limited(connection, "w-test", lim, (2, 0), now, now + timedelta(seconds=30), done)
    assert written == {c.key for c in first.claimed}
    assert len(gated.claimed) == 2  # in the same transaction, the freed slots are taken


def test_a_queue_row_deleted_by_hand_is_made_again():
    enqueue_many(f.limited, [((f"m{i}", 0), {}) for i in range(3)])
    lim = {"emails": QueueLimits(concurrency=1)}
    assert len(claim(lim).claimed) == 1
    QueueState.objects.filter(name="emails").delete()
    assert claim(lim).claimed == []  # the row is back, and the limit still counts what runs
    assert QueueState.objects.filter(name="emails").exists()


def test_a_refused_completion_rolls_the_whole_gate_back():
    """A completion the database refuses (here a return value that is not JSON) fails the
    gate's transaction: nothing is claimed, the connection is usable, the worker can isolate
    the bad row (ox.completer) and claim again."""
    from django.db import DatabaseError

    enqueue_many(f.limited, [((f"x{i}", 0), {}) for i in range(3)])
    lim = {"emails": QueueLimits(concurrency=2)}
    first = claim(lim)
    now = clock.db_now(connection)
    bad = [sql.Completion(first.claimed[0].id, first.claimed[0].fence, "{not json", now, now)]
    with pytest.raises(DatabaseError):
        gate.claim_limited(connection, "w-test", lim, (2, 0), now, now + timedelta(seconds=30), bad)
    assert Task.objects.filter(status=Status.RUNNING).count() == 2  # nothing written, nothing claimed
    good = [sql.Completion(c.id, c.fence, "1", now, now) for c in first.claimed]
    written, gated = gate.claim_limited(connection, "w-test", lim, (2, 0), now, now + timedelta(seconds=30), good)
    assert len(written) == 2 and len(gated.claimed) == 1


def test_a_rate_prints_as_text_that_parses_back():
    for rate in (Rate(50, 1.0), Rate(5, 1.0, 2), Rate(5, 10.0), Rate(3, 60.0, 3), Rate(7, 2.5), Rate(10, 3600.0)):
        assert parse_rate(str(rate)) == rate
    # An override with a burst round-trips through ox_queue and stays in force.
    queues.set_limits("emails", {"rate": {"count": 5, "period": 1, "burst": 2}})
    from ox.flow.waiting import queue_flows

    flow = next(x for x in queue_flows(["emails"]) if x.name == "emails")
    assert flow.limits.rate == Rate(5, 1.0, 2)
