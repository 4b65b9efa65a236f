"""The celery arm's drain span (bench/arms/celery.py), without a worker, Redis or Celery (the
project's venv has neither redis-py nor Celery; `bench/run --arms celery` is the real run).

Run 20261204T074529Z gave drain_c4 samples of 1,802 and 42,895 tasks/s: the fill published each
message straight to the live list while the idle workers drained it, and the drain job starts the
span at its commit at the earliest, so it divided 10,000 by whatever ran after the fill. The fill
now stages the messages and releases them at the commit; the span refuses starts and results
older than that release."""

import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

from bench.arms.celery import QUEUE, RELEASE, STAGE, CeleryArm, span_of

N = 10_000


def iso(at: datetime) -> str:
    return at.isoformat()


def drain_span(first: datetime, last: datetime, committed_at: datetime) -> float:
    # bench.jobs.drain's arithmetic, as it stands.
    return (last - max(first, committed_at)).total_seconds()


def test_the_42895_sample_was_the_fill_overlap():
    """The figures of that repetition (read back from Redis db 5 after the run): the earliest
    pool process stamp, the last date_done, and the commit 0.233127 s before it."""
    first_start = 1796371113.2247088
    last = datetime(2026, 12, 4, 7, 58, 51, 552481, tzinfo=UTC)
    committed_at = last - timedelta(seconds=0.233127)
    first = datetime.fromtimestamp(first_start, UTC)
    assert round((last - first).total_seconds(), 1) == 18.3  # what the workers took
    assert round(N / drain_span(first, last, committed_at)) == 42_895  # what was reported
    # With the release at the commit, a start 18 s earlier cannot be this backlog's.
    metas = [{"status": "SUCCESS", "date_done": iso(last)}]
    with pytest.raises(RuntimeError, match=r"task started 18\.\d+ s before"):
        span_of([first_start], metas, committed_at.timestamp())


def test_span_runs_from_the_first_start_to_the_last_success():
    released = datetime(2026, 12, 4, 8, 0, 0, tzinfo=UTC)
    r = released.timestamp()
    starts = [r + 0.004, r + 0.0011, r + 0.0027, r + 0.0019]  # one stamp per pool process
    done = released + timedelta(seconds=5.25)
    metas = [
        {"status": "SUCCESS", "date_done": iso(released + timedelta(seconds=1))},
        # The latest, written with another offset: the same instant in UTC.
        {"status": "SUCCESS", "date_done": done.astimezone(timezone(timedelta(hours=1))).isoformat()},
        # A naive date_done is taken as UTC.
        {"status": "SUCCESS", "date_done": (released + timedelta(seconds=2)).replace(tzinfo=None).isoformat()},
        # Not a completion: it does not end the span.
        {"status": "FAILURE", "date_done": iso(released + timedelta(seconds=9))},
    ]
    first, last = span_of(starts, metas, r)
    assert first == datetime.fromtimestamp(r + 0.0011, UTC)
    assert last == done
    # bench.jobs.drain's clamp to the commit changes nothing: the release comes after it.
    committed_at = released - timedelta(milliseconds=1)
    assert drain_span(first, last, committed_at) == pytest.approx(5.25 - 0.0011, abs=1e-6)


def test_span_refuses_what_is_not_this_backlog():
    released = datetime(2026, 12, 4, 8, 0, 0, tzinfo=UTC)
    r = released.timestamp()
    stale = [{"status": "SUCCESS", "date_done": iso(released - timedelta(seconds=30))}]
    with pytest.raises(RuntimeError, match="result is dated 30.000 s before"):
        span_of([r + 0.01], stale, r)
    with pytest.raises(RuntimeError, match="released no backlog"):
        span_of([r + 0.01], [], None)
    assert span_of([], [], None) == (None, None)
    assert span_of([], [{"status": "FAILURE", "date_done": iso(released)}], None) == (None, None)


class FakeRedis:
    """What release_on_commit and release call, recorded."""

    def __init__(self, staged: int) -> None:
        self.staged = staged
        self.calls: list[tuple] = []
        self.keys = {STAGE + QUEUE, STAGE + "_kombu.binding.celery"}

    def llen(self, key: str) -> int:
        assert key == STAGE + QUEUE
        return self.staged

    def eval(self, script: str, numkeys: int, *keys: str) -> int:
        self.calls.append(("eval", time.time(), script, numkeys, *keys))
        self.keys.discard(STAGE + QUEUE)
        return self.staged

    def scan_iter(self, match: str, count: int) -> list[str]:
        assert match == STAGE + "*"
        return sorted(self.keys)

    def delete(self, *keys: str) -> None:
        self.calls.append(("delete", *keys))
        self.keys -= set(keys)


def test_the_backlog_goes_live_at_the_commit_and_not_before():
    arm = CeleryArm()
    fake = FakeRedis(staged=3)
    arm.__dict__["redis"] = fake  # the cached_property's slot: no redis-py needed
    committed: list = []
    arm.release_on_commit(3, on_commit=committed.append)
    # Inside the caller's transaction: staged only, nothing moved, no release time.
    assert fake.calls == [] and arm.released_at is None
    assert len(committed) == 1
    before = time.time()
    committed[0]()  # the commit
    kind, moved_at, script, numkeys, *keys = fake.calls[0]
    assert (kind, script, numkeys, keys) == ("eval", RELEASE, 2, [STAGE + QUEUE, QUEUE])
    assert before <= arm.released_at <= moved_at  # stamped before the move, never after
    assert fake.calls[1] == ("delete", STAGE + "_kombu.binding.celery")  # staging keys dropped
    # A start stamped by a worker after the move is inside the span; the reset forgets it.
    assert span_of([moved_at + 0.001], [], arm.released_at)[0] is not None
    arm.__dict__["redis"] = FakeRedis(staged=0)
    arm.__dict__["redis"].flushdb = lambda: None
    arm.reset([])
    assert arm.released_at is None


def test_a_fill_that_reached_the_live_list_is_refused():
    arm = CeleryArm()
    arm.__dict__["redis"] = FakeRedis(staged=9_998)
    with pytest.raises(RuntimeError, match="9998 messages staged"):
        arm.release_on_commit(10_000, on_commit=lambda fn: fn())
    assert arm.released_at is None


def test_the_module_imports_without_touching_redis():
    # The agent's arm is built at import (bench.arms.celery.ARM); its client only on first use,
    # which is what lets this file import the module at all.
    from bench.arms.celery import ARM

    assert "redis" not in ARM.__dict__
