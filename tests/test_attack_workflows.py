"""Attacks on workflows (ox.workflow): ends no join saw, retries outside the workflow's own
retry, on-failure tasks run again, results
at JSON's edges. Real worker subprocesses where a worker runs anything; every database."""

import signal
import time

import pytest
from django.db import connection

import ox
from ox import operations
from ox.models import Status, Task
from tests import workflow_attack_tasks as at
from tests.helpers import wait_until
from tests.test_dashboard_support import operator_fixture  # noqa: F401
from tests.test_durability import options
from tests.test_workflows import settled, status, value
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_last_task_the_rescuer_gives_up_on_still_enqueues_on_failure(start_worker):
    """The rescuer FAILs a task whose worker died max_lost times: no worker's join saw that
    end. The repair sweep only walks PENDING followers, so for the workflow's last task
    (nothing follows it) the on-failure task was never enqueued."""
    lease, heartbeat, rescue = (3.0, 0.5, 0.5) if connection.vendor == "sqlite" else (30.0, 3.0, 0.5)
    env = options(lease=lease, heartbeat=heartbeat, rescue_interval=rescue, liveness_grace=1.0, max_lost=1)
    run = ox.chain(at.add.s(1, 1), at.slow.s(seconds=60)).enqueue(on_failure=at.handler.s())
    victim = start_worker(env=env)
    wait_until(lambda: status(run.last) == Status.RUNNING, 30)
    victim.signal(signal.SIGKILL)
    victim.wait(10)
    start_worker(env=env)
    wait_until(lambda: status(run.last) == Status.FAILED, 30)
    # Joined by the rescue itself, not left to a sweep that never looks at it.
    wait_until(lambda: Ledger.objects.filter(key="handler").exists(), 10)
    handler = Task.objects.get(workflow_id=run.id, task_path=at.handler.module_path)
    wait_until(lambda: Task.objects.get(pk=handler.pk).status == Status.SUCCESSFUL, 20)
    info = Task.objects.get(pk=handler.pk).return_value
    assert info["task"] == run.last.id and info["status"] == "FAILED"


def test_retrying_the_workflow_does_not_run_an_old_on_failure_task_again(start_worker, tmp_path):
    """An on-failure task that failed itself is a FAILED task of the workflow. Once a retry
    reset handler_id, the next retry took it for part of the workflow and ran it again."""
    marker = tmp_path / "fixed"
    run = ox.chain(at.add.s(1, 1), at.flaky.s(key="flaky", marker=str(marker))).enqueue(
        on_failure=at.failing_handler.s()
    )
    start_worker()
    wait_until(lambda: Ledger.objects.filter(key="handler").count() == 1, 30)
    handler = Task.objects.get(workflow_id=run.id, task_path=at.failing_handler.module_path)
    wait_until(lambda: Task.objects.get(pk=handler.pk).status == Status.FAILED, 20)
    marker.touch()
    assert ox.retry_workflow(run.id) == 1  # the failed step, not the handler
    settled(run)
    assert status(run.last) == Status.SUCCESSFUL
    # Nothing failed any more: a second retry has nothing to do, and the handler stays put.
    assert ox.retry_workflow(run.id) == 0
    time.sleep(1.0)
    assert Ledger.objects.filter(key="handler").count() == 1
    assert Task.objects.get(pk=handler.pk).status == Status.FAILED


def test_ox_retry_of_a_cancelled_waiting_task_still_waits_for_what_comes_before(start_worker):
    """ox.cancel of a PENDING task, then ox.retry of it: it went READY and ran at once,
    before its predecessor, with None as its input."""
    run = ox.chain(at.add.using(queue_name="reports").s(1, 1), at.echo_all.s(key="after")).enqueue()
    assert operations.cancel([run.last.id]).cancelled == 1
    assert operations.retry([run.last.id]).retried == 1
    assert status(run.last) == Status.PENDING  # still waits for the first task
    start_worker("--queues", "default")
    time.sleep(1.5)
    assert not Ledger.objects.filter(key="after").exists(), "ran before the task it comes after"
    start_worker("--queues", "reports,default")
    settled(run)
    assert value(run.last) == [2]
    assert Ledger.objects.filter(key="after").count() == 1


def test_ox_retry_of_a_failed_member_under_continue_is_not_counted_twice(start_worker, tmp_path):
    """continue: a failed member counts its follower down (its result None). ox.retry of the
    member and its success must not count the follower down a second time: the follower
    still waits for the other member."""
    marker = tmp_path / "fixed"
    run = (
        ox.group([at.flaky.s(key="flaky", marker=str(marker)), at.add.using(queue_name="reports").s(2, 2)])
        .then(at.echo_all.s(key="after"))
        .enqueue(policy="continue")
    )
    worker = start_worker("--queues", "default")
    wait_until(lambda: status(run.results[0]) == Status.FAILED, 30)
    assert Task.objects.get(pk=run.last.id).waiting == 1
    marker.touch()
    assert operations.retry([run.results[0].id]).retried == 1
    wait_until(lambda: status(run.results[0]) == Status.SUCCESSFUL, 30)
    time.sleep(0.5)
    row = Task.objects.get(pk=run.last.id)
    assert (row.status, row.waiting) == (Status.PENDING, 1), worker.output()[-1500:]
    start_worker("--queues", "reports")
    settled(run)
    assert Ledger.objects.filter(key="after").count() == 1


def test_a_member_retried_by_backoff_then_succeeding_joins_once(start_worker):
    """A member fails twice (its attempts not spent: back to READY, no join) then succeeds:
    the callback runs once, with that member's result; the task after a retried step gets
    its predecessor's result again on every attempt (inputs read at each claim)."""
    run = (
        ox.group([at.add.s(1, 1), at.fails_then.s(key="m", times=2)])
        .then(at.fails_then.s(key="cb", times=1), at.echo_all.s(key="end"))
        .enqueue(on_failure=at.handler.s())
    )
    start_worker("--concurrency", "2")
    settled(run)
    assert [status(r) for r in run.results] == [Status.SUCCESSFUL] * 4
    assert Ledger.objects.filter(key="m").count() == 3 and Ledger.objects.filter(key="cb").count() == 2
    assert value(run.results[2]) == ["cb", [2, ["m"]]]
    assert value(run.last) == [["cb", [2, ["m"]]]]
    assert Ledger.objects.filter(key="end").count() == 1 and not Ledger.objects.filter(key="handler").exists()


def test_a_nested_chain_ending_in_a_group_of_one_still_gathers(start_worker):
    """A group of one gathers: what follows it gets a list. The same group at the end of a
    chain nested in a chain handed its follower the bare result instead."""
    flat = ox.chain(at.add.s(1, 1), ox.group([at.same.s()]), at.echo_all.s()).enqueue()
    nested = ox.chain(ox.chain(at.add.s(1, 1), ox.group([at.same.s()])), at.echo_all.s()).enqueue()
    start_worker()
    settled(flat)
    settled(nested)
    assert value(flat.last) == [[2]]
    assert value(nested.last) == value(flat.last)


def test_a_cancelled_hand_back_joins_at_once():
    """A claimed, unstarted task whose cancel was requested goes back CANCELLED (the worker's
    hand-back): what follows it under "stop" is cancelled then, and the on-failure task
    enqueued, not left to the repair sweep (which never enqueues it for a last task)."""
    from django.db.models import F
    from django.utils import timezone

    from ox import sql

    run = ox.chain(at.add.s(1, 1), at.add.s(1)).enqueue(on_failure=at.handler.s())
    last = ox.chain(at.add.s(2, 2)).enqueue(on_failure=at.handler.s())
    ids = [run.results[0].id, last.last.id]
    claimed = {"status": Status.RUNNING, "attempts": 1, "fence": F("fence") + 1}
    Task.objects.filter(pk__in=ids).update(cancel_requested=True, **claimed)
    held = list(Task.objects.filter(pk__in=ids).values_list("pk", "fence"))
    assert sql.hand_back(connection, held, timezone.now(), [pk for pk, _f in held]) == 2
    assert [status(r) for r in run.results] == [Status.CANCELLED, Status.CANCELLED]
    handlers = Task.objects.filter(task_path=at.handler.module_path)
    assert sorted(str(w) for w in handlers.values_list("workflow_id", flat=True)) == sorted([str(run.id), str(last.id)])


def test_the_dashboard_offers_cancel_for_a_waiting_workflow_task(client, operator):
    """ox.cancel takes PENDING tasks (docs/composing.md), but a PENDING task's page had no
    Cancel button: it offered one for READY and RUNNING tasks only."""
    from django.urls import reverse

    run = ox.chain(at.add.s(1, 1), at.add.s(1)).enqueue()
    page = client.get(reverse("dashboard:task", args=[run.last.id]))
    assert page.status_code == 200 and b'id="cancel-button"' in page.content
    client.post(reverse("dashboard:cancel", args=[run.last.id]))
    assert status(run.last) == Status.CANCELLED


def test_big_and_odd_results_flow_along_edges(start_worker):
    size = 1_000_000
    run = ox.chain(at.big.s(size), at.describe.s()).enqueue()
    gathered = ox.group([at.odd.s("a"), at.big.s(10)]).then(at.same.s()).enqueue()
    start_worker()
    settled(run, 60)
    settled(gathered, 60)
    assert value(run.last) == {"type": "str", "len": size}
    expected = at.odd.call("a")
    assert value(gathered.last) == [expected, "x" * 10]
