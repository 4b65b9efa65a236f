"""MAX_LOST counts the losses of tasks that may have started, not of tasks that waited,
prefetched, in the inboxes of workers that died (ox.start_marks, ox.sql.rescue_and_mark):
the rescue's rule on every database, a real worker writing the start mark of a task's second
attempt before its body, and a task that kills its workers at once still FAILED after MAX_LOST
of them."""

import pytest
from django.db import connection
from django.utils import timezone

from ox import clock, sql
from ox.models import Attempt, Outcome, Status, Task
from tests import start_mark_tasks, tasks
from tests.helpers import wait_until
from tests.test_durability import options

pytestmark = pytest.mark.django_db(transaction=True)


def lose(task_id, worker: str, now, max_lost: int, started: bool) -> tuple[str, object]:
    """A claim by a worker that dies, its body started (a start mark) or not; then the rescue.
    Returns (the task's status after it, the next `now`)."""
    (claimed,) = sql.claim(connection, worker, ["default"], 1, now, now)
    assert claimed.id == task_id
    if started:
        assert sql.mark_started(connection, claimed, now)
    now += timezone.timedelta(seconds=1)
    (rescued,) = sql.rescue(connection, now, max_lost=max_lost)
    return rescued[2], now


def test_unstarted_losses_after_the_first_attempt_do_not_count_toward_max_lost():
    r = tasks.echo.enqueue(1)
    task_id = Task.objects.get(pk=r.id).id
    now = clock.db_now(connection)
    # The first attempt, unmarked, counts: it may have killed its worker before any heartbeat.
    status, now = lose(task_id, "ghost-1", now, max_lost=3, started=False)
    assert status == "READY"
    # Claimed again and again by workers that die before it starts: never given up on.
    for i in range(2, 10):
        status, now = lose(task_id, f"ghost-{i}", now, max_lost=3, started=False)
        assert status == "READY", i
    # Losses of started bodies count: the first one's plus two more make three.
    status, now = lose(task_id, "ghost-10", now, max_lost=3, started=True)
    assert status == "READY"
    status, now = lose(task_id, "ghost-11", now, max_lost=3, started=True)
    assert status == "FAILED"
    row = Task.objects.get(pk=r.id)
    assert row.status == Status.FAILED and row.finished_at is not None
    attempts = list(Attempt.objects.filter(task_id=r.id).order_by("number"))
    assert [a.outcome for a in attempts] == [Outcome.LOST] * 11
    assert [a.started_at is not None for a in attempts] == [False] * 9 + [True] * 2


def test_a_first_attempt_lost_unmarked_still_counts():
    # A task that kills its worker at once leaves no mark on its first attempt.
    r = tasks.echo.enqueue(1)
    status, _now = lose(Task.objects.get(pk=r.id).id, "ghost", clock.db_now(connection), max_lost=1, started=False)
    assert status == "FAILED"


def test_a_mark_for_a_claim_fenced_out_is_refused():
    r = tasks.echo.enqueue(1)
    now = clock.db_now(connection)
    (old,) = sql.claim(connection, "old", ["default"], 1, now, now)
    sql.rescue(connection, now + timezone.timedelta(seconds=1))
    assert sql.mark_started(connection, old, now) is False
    assert Task.objects.get(pk=r.id).last_attempted_at is None


@pytest.mark.parametrize("task", [start_mark_tasks.marked_at_start, start_mark_tasks.amarked_at_start])
def test_a_second_attempt_is_marked_before_its_body_starts(start_worker, task):
    # The heartbeat writes a first attempt's mark up to 0.5 s after its body starts; a later
    # attempt's is written before. (Without ox.start_marks the body reads no mark: False.)
    r = task.enqueue()
    start_worker(env=options(heartbeat=5.0, lease=30.0, backoff_base=0.05))
    wait_until(lambda: Task.objects.get(pk=r.id).status in (Status.SUCCESSFUL, Status.FAILED), 30)
    row = Task.objects.get(pk=r.id)
    assert row.status == Status.SUCCESSFUL and row.attempts == 2
    assert row.return_value is True


def test_a_task_that_kills_its_workers_at_once_is_failed_after_max_lost(start_worker):
    # Its first loss is unmarked (counted: it may have started); from the second attempt on its
    # mark is written before the body, so each death counts. MAX_LOST 2: two workers die.
    fast = {"lease": 3.0, "heartbeat": 0.5, "rescue_interval": 0.5, "liveness_grace": 1.0, "max_lost": 2}
    r = start_mark_tasks.kills_its_worker.enqueue()
    # A worker of another queue stays alive throughout: the rescue is any live worker's duty.
    rescuer = start_worker("--queues", "other", env=options(**fast))
    for _ in range(2):
        victim = start_worker("--queues", "default", env=options(**fast))
        victim.wait(30)
        wait_until(lambda: Task.objects.get(pk=r.id).status != Status.RUNNING, 30)
    assert Task.objects.get(pk=r.id).status == Status.FAILED
    assert rescuer.proc.poll() is None
    attempts = list(Attempt.objects.filter(task_id=r.id).order_by("number"))
    assert [a.outcome for a in attempts] == [Outcome.LOST] * 2
    assert [a.started_at is not None for a in attempts] == [False, True]
