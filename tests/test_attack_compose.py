"""Adversarial tests of docs/composing.md: task metadata (ox.metadata), durable steps
(ox.steps), OpenTelemetry (ox.tracing) and their dashboard display, on every database, with
real worker subprocesses or an in-process worker. Tests headed 'Found by review (fixed)' failed
before the fix named in their commit."""

import json
import signal
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.tasks import TaskResultStatus, task_backends
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import StatusCode

import ox
from ox import clock, sql, steps
from ox.metadata import InvalidMetadata, context_for
from ox.models import ArchivedTask, Step, Task
from tests import compose_attack_tasks as ct
from tests import metadata_tasks as mt
from tests import tasks
from tests.helpers import wait_until
from tests.test_durability import options
from tests.test_tracing import attempt_spans, drain, spans  # noqa: F401  (spans: a fixture)
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

ODD = {
    "tab\tkey": "a\tb",
    "line\nkey": "x\ny\r\nz",
    "back\\slash": "C:\\path\\n\\t \\\\N \\N",
    "ünï 😀 \u2028\u2029": ["\u00a0", "é", "😀" * 3, "'\"", "%s", "{}"],
    "big": 10**30,
    "negbig": -(10**25),
    "floats": [0.1, 1e22, -2.5e-300, 1.0],
    "nested": {"a": {"b": {"c": [None, True, False, ""]}}},
    "empty": {},
    "\\N": "\\N",
}


def result(r):
    return task_backends["default"].get_result(r.id)


def _claim_one():
    now = clock.db_now(connection)
    (claimed,) = sql.claim(connection, "w-attack", ["default"], (1, 0), now, now + timedelta(seconds=60))
    return claimed, task_backends["default"].get_result(str(claimed.id))


def _raised(fn) -> BaseException | None:
    """What fn raised, kept short: pytest takes minutes to format a RecursionError's traceback."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        exc.__traceback__ = None
        return exc
    return None


def _sessions() -> set[int]:
    """The ids of the sessions on the test database now (PostgreSQL pids, MariaDB ids)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        else:
            cursor.execute("SELECT id FROM information_schema.PROCESSLIST WHERE db = DATABASE()")
        return {row[0] for row in cursor.fetchall()}


def _kill_sessions_since(before: set[int]) -> int:
    """End the sessions opened on the test database since `before` was taken (the worker's,
    its threads'): not this test process's own, which later tests go on using (killing those
    failed a later test's aenqueue on a terminated connection)."""
    ids = _sessions() - before
    with connection.cursor() as cursor:
        for session in ids:
            try:
                if connection.vendor == "postgresql":
                    cursor.execute("SELECT pg_terminate_backend(%s)", [session])
                else:
                    cursor.execute(f"KILL {int(session)}")
            except Exception:  # noqa: BLE001, S110  (gone already)
                pass
    return len(ids)


# ---------------------------------------------------------------- metadata at enqueue


@pytest.mark.parametrize("depth", [40, 5000])
def test_found_by_review_fixed_metadata_nested_too_deep_is_invalid_metadata_everywhere(depth):
    # Before the fix: depth 40 was stored on SQLite and PostgreSQL but refused by MariaDB's
    # CHECK (JSON_VALID allows 31 levels) with an IntegrityError; depth 5000 raised
    # RecursionError, not the promised InvalidMetadata.
    raised = _raised(lambda: tasks.echo.using(metadata={"deep": ct.nested(depth)}).enqueue(1))
    assert isinstance(raised, InvalidMetadata) and "deep" in str(raised), repr(raised)[:300]
    assert not Task.objects.exists()


def test_metadata_as_deep_as_every_database_takes_is_stored():
    given = {"deep": ct.nested(30)}
    assert result(tasks.echo.using(metadata=given).enqueue(1)).metadata == given


@pytest.mark.parametrize("count", [1, 3, 250])
def test_odd_metadata_survives_every_insert_path_unchanged(count):
    # One row (INSERT), a few (SQLite: json_each), many (PostgreSQL: COPY, whose text
    # format escapes backslash, tab and line breaks).
    bound = tasks.echo.using(metadata=ODD)
    results = ox.enqueue_many(bound, [((i,), {}) for i in range(count)])
    assert len(results) == count
    stored = Task.objects.filter(id__in=[r.id for r in results]).values_list("metadata", flat=True)
    assert list(stored) == [ODD] * count
    assert result(results[-1]).metadata == ODD


def test_unique_enqueue_many_and_aenqueue_store_the_metadata():
    import asyncio
    import concurrent.futures

    from tests import flow_tasks

    unique = flow_tasks.unique_all
    rs = ox.enqueue_many(unique.using(metadata={"u": 1}), [((i,), {}) for i in range(3)])
    assert [result(r).metadata for r in rs] == [{"u": 1}] * 3
    again = unique.using(metadata={"u": 2}).enqueue(0)  # a duplicate: the existing task's
    assert again.metadata == {"u": 1}
    # asyncio.run() in a thread of its own: an earlier test may have left this thread an event
    # loop, where asyncio.run() refuses to start.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        r = pool.submit(asyncio.run, tasks.echo.using(metadata={"a": "sync"}).aenqueue(9)).result(timeout=30)
    assert r.metadata == {"a": "sync"} and result(r).metadata == {"a": "sync"}


# ---------------------------------------------------------------- metadata while running


def test_found_by_review_fixed_unstorable_metadata_at_the_end_leaves_the_outcome(start_worker):
    # "A failure here is logged; the outcome stands." Before the fix at_end() let the
    # RecursionError of a too deep value out of run_sync: the SUCCESSFUL outcome was replaced
    # by a crash and the task failed.
    r = ct.deep_metadata_at_end.enqueue(3000)
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    done = result(r)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == "ok", done.errors
    assert done.metadata == {"progress": 0.5}  # as last saved; the unstorable end was not written


def test_a_retried_attempt_starts_with_the_metadata_given_and_saved_before(start_worker):
    r = ct.remembers_attempt_one.using(metadata={"given": "at enqueue"}).enqueue()
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    done = result(r)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.attempts == 2
    assert done.return_value["given"] == "at enqueue" and done.return_value["first"]["attempt"] == 1


def test_found_by_review_fixed_a_stale_attempt_hears_false_every_time_it_saves():
    # "an attempt whose lease was taken ... writes nothing, and the call returns False".
    # Before the fix the refused text counted as written: saving it again answered True.
    tasks.echo.using(metadata={"owner": "first"}).enqueue(1)
    claimed, running = _claim_one()
    context = context_for(running, claimed.id, claimed.fence, connection.alias)
    Task.objects.filter(id=claimed.id).update(fence=claimed.fence + 1)
    context.metadata["owner"] = "stale"
    assert context.save_metadata() is False
    time.sleep(1.05)  # past the interval: a direct write again
    assert context.save_metadata() is False
    context.metadata["owner"] = "first"  # what the row holds, as far as the attempt knew
    assert context.save_metadata() is False
    assert Task.objects.get(id=claimed.id).metadata == {"owner": "first"}


def test_sync_threads_and_async_tasks_side_by_side_keep_their_own_metadata(start_worker):
    sync = [ct.progress_then_note.using(metadata={"who": f"s{i}"}).enqueue(f"s{i}", 15, 0.02) for i in range(4)]
    many = [ct.aprogress_then_note.using(metadata={"who": f"a{i}"}).enqueue(f"a{i}", 40) for i in range(4)]
    worker = start_worker("--batch", "--concurrency", "4")
    assert worker.wait(timeout=60) == 0, worker.output()
    for i, r in enumerate(sync):
        assert result(r).metadata == {"who": f"s{i}", "progress": 1.0}
    for i, r in enumerate(many):
        assert result(r).metadata == {"who": f"a{i}", "progress": 1.0, f"a{i}": 40}


def test_sigterm_lets_the_task_finish_and_its_last_throttled_progress_is_written(start_worker):
    r = ct.progress_then_note.enqueue("term", 25, 0.06)
    worker = start_worker()
    wait_until(lambda: 0 < (result(r).metadata.get("progress") or 0), timeout=30, interval=0.05)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    (note,) = Ledger.objects.filter(key__startswith="term:").values_list("key", flat=True)
    assert note == "term:25" and result(r).metadata == {"progress": 1.0}
    assert result(r).status == TaskResultStatus.SUCCESSFUL


@pytest.mark.skipif(connection.vendor == "sqlite", reason="sessions to kill")
def test_found_by_review_fixed_async_saves_and_steps_survive_killed_sessions(start_worker):
    # asave_metadata() and astep() write from the event loop's executor threads. Before the
    # fix each such thread kept its own connection for good: once the server ended those
    # sessions (a restart, an idle timeout), every later save or step of an async task on
    # that thread failed with "connection already closed".
    first = [ct.async_save_and_step.enqueue(f"k{i}") for i in range(4)]
    before = _sessions()
    worker = start_worker("--concurrency", "4", env=options(heartbeat=0.3))
    wait_until(lambda: all(result(r).status == TaskResultStatus.SUCCESSFUL for r in first), timeout=30)
    assert _kill_sessions_since(before) >= 1
    time.sleep(0.5)
    later = [ct.async_save_and_step.enqueue(f"later{i}") for i in range(4)]
    wait_until(lambda: all(result(r).is_finished for r in later), timeout=30)
    for r in later:
        done = result(r)
        assert done.status == TaskResultStatus.SUCCESSFUL, done.errors and done.errors[-1].traceback
        assert done.metadata == {"stage": "done"}
    worker.signal(signal.SIGTERM)
    worker.wait(timeout=30)


# ---------------------------------------------------------------- steps


@pytest.mark.parametrize("name", ["a\x00b", "lone \ud800"], ids=["nul", "surrogate"])
def test_found_by_review_fixed_a_step_name_no_database_stores_is_refused_before_the_step_runs(name):
    # Before the fix the step's fn ran (its side effect done), then the INSERT of its name
    # failed: every attempt ran it again and failed again.
    tasks.echo.enqueue(1)
    claimed, _ = _claim_one()
    ran = []
    token = steps.enter(claimed.id, claimed.fence, claimed.attempts, connection.alias)
    try:
        with pytest.raises(steps.StepError):
            ox.step(name, ran.append, 1)
    finally:
        steps.leave(token)
    assert ran == []


def test_odd_but_storable_step_names_and_results_round_trip():
    tasks.echo.enqueue(1)
    claimed, _ = _claim_one()
    names = ["😀" * 200, "Step A", "step a", "s", "s ", "<b>x</b>", "ä", "a"]
    values = [10**30, -0.0, "\u2028 é", {"1": [1.5, None]}, ct.nested(30), "", [], {}]
    token = steps.enter(claimed.id, claimed.fence, claimed.attempts, connection.alias)
    try:
        for name, value in zip(names, values, strict=True):
            assert ox.step(name, lambda v=value: v) == value
    finally:
        steps.leave(token)
    stored = dict(Step.objects.filter(task_id=claimed.id).values_list("name", "result"))
    assert stored == dict(zip(names, values, strict=True))
    token = steps.enter(claimed.id, claimed.fence, claimed.attempts + 1, connection.alias)
    try:  # a later attempt replays each, by its exact name
        assert [ox.step(n, pytest.fail) for n in names] == values
    finally:
        steps.leave(token)


def test_found_by_review_fixed_a_step_result_too_deep_fails_clearly_not_as_a_lost_lease():
    # MariaDB's JSON_VALID refuses more than 31 levels: before the fix its CHECK violation
    # (an IntegrityError) was read as "recorded already" and raised LeaseLost, and SQLite and
    # PostgreSQL stored what MariaDB could not.
    tasks.echo.enqueue(1)
    claimed, _ = _claim_one()
    token = steps.enter(claimed.id, claimed.fence, claimed.attempts, connection.alias)
    try:
        raised = _raised(lambda: ox.step("deep", ct.nested, 40))
        assert isinstance(raised, ValueError) and "deep" in str(raised), repr(raised)[:300]
        assert ox.step("after", int, 3) == 3  # the attempt still holds its task
    finally:
        steps.leave(token)


def test_a_step_rolled_back_with_the_callers_transaction_runs_again(start_worker):
    r = ct.step_in_rolled_back_atomic.enqueue("atomic")
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    done = result(r)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == "ran in attempt 2"
    assert Ledger.objects.filter(key="atomic").count() == 1  # attempt 1's ledger row rolled back too
    assert list(Step.objects.filter(task_id=r.id).values_list("attempt", flat=True)) == [2]


def test_an_archived_task_keeps_metadata_and_steps_and_ox_retry_replays_them(start_worker, client):
    from django.contrib.auth.models import User
    from django.urls import reverse

    from ox.archive import archive_batch
    from tests import step_tasks as st

    r = st.five_steps.using(metadata={"note": "<script>alert(1)</script>"}).enqueue("arch", 3)
    Task.objects.filter(id=r.id).update(max_attempts=1)
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    Task.objects.filter(id=r.id).update(finished_at=clock.db_now(connection) - timedelta(days=1))
    assert archive_batch(connection, "FAILED", clock.db_now(connection), 100, wait=True) == 1
    assert ArchivedTask.objects.filter(id=r.id).exists() and not Task.objects.filter(id=r.id).exists()
    assert result(r).metadata == {"note": "<script>alert(1)</script>"}
    client.force_login(User.objects.create_user("compose-staff", password="pw", is_staff=True, is_superuser=True))
    body = client.get(reverse("dashboard:task", args=[r.id])).content.decode()
    section = body.split('id="task-steps"', 1)[1].split("</section>", 1)[0]
    assert section.count("<tr>") == 3 and "<script>alert" not in body  # the head, s1 and s2
    assert ox.retry([r.id]).retried == 1
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert result(r).status == TaskResultStatus.SUCCESSFUL and result(r).return_value == 150
    assert Ledger.objects.filter(key="arch:s1").count() == 1 and Ledger.objects.filter(key="arch:s3").count() == 2


# ---------------------------------------------------------------- tracing


def test_each_attempt_of_a_retried_task_is_a_span_under_the_enqueuers(spans):  # noqa: F811
    with trace.get_tracer("tests").start_as_current_span("web request") as request_span:
        ct.fails_once_traced.enqueue()
    deadline = time.monotonic() + 30
    while len(attempt_spans(spans)) < 2 and time.monotonic() < deadline:
        drain()
    first, second = sorted(attempt_spans(spans), key=lambda s: s.attributes["ox.attempt"])
    parent = request_span.get_span_context()
    for span in (first, second):
        assert span.context.trace_id == parent.trace_id and span.parent.span_id == parent.span_id
    assert (first.attributes["ox.attempt"], second.attributes["ox.attempt"]) == (1, 2)
    assert first.status.status_code == StatusCode.ERROR and second.status.status_code == StatusCode.UNSET


@pytest.mark.parametrize(
    "carried",
    [5, "00-abc", {"traceparent": 5}, {"traceparent": "garbage"}, {"traceparent": [None]}, {"tracestate": {}}],
)
def test_a_bogus_otel_entry_in_the_metadata_runs_the_task_anyway(spans, carried):  # noqa: F811
    r = ct.plain_ok.using(metadata={"otel": carried}).enqueue()
    drain()
    assert result(r).status == TaskResultStatus.SUCCESSFUL
    assert all(s.parent is None for s in attempt_spans(spans))


class _Exploding:
    armed = False

    def on_start(self, span, parent_context=None):
        if self.armed:
            raise RuntimeError("span processor on_start")

    def on_end(self, span):
        if self.armed:
            raise RuntimeError("span processor on_end")

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True

    def _on_ending(self, span):
        pass


_exploding = _Exploding()


def test_a_span_processor_that_raises_never_fails_the_task(spans):  # noqa: F811
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    if _exploding not in provider._active_span_processor._span_processors:
        provider.add_span_processor(_exploding)
    _exploding.armed = True
    try:
        sync = ct.plain_ok.enqueue()
        asynchronous = mt.aprogress.enqueue(3)
        drain()
    finally:
        _exploding.armed = False
    assert result(sync).status == TaskResultStatus.SUCCESSFUL
    assert result(asynchronous).status == TaskResultStatus.SUCCESSFUL


# ---------------------------------------------------------------- dashboard


def test_metadata_html_in_keys_values_and_stage_is_escaped_on_every_page(client):
    from django.contrib.auth.models import User
    from django.urls import reverse

    from tests.test_dashboard_support import make_task

    evil = {
        "<img src=x onerror=alert(1)>": "</pre><script>alert(2)</script>",
        "progress": 0.5,
        "stage": "<svg/onload=alert(3)>",
    }
    task = make_task("RUNNING", metadata=evil)
    client.force_login(User.objects.create_user("xss-staff", password="pw", is_staff=True, is_superuser=True))
    pages = [
        client.get(reverse("dashboard:task", args=[task.pk])).content.decode(),
        client.get(reverse("dashboard:running")).content.decode(),
        client.get(reverse("dashboard:overview"), headers={"HX-Request": "true"}).content.decode(),
    ]
    for body in pages:
        assert "<script>alert" not in body and "<img src=x" not in body and "<svg/onload" not in body
    assert "50 %" in pages[0] and "&lt;svg/onload=alert(3)&gt;" in pages[0]


@pytest.mark.parametrize("value", [10**400, "0.5", 1e-320, 1, 0, json.loads("1e400")])
def test_odd_progress_values_draw_a_bar_only_for_numbers_in_range(client, value):
    from dashboard.templatetags.dashboard import progress

    expected = None if isinstance(value, str) or value > 1 else float(value)
    assert progress({"progress": value}) == expected
