"""An adversarial review of a success's last metadata written by its completion's statement
(ox.metadata.end_text; complete_sql, SQLite's and MariaDB's completion): odd and large values,
batches with fenced rows, twice-written completions, the heartbeat racing the end. Every
database, no worker subprocess. Found by the review and fixed: end_text waited on the event loop
behind the heartbeat's write (now BUSY there, asked again from a thread), and a refused row's
metadata write that failed lost the row's failure (now queued first)."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.db import transaction as dj_transaction
from django.tasks import task_backends

from ox import clock, sql
from ox.completer import Completer
from ox.conf import OxOptions
from ox.execution import SUCCESSFUL, Finished
from ox.flow import gate
from ox.flow.limits import QueueLimits
from ox.metadata import Busy, context_for, end_text, flush_waiting
from ox.models import Status, Task
from tests import tasks
from tests.test_metadata import _claim_one

pytestmark = pytest.mark.django_db(transaction=True)

PG = connection.vendor == "postgresql"


def _now():
    return clock.db_now(connection)


def _completion(claimed, metadata_json=None, value="1", workflow=False) -> sql.Completion:
    now = _now()
    return sql.Completion(claimed.id, claimed.fence, value, now, now, workflow, metadata_json)


def _claim_all(n: int, queue: str = "default", worker: str = "atk") -> list[sql.Claimed]:
    now = _now()
    return sql.claim(connection, worker, [queue], (n, 0), now, now + timedelta(seconds=60))


def _row(result_or_id) -> Task:
    return Task.objects.get(id=getattr(result_or_id, "id", result_or_id))


# ---------------------------------------------------------------------------------------- metadata


ODD_VALUES = [
    {"emoji": "🦊🧪👩‍👩‍👧", "astral": "\U0010fffd\U0001d11e", "bmp_edge": "\ufffe\uffff\ufeff"},
    {"ctl": "\t\n\r\b\f\x01\x1f\x7f", "seps": "\u2028\u2029", "slash": "/\\/"},
    {'k"ey': 1, "k\\ey": 2, "k'ey": 3, "k\ney": 4, "\\u0000": "\\u0000", "\\ud800": "x"},
    {"nums": [1e308, -1e308, 5e-324, 2.2250738585072014e-308, 0.1, 1 / 3]},
    {"big": 2**63, "bigger": -(2**64) - 1, "huge": 10**300},
    {"t": True, "f": False, "n": None, "e": {}, "a": [], "s": ""},
    {"$[5]": "$[5]", "$.md": "md", "md": {"md": None}},
    {"sql": "'); DROP TABLE ox_task; --", "pct": "%s %(x)s %%", "brace": "{}}{"},
]


@pytest.mark.parametrize("odd", ODD_VALUES, ids=[str(i) for i in range(len(ODD_VALUES))])
def test_odd_metadata_survives_the_completion_exactly_as_a_save_writes_it(odd):
    """Whatever the old path (a save of its own, ox.db.notes) stores, the completion stores
    the same (compared with a task that saved the same metadata itself)."""
    tasks.echo.enqueue(1)
    tasks.echo.enqueue(2)
    via_completion, running1 = _claim_one()
    via_save, running2 = _claim_one()
    c1 = context_for(running1, via_completion.id, via_completion.fence, connection.alias)
    c2 = context_for(running2, via_save.id, via_save.fence, connection.alias)
    c1.metadata.update(odd)
    c2.metadata.update(odd)
    assert c2.save_metadata() is True
    text = end_text(c1)
    assert text is not None
    assert sql.complete(connection, [_completion(via_completion, text), _completion(via_save)]) == {
        via_completion.key,
        via_save.key,
    }
    by_save = Task.objects.get(id=via_save.id).metadata
    by_completion = Task.objects.get(id=via_completion.id).metadata
    assert by_completion == by_save
    assert task_backends["default"].get_result(str(via_completion.id)).metadata == by_save


def _deep(levels: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(levels - 1):
        value = {"d": value}
    return value


def test_the_deepest_and_the_biggest_metadata_ride_on_one_batch():
    """31 levels (the limit) and a document of nearly 64 KiB of multi-byte text, each in one
    completion batch with a plain row: all written, none refused."""
    for i in range(3):
        tasks.echo.enqueue(i)
    claimed = _claim_all(3)
    deep = _deep(31)
    filler = "é🦊" * 10_000  # 2 + 4 bytes each: 60 000 bytes
    big = {"blob": filler, "k": "x" * (64 * 1024 - 60_000 - 40)}
    from ox.metadata import metadata_text

    texts = [metadata_text(deep), metadata_text(big), None]
    written = sql.complete(connection, [_completion(c, t) for c, t in zip(claimed, texts, strict=True)])
    assert written == {c.key for c in claimed}
    assert _row(claimed[0].id).metadata == deep
    assert _row(claimed[1].id).metadata == big
    assert _row(claimed[2].id).metadata is None


def test_metadata_rides_on_complete_and_claim():
    """The completion that rides on the next claim (one statement on PostgreSQL) carries the
    metadata too, and a row without it keeps the enqueued metadata."""
    tasks.echo.using(metadata={"owner": "a"}).enqueue(1)
    tasks.echo.using(metadata={"owner": "b"}).enqueue(2)
    first, second = _claim_all(2)
    tasks.echo.enqueue(3)
    now = _now()
    written, more = sql.complete_and_claim(
        connection,
        [_completion(first, '{"owner":"a2","🦊":1}'), _completion(second)],
        "atk",
        ["default"],
        (5, 0),
        now,
        now + timedelta(seconds=60),
    )
    assert written == {first.key, second.key} and len(more) == 1
    assert _row(first.id).metadata == {"owner": "a2", "🦊": 1}
    assert _row(second.id).metadata == {"owner": "b"}


def test_metadata_rides_on_a_gated_completion():
    """A completion written by the gate's claim (PostgreSQL: ox.db.postgresql.gate, its own
    multi-statement query) writes the metadata too."""
    tasks.echo.enqueue(1)
    tasks.echo.enqueue(2)
    lim = {"default": QueueLimits(concurrency=2)}
    now = _now()
    _w, gated = gate.claim_limited(connection, "atk", lim, (1, 0), now, now + timedelta(seconds=30))
    (c,) = gated.claimed
    now = _now()
    done = [sql.Completion(c.id, c.fence, "1", now, now, False, '{"via":"gate"}')]
    written, _g = gate.claim_limited(connection, "atk", lim, (1, 0), now, now + timedelta(seconds=30), done)
    assert written == {c.key}
    assert _row(c.id).metadata == {"via": "gate"}


def test_a_batch_with_one_row_fenced_writes_only_the_others_metadata():
    for i in range(3):
        tasks.echo.using(metadata={"i": i}).enqueue(i)
    claimed = _claim_all(3)
    Task.objects.filter(id=claimed[1].id).update(fence=claimed[1].fence + 1)
    texts = ['{"i":"a"}', '{"i":"b"}', '{"i":"c"}']
    written = sql.complete(connection, [_completion(c, t) for c, t in zip(claimed, texts, strict=True)])
    assert written == {claimed[0].key, claimed[2].key}
    assert [_row(c.id).metadata for c in claimed] == [{"i": "a"}, {"i": 1}, {"i": "c"}]


def test_a_completion_written_twice_does_not_overwrite_metadata_the_second_time():
    """A retried flush of a batch already written: fenced by status, the second metadata is
    not written over the first (nor over a later change by hand)."""
    tasks.echo.enqueue(1)
    (c,) = _claim_all(1)
    assert sql.complete(connection, [_completion(c, '{"n":1}')]) == {c.key}
    Task.objects.filter(id=c.id).update(metadata={"by": "hand"})
    assert sql.complete(connection, [_completion(c, '{"n":2}')]) == set()
    assert _row(c.id).metadata == {"by": "hand"}


def test_a_cancelled_task_keeps_its_metadata_when_its_success_arrives_late():
    """A task cancelled (status no longer RUNNING) while its success waited in the batch: the
    completion is not written and neither is its metadata (as a save would not be)."""
    tasks.echo.using(metadata={"owner": "x"}).enqueue(1)
    (c,) = _claim_all(1)
    Task.objects.filter(id=c.id).update(status=Status.CANCELLED)
    assert sql.complete(connection, [_completion(c, '{"owner":"late"}')]) == set()
    assert _row(c.id).metadata == {"owner": "x"}


def test_metadata_changed_after_the_last_save_then_success_and_failure():
    """Two tasks change their metadata after their last save, one succeeds, one fails: the
    success's completion carries the change; the failure's at_end writes it before."""
    from ox.metadata import at_end

    tasks.echo.enqueue(1)
    tasks.echo.enqueue(2)
    ok, r1 = _claim_one()
    bad, r2 = _claim_one()
    c_ok = context_for(r1, ok.id, ok.fence, connection.alias)
    c_bad = context_for(r2, bad.id, bad.fence, connection.alias)
    for c in (c_ok, c_bad):
        c.metadata["p"] = 0.5
        assert c.save_metadata() is True
        c.metadata["p"] = 0.9
        assert c.save_metadata() is True  # waits for the heartbeat
        c.metadata["p"] = 1.0  # changed after the last save
    text = end_text(c_ok)
    at_end(c_bad)
    assert text == '{"p":1.0}'
    assert _row(bad.id).metadata == {"p": 1.0}
    assert _row(ok.id).metadata == {"p": 0.5}
    assert flush_waiting(connection) == 0
    sql.complete(connection, [_completion(ok, text)])
    assert _row(ok.id).metadata == {"p": 1.0}


def test_invalid_metadata_at_the_end_carries_the_pending_save():
    """The task saved {"p": 0.9} inside the interval (pending), then set a NaN: the completion
    carries the pending save, not nothing."""
    tasks.echo.enqueue(1)
    c, r = _claim_one()
    ctx = context_for(r, c.id, c.fence, connection.alias)
    ctx.metadata["p"] = 0.5
    assert ctx.save_metadata() is True
    ctx.metadata["p"] = 0.9
    assert ctx.save_metadata() is True
    ctx.metadata["p"] = float("nan")
    text = end_text(ctx)
    assert text == '{"p":0.9}'
    sql.complete(connection, [_completion(c, text)])
    assert _row(c.id).metadata == {"p": 0.9}


def test_the_heartbeat_flush_racing_end_text_never_leaves_an_older_save_last():
    """flush_waiting (the heartbeat's thread) and end_text (the task's end) race: whichever
    goes first, the row ends with what the task held at its end once the completion is in."""
    for round_ in range(20):
        tasks.echo.enqueue(round_)
        c, r = _claim_one()
        ctx = context_for(r, c.id, c.fence, connection.alias)
        ctx.metadata["p"] = 0
        assert ctx.save_metadata() is True
        ctx.metadata["p"] = 1
        assert ctx.save_metadata() is True  # pending, waits for the heartbeat
        ctx.metadata["p"] = 2
        out: dict = {}
        barrier = threading.Barrier(2)

        def heartbeat():
            try:
                barrier.wait()
                out["flushed"] = flush_waiting(connections["default"])
            finally:
                connections.close_all()

        t = threading.Thread(target=heartbeat)
        t.start()
        barrier.wait()
        text = end_text(ctx)
        t.join()
        if text is not None:
            sql.complete(connection, [_completion(c, text)])
        else:
            sql.complete(connection, [_completion(c)])
        assert _row(c.id).metadata == {"p": 2}, (round_, out, text)


def test_end_text_is_not_blocked_by_a_heartbeat_write_held_up_by_a_row_lock():
    """The async runner calls end_text on the event loop (no thread since a54337c). If the
    heartbeat is writing this attempt's pending save (holding saved.lock across the UPDATE)
    and that UPDATE waits for a row lock, end_text must not wait on the event loop for it.

    Found by review (PostgreSQL, MariaDB): end_text took saved.lock with a blocking acquire
    and sat there for as long as the heartbeat's statement waited. Now, asked not to wait
    (the event loop's call), it answers BUSY at once; asked from a thread, the last text."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no row locks (a writer waits on the database lock instead)")
    import time

    tasks.echo.enqueue(1)
    c, r = _claim_one()
    ctx = context_for(r, c.id, c.fence, connection.alias)
    ctx.metadata["p"] = 0
    assert ctx.save_metadata() is True
    ctx.metadata["p"] = 1
    assert ctx.save_metadata() is True  # pending for the heartbeat
    ctx.metadata["p"] = 2
    locked = threading.Event()
    release = threading.Event()

    def holder():
        try:
            with dj_transaction.atomic():
                Task.objects.select_for_update().get(id=c.id)  # e.g. a rescuer's or a cancel's lock
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    def heartbeat():
        try:
            flush_waiting(connections["default"])
        finally:
            connections.close_all()

    h = threading.Thread(target=holder)
    h.start()
    assert locked.wait(10)
    b = threading.Thread(target=heartbeat)
    b.start()
    time.sleep(0.5)  # the heartbeat now waits for the row lock, holding saved.lock
    started = time.monotonic()
    timer = threading.Timer(2.0, release.set)
    timer.start()
    try:
        out = end_text(ctx, wait=False)
        took = time.monotonic() - started
    finally:
        release.set()
        timer.cancel()
        h.join()
        b.join()
    assert took < 0.5, f"end_text (on the event loop for an async task) blocked {took:.2f}s behind a row lock"
    assert isinstance(out, Busy)
    assert end_text(ctx) == '{"p":2}'  # from a thread, once the heartbeat's write is through


def test_a_refused_return_value_with_metadata_still_fails_the_task_on_every_database():
    """isolate(): a row refused for its return value (a value no database stores: not JSON at
    all), its metadata written on its own first, then the failure; the others succeed."""
    for i in range(3):
        tasks.echo.enqueue(i)
    now = _now()
    claimed = _claim_all(3)
    completer = Completer("atk", OxOptions(), object)
    for i, c in enumerate(claimed):
        value = "{not json" if i == 1 else str(i)
        completer.add(Finished(c, SUCCESSFUL, now, now, return_json=value, metadata_json=f'{{"step":{i}}}'))
    completer.isolate(connection, lambda batch: sql.complete(connection, batch))
    rows = [_row(c.id) for c in claimed]
    assert [r.status for r in rows] == [Status.SUCCESSFUL, Status.FAILED, Status.SUCCESSFUL]
    assert [r.metadata for r in rows] == [{"step": 0}, {"step": 1}, {"step": 2}]


def test_a_refused_row_whose_metadata_write_hits_a_dropped_connection_keeps_its_failure(monkeypatch):
    """isolate(): the refused row's metadata is now written on its own before its failure is
    queued. If that write fails for the connection (not the content) the worker reconnects and
    flushes again, so the refused task's failure must still be waiting in the buffer (as any
    failure is until written: flush_failures pops only after the write).

    Found by review (every database): the batch was already taken off the buffer and the
    failure was appended only after save_metadata returned, so the OperationalError lost the
    outcome (the task stayed RUNNING until its lease ran out, then ran again). Now the failure
    is queued first and the metadata write's error is logged."""
    from django.db import OperationalError

    for i in range(2):
        tasks.echo.enqueue(i)
    now = _now()
    claimed = _claim_all(2)
    completer = Completer("atk", OxOptions(), object)
    completer.add(Finished(claimed[0], SUCCESSFUL, now, now, return_json="1", metadata_json='{"ok":1}'))
    completer.add(Finished(claimed[1], SUCCESSFUL, now, now, return_json="{not json", metadata_json='{"ok":2}'))

    def dropped(*_a, **_k):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr("ox.completer.sql.save_metadata", dropped)
    completer.isolate(connection, lambda batch: sql.complete(connection, batch))
    monkeypatch.undo()
    assert _row(claimed[0].id).status == Status.SUCCESSFUL
    # The worker's next round (after its reconnect) flushes what is still buffered.
    completer.flush(connection)
    row = _row(claimed[1].id)
    assert row.status == Status.FAILED, f"the refused task's outcome was dropped: it is {row.status}"
