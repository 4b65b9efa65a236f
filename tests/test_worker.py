"""A real `runworker` subprocess: draining, retries, bad input, async tasks, SIGTERM."""

import json
import signal
from datetime import timedelta

import pytest
from django.db import connection
from django.tasks import TaskResultStatus, task_backends
from django.utils import timezone

from ox.backoff import default_delay
from ox.conf import OxOptions
from ox.models import Attempt, Outcome, Status, Task, Worker
from tests import tasks
from tests.helpers import wait_until
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def drain(start_worker, *args, timeout=60):
    worker = start_worker("--batch", *args)
    code = worker.wait(timeout=timeout)
    assert code == 0, worker.output()
    return worker


def result(r):
    return task_backends["default"].get_result(r.id)


def test_batch_worker_drains_and_exits_zero(start_worker):
    results = [tasks.echo.enqueue(i) for i in range(30)]
    drain(start_worker, "--concurrency", "4")
    for i, r in enumerate(results):
        fetched = result(r)
        assert fetched.status == TaskResultStatus.SUCCESSFUL and fetched.return_value == i
        assert len(fetched.worker_ids) == 1 and fetched.errors == []
    assert not Attempt.objects.exists()  # the happy path writes no attempt rows


def test_priority_order_in_a_concurrency_one_worker(start_worker):
    tasks.record.using(priority=-1).enqueue("last")
    tasks.record.enqueue("middle")
    tasks.record.using(priority=10).enqueue("first")
    drain(start_worker, "--concurrency", "1")
    assert list(Ledger.objects.order_by("id").values_list("key", flat=True)) == ["first", "middle", "last"]


def test_queues_option_routes(start_worker):
    default = tasks.echo.enqueue(1)
    other = tasks.other_queue.enqueue()
    drain(start_worker, "--queues", "other")
    assert result(other).status == TaskResultStatus.SUCCESSFUL
    assert result(default).status == TaskResultStatus.READY


def test_unknown_queue_is_a_clear_error(start_worker):
    worker = start_worker("--batch", "--queues", "nope")
    assert worker.wait(timeout=30) != 0
    assert "nope" in worker.output()


def test_async_tasks_run_concurrently_on_one_loop(start_worker):
    n, seconds = 20, 0.5
    results = [tasks.async_sleep.enqueue(seconds) for _ in range(n)]
    worker = drain(start_worker, "--async-concurrency", str(n))
    for r in results:
        assert result(r).status == TaskResultStatus.SUCCESSFUL
    rows = list(Task.objects.values_list("started_at", "finished_at"))
    # One after another the sleeps take n x seconds (10 s); overlapped, about one sleep plus
    # the claims. Half the serial time leaves a busy machine room and still fails if they
    # ran one (or two) at a time.
    span = max(f for _, f in rows) - min(s for s, _ in rows)
    assert span < timedelta(seconds=n * seconds / 2), (span, worker.output())


def test_retries_with_context_attempts_then_success(start_worker):
    r = tasks.fail_until_third.enqueue("k")
    drain(start_worker)
    fetched = result(r)
    assert fetched.status == TaskResultStatus.SUCCESSFUL and fetched.return_value == 3
    assert list(Ledger.objects.order_by("id").values_list("attempt", flat=True)) == [1, 2, 3]
    assert fetched.attempts == 3 and len(fetched.errors) == 2
    assert all(e.exception_class_path == "builtins.ValueError" for e in fetched.errors)
    assert "attempt 1 fails" in fetched.errors[0].traceback


def test_failed_after_budget_with_every_attempt_recorded(start_worker):
    r = tasks.always_fails.enqueue("nope")
    drain(start_worker)
    fetched = result(r)
    assert fetched.status == TaskResultStatus.FAILED
    assert len(fetched.errors) == 4 and fetched.attempts == 4
    attempts = list(Attempt.objects.filter(task_id=r.id).order_by("number"))
    assert [a.number for a in attempts] == [1, 2, 3, 4]
    assert {a.outcome for a in attempts} == {Outcome.FAILED}
    # backoff: each retry waited (0.05 s base, doubling, jittered) before the next attempt
    for before, after in zip(attempts, attempts[1:], strict=False):
        assert after.started_at - before.finished_at >= timedelta(seconds=0.02)


def test_backoff_returning_none_gives_up(start_worker):
    gave_up = tasks.give_up_on_keyerror.enqueue("key")
    retried = tasks.give_up_on_keyerror.enqueue("value")
    drain(start_worker)
    assert result(gave_up).attempts == 1 and result(gave_up).status == TaskResultStatus.FAILED
    assert result(retried).attempts == 5


def test_default_backoff_is_exponential_with_jitter_and_capped():
    opts = OxOptions(backoff_base=1.0, backoff_max=10.0)
    for attempt, ceiling in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 10), (20, 10)]:
        delays = [default_delay(attempt, opts) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 100  # jittered


def insert_raw(task_path, args_sql, kwargs_sql="'{}'"):
    now = timezone.now()
    row = Task.objects.create(task_path=task_path, args=[], kwargs={}, run_after=now, enqueued_at=now, max_attempts=3)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE ox_task SET args = {args_sql}, kwargs = {kwargs_sql} WHERE id = %s",
            [row.id if connection.vendor == "postgresql" else row.id.hex],
        )
    return row


def test_bad_input_fails_the_task_and_the_worker_carries_on(start_worker):
    gone = insert_raw("tests.tasks.no_such_task", "'[]'")
    not_a_task = insert_raw("tests.tasks.Unprintable", "'[]'")
    # Both databases check that the column holds JSON; a row can still hold the wrong shape.
    undecodable = insert_raw("tests.tasks.echo", '\'{"not": "a list"}\'')
    misfit = tasks.takes_two.enqueue(1)
    unprintable = tasks.raises_unprintable.enqueue()
    unpicklable = tasks.raises_unpicklable.enqueue()
    not_json = tasks.returns_set.enqueue()
    exits = tasks.exits.enqueue()
    fine = tasks.echo.enqueue("still works")
    worker = drain(start_worker, "--concurrency", "2")

    def row(r):
        return Task.objects.get(pk=getattr(r, "pk", None) or r.id)

    assert row(fine).status == Status.SUCCESSFUL, worker.output()
    for r in (gone, not_a_task, undecodable, misfit, unprintable, unpicklable, not_json, exits):
        assert row(r).status == Status.FAILED, (r, worker.output())
    assert "no longer imports" in Attempt.objects.filter(task_id=gone.pk).last().traceback
    assert "not a Task" in Attempt.objects.filter(task_id=not_a_task.pk).last().traceback
    assert "do not decode" in Attempt.objects.get(task_id=undecodable.pk).traceback
    assert "no longer fit" in Attempt.objects.get(task_id=misfit.id).traceback
    assert Attempt.objects.get(task_id=misfit.id).exception_class_path == "ox.exceptions.TaskUnrunnable"
    assert Attempt.objects.get(task_id=unprintable.id).exception_class_path == "tests.tasks.Unprintable"
    assert Attempt.objects.get(task_id=unpicklable.id).exception_class_path == "tests.tasks.Unpicklable"
    # Not storable: deterministic, so no retry (the body would return the same set again).
    assert "cannot be stored as JSON" in Attempt.objects.get(task_id=not_json.id).traceback
    assert row(not_json).attempts == 1
    assert Attempt.objects.get(task_id=exits.id).exception_class_path == "builtins.SystemExit"
    # decode and signature problems are permanent: one attempt, no retry
    assert row(undecodable).attempts == 1 and row(misfit).attempts == 1
    # an unimportable path is retried (a rolling deploy may bring it back) up to its budget
    assert row(gone).attempts == 3


def test_sigterm_mid_task_finishes_it_and_exits_zero(start_worker):
    r = tasks.record_then_sleep.enqueue("started", 1.5)
    worker = start_worker("--concurrency", "1")
    wait_until(lambda: Ledger.objects.filter(key="started").exists(), timeout=30)
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output()
    assert result(r).status == TaskResultStatus.SUCCESSFUL
    assert "worker stopped" in worker.output()


def test_max_tasks(start_worker):
    for i in range(5):
        tasks.echo.enqueue(i)
    worker = start_worker("--max-tasks", "2")
    assert worker.wait(timeout=30) == 0, worker.output()
    assert Task.objects.filter(status=Status.SUCCESSFUL).count() == 2
    assert Task.objects.filter(status=Status.READY).count() == 3


def test_idle_worker_wakes_for_a_delayed_task_without_polling_late(start_worker):
    interval = 30.0  # the poll interval must not be what wakes it
    # Due a third of the interval after enqueue: time for a worker to start on a busy machine
    # and go idle (SQLite has no NOTIFY: it must see the task at its first claim), far short
    # of its next poll.
    delay = interval / 3
    r = tasks.echo.using(run_after=timedelta(seconds=delay)).enqueue("due soon")
    worker = start_worker("--interval", str(interval))
    wait_until(lambda: Task.objects.filter(pk=r.id, status=Status.SUCCESSFUL).exists(), timeout=interval)
    row = Task.objects.get(pk=r.id)
    assert Worker.objects.get(pid=worker.pid).started_at < row.run_after, "the worker started after the task was due"
    # Woken at run_after, not at the poll about interval - delay later; interval / 10 (3 s)
    # leaves a busy machine room and still fails by a wide margin if it waited for the poll.
    assert row.started_at - row.run_after < timedelta(seconds=interval / 10), worker.output()


def test_task_finished_signal_sees_the_durable_outcome(start_worker):
    r = tasks.echo.enqueue({"x": [1]})
    drain(start_worker)
    assert json.loads(json.dumps(result(r).return_value)) == {"x": [1]}


def test_a_backend_with_empty_queues_needs_queues_named(settings):
    """Django reads QUEUES = [] as "any queue may be enqueued to": runworker cannot know which
    to claim, and says so instead of starting a worker that claims nothing."""
    from django.core.management import CommandError, call_command

    settings.TASKS = {"default": {**settings.TASKS["default"], "QUEUES": []}}
    with pytest.raises(CommandError, match="--queues"):
        call_command("runworker", "--batch")
