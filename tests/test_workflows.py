"""Chains and groups (ox.workflow) with real worker subprocesses, on every database: results
flow along a chain, a group's callback gets every result once all succeeded, enqueue is one
transaction, the failure policies, cancel, and the repair sweep."""

import json
import time

import pytest
from django.db import connection, transaction
from django.tasks import TaskResultStatus

import ox
from ox import operations
from ox.models import Edge, Status, Task, Workflow
from ox.workflow.repair import Repairer
from tests import workflow_tasks as wt
from tests.helpers import wait_until
from tests.test_notify_idle import options
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def status(result) -> str:
    return Task.objects.get(pk=result.id).status


def value(result):
    return wt.add.get_backend().get_result(result.id).return_value


def settled(run, timeout: float = 30) -> None:
    ids = [r.id for r in run.results]
    wait_until(
        lambda: not Task.objects.filter(pk__in=ids, status__in=[Status.PENDING, Status.READY, Status.RUNNING]).exists(),
        timeout,
    )


def test_a_chain_passes_each_result_to_the_next(start_worker):
    run = ox.chain(wt.add.s(1, 2), wt.add.s(10), wt.add.s(100)).enqueue()
    assert [status(r) for r in run.results] == [Status.READY, Status.PENDING, Status.PENDING]
    # Django's contract has no PENDING: a task that waits has not started, it reads as READY.
    waiting = wt.add.get_backend().get_result(run.last.id)
    assert waiting.status == TaskResultStatus.READY and waiting.args == [100]
    assert Task.objects.filter(workflow_id=run.id).count() == 3
    start_worker()
    settled(run)
    assert [status(r) for r in run.results] == [Status.SUCCESSFUL] * 3
    assert [value(r) for r in run.results] == [3, 13, 113]
    assert Ledger.objects.filter(key="add").count() == 3


def test_a_group_callback_gets_every_result_in_order_once(start_worker):
    run = ox.group([wt.add.s(i, i) for i in range(6)]).then(wt.total.s()).enqueue()
    assert Task.objects.get(pk=run.last.id).waiting == 6
    start_worker("--concurrency", "3")
    settled(run)
    assert value(run.last) == sum(2 * i for i in range(6))
    assert Ledger.objects.filter(key="total").count() == 1
    # The callback's input, as it was handed to it: the members' results in group order.
    inputs = list(Edge.objects.filter(child_id=run.last.id).order_by("position").values_list("result", flat=True))
    assert [json.loads(r) for r in inputs] == [2 * i for i in range(6)]


def test_after_a_single_task_a_group_gets_its_result_and_a_group_of_one_gathers(start_worker):
    run = ox.chain(wt.shout.s("hi"), ox.group([wt.echo_all.s(1), wt.echo_all.s()]), wt.echo_all.s("end")).enqueue()
    start_worker()
    settled(run)
    assert [value(r) for r in run.results] == ["HI!", ["HI!", 1], ["HI!"], [[["HI!", 1], ["HI!"]], "end"]]
    one = ox.group([wt.shout.s("a")]).then(wt.echo_all.s()).enqueue()
    settled(one)
    assert value(one.last) == [["A!"]]


def test_async_tasks_in_a_chain(start_worker):
    run = ox.chain(wt.async_add.s(1, 1), wt.add.s(1), wt.async_add.s(5)).enqueue()
    start_worker()
    settled(run)
    assert value(run.last) == 8


def test_enqueue_is_one_transaction():
    before = Task.objects.count()
    with pytest.raises(RuntimeError), transaction.atomic():
        ox.chain(wt.add.s(1, 2), wt.add.s(3)).enqueue()
        raise RuntimeError("the caller's transaction rolls back")
    assert Task.objects.count() == before and not Workflow.objects.exists() and not Edge.objects.exists()
    # A call whose arguments cannot be stored is refused before anything is written.
    with pytest.raises((TypeError, ValueError)):
        ox.chain(wt.add.s(1, 2), wt.add.s(object())).enqueue()
    assert Task.objects.count() == before and not Workflow.objects.exists()


def test_bad_workflows_are_refused_clearly():
    with pytest.raises(ValueError, match="empty"):
        ox.chain()
    with pytest.raises(TypeError, match="signatures"):
        ox.group([wt.add])
    with pytest.raises(ValueError, match="policy"):
        ox.chain(wt.add.s(1, 2)).enqueue(policy="sometimes")
    with pytest.raises(ValueError, match="edges"):
        ox.chain(ox.group([wt.add.s(i, 0) for i in range(400)]), ox.group([wt.add.s(0, i) for i in range(300)]))
        ox.chain(
            ox.group([wt.add.s(i, 0) for i in range(400)]), ox.group([wt.add.s(0, i) for i in range(300)])
        ).enqueue()
    assert not Task.objects.exists()


def test_stop_cancels_what_follows_a_failure_and_on_failure_runs_once(start_worker):
    run = ox.chain(ox.group([wt.boom.s(), wt.boom.s(), wt.add.s(1, 1)]), wt.total.s(), wt.add.s(0)).enqueue(
        on_failure=wt.on_failure.s()
    )
    start_worker("--concurrency", "3")
    wait_until(lambda: Ledger.objects.filter(key="on_failure").exists(), 30)
    settled(run)
    statuses = [status(r) for r in run.results]
    assert statuses == [Status.FAILED, Status.FAILED, Status.SUCCESSFUL, Status.CANCELLED, Status.CANCELLED]
    time.sleep(1.0)  # the second failure must not enqueue another
    handlers = Task.objects.filter(workflow_id=run.id, task_path=wt.on_failure.module_path)
    assert handlers.count() == 1
    wait_until(lambda: handlers.get().status == Status.SUCCESSFUL, 20)
    info = handlers.get().return_value
    assert info["workflow"] == str(run.id) and info["status"] == "FAILED"
    assert info["task"] in {run.results[0].id, run.results[1].id}
    assert Ledger.objects.filter(key="on_failure").count() == 1
    assert not Ledger.objects.filter(key="total").exists()


def test_continue_runs_what_follows_with_none_for_the_failure(start_worker):
    run = ox.group([wt.add.s(1, 1), wt.boom.s(), wt.add.s(2, 2)]).then(wt.echo_all.s()).enqueue(policy="continue")
    start_worker()
    settled(run)
    assert status(run.results[1]) == Status.FAILED
    assert value(run.last) == [[2, None, 4]]


def test_cancelling_a_waiting_task_or_a_member(start_worker):
    run = ox.chain(wt.add.s(1, 1), wt.add.s(1), wt.add.s(1)).enqueue()
    changed = operations.cancel([run.results[1].id])
    assert changed.cancelled == 1
    # stop: what came after the cancelled task is cancelled with it, in the same transaction.
    assert [status(r) for r in run.results] == [Status.READY, Status.CANCELLED, Status.CANCELLED]
    group = ox.group([wt.add.s(i, 0) for i in range(3)]).then(wt.total.s()).enqueue()
    operations.cancel([group.results[0].id])
    assert status(group.last) == Status.CANCELLED
    start_worker()
    wait_until(lambda: status(run.results[0]) == Status.SUCCESSFUL, 20)
    wait_until(lambda: status(group.results[2]) == Status.SUCCESSFUL, 20)
    time.sleep(0.5)
    assert status(run.results[1]) == Status.CANCELLED and status(group.last) == Status.CANCELLED
    assert not Ledger.objects.filter(key="total").exists()


def test_a_chain_does_not_wait_for_polls(start_worker):
    """Each step's success makes the next READY in the same transaction, and the worker that
    wrote it claims again at once: five steps, no poll (30 s) between them."""
    run = ox.chain(*[wt.add.s(i, 0) if i == 0 else wt.add.s(i) for i in range(5)]).enqueue()
    worker = start_worker(env=options(poll_interval=30))
    wait_until(lambda: status(run.results[0]) == Status.SUCCESSFUL, 30)
    started = time.monotonic()
    settled(run, timeout=25)
    took = time.monotonic() - started
    assert value(run.last) == sum(range(5))
    assert took < 5, f"a 5-step chain took {took:.1f} s: its steps waited for polls (30 s)\n{worker.output()[-1500:]}"


def test_the_repair_sweep_joins_ends_no_join_saw():
    """The rescuer gives up on a task (FAILED by the rescue, not by a worker's join): the sweep
    applies the policy. A success recorded without its join (a row set by hand): the sweep
    counts the follower down and it becomes READY with the result as its input."""
    stop = ox.chain(wt.add.s(1, 1), wt.add.s(1), wt.add.s(1)).enqueue()
    go = ox.chain(wt.add.s(2, 2), wt.add.s(1)).enqueue()
    Task.objects.filter(pk=stop.results[0].id).update(status=Status.FAILED)
    Task.objects.filter(pk=go.results[0].id).update(status=Status.SUCCESSFUL, return_value=4)
    from django.utils import timezone

    assert Repairer().run(connection, timezone.now()) == 2
    assert [status(r) for r in stop.results] == [Status.FAILED, Status.CANCELLED, Status.CANCELLED]
    assert status(go.results[1]) == Status.READY
    assert json.loads(Edge.objects.get(child_id=go.results[1].id).result) == 4
    assert Repairer().run(connection, timezone.now()) == 0  # nothing left to repair


@pytest.mark.parametrize("policy", ["stop", "continue"])
def test_retrying_the_failed_part_reruns_only_it_and_what_follows(start_worker, tmp_path, policy):
    marker = tmp_path / "fixed"
    run = ox.chain(
        wt.add.s(1, 1, key="first"),
        ox.group([wt.flaky.s(key="a", marker=str(marker)), wt.add.s(5, key="sibling")]),
        wt.echo_all.s(),
    ).enqueue(policy=policy, on_failure=wt.on_failure.s())
    start_worker()
    wait_until(lambda: Ledger.objects.filter(key="on_failure").count() == 1, 30)
    settled(run)
    assert status(run.results[1]) == Status.FAILED
    assert status(run.last) == (Status.CANCELLED if policy == "stop" else Status.SUCCESSFUL)
    marker.touch()
    tries = Ledger.objects.filter(key="a").count()
    rows = list(Task.objects.filter(workflow_id=run.id).values_list("task_path", "status"))
    assert ox.retry_workflow(run.id) == 2, rows  # the failed member and the callback
    assert status(run.last) == Status.PENDING
    settled(run)
    assert value(run.last) == [["a", 7]]
    # What had succeeded ran once; the failed member once more; no second on-failure task.
    assert Ledger.objects.filter(key="first").count() == 1
    assert Ledger.objects.filter(key="sibling").count() == 1
    assert Ledger.objects.filter(key="a").count() == tries + 1
    assert Ledger.objects.filter(key="on_failure").count() == 1
    assert ox.retry_workflow(run.id) == 0


def test_a_unique_task_is_refused_in_a_workflow():
    with pytest.raises(ValueError, match="unique"):
        ox.chain(wt.add.s(1, 1), wt.add.using(unique=True).s(2)).enqueue()
    assert not Task.objects.exists() and not Workflow.objects.exists()


def test_retry_refuses_while_a_task_it_would_reset_runs():
    from ox.workflow.retry import StillRunning

    run = ox.chain(wt.add.s(1, 1), wt.add.s(1), wt.add.s(1)).enqueue(policy="continue")
    Task.objects.filter(pk=run.results[0].id).update(status=Status.FAILED)
    Task.objects.filter(pk=run.results[1].id).update(status=Status.RUNNING)
    with pytest.raises(StillRunning):
        ox.retry_workflow(run.id)
    assert status(run.results[0]) == Status.FAILED  # nothing changed


def test_cancelling_a_running_workflow_task_applies_the_policy(start_worker):
    run = ox.chain(wt.slow_step.s(seconds=30), wt.add.s(1, key="after")).enqueue()
    worker = start_worker(env=options(heartbeat=0.5))
    wait_until(lambda: status(run.results[0]) == Status.RUNNING, 20)
    assert operations.cancel([run.results[0].id]).cancel_requested == 1
    wait_until(lambda: status(run.results[0]) == Status.CANCELLED, 30)
    wait_until(lambda: status(run.last) == Status.CANCELLED, 10)
    assert not Ledger.objects.filter(key="after").exists(), worker.output()[-1500:]


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no wake-up: workers poll")
def test_an_idle_worker_of_the_followers_queue_is_woken(start_worker):
    """The follower is on a queue only another, idle worker serves: the join wakes it as an
    enqueue would, not at its poll (30 s)."""
    other = start_worker("--queues", "other", env=options(poll_interval=30))
    from ox.models import Worker

    wait_until(lambda: Worker.objects.filter(pid=other.pid, idle_since__isnull=False).exists(), 30)
    time.sleep(0.5)
    run = ox.chain(wt.add.s(1, 1), wt.add.using(queue_name="other").s(1)).enqueue()
    start_worker("--queues", "default", env=options(poll_interval=30))
    wait_until(lambda: status(run.results[0]) == Status.SUCCESSFUL, 30)
    started = time.monotonic()
    settled(run, timeout=25)
    took = time.monotonic() - started
    assert took < 5, f"the follower started {took:.1f} s after its predecessor: at the poll"
    assert value(run.last) == 3


def test_pruning_a_finished_workflow_takes_its_edges_and_its_row_with_it(start_worker):
    from datetime import timedelta

    from django.utils import timezone

    from ox.prune import prune

    done = ox.group([wt.add.s(i, 0) for i in range(3)]).then(wt.total.s()).enqueue()
    waiting = ox.chain(wt.add.s(1, 1), wt.add.using(queue_name="emails").s(1)).enqueue()
    worker = start_worker("--queues", "default")
    settled(done)
    wait_until(lambda: status(waiting.results[0]) == Status.SUCCESSFUL, 20)
    worker.signal(15)
    worker.wait(30)
    prune(connection, {"SUCCESSFUL": timedelta(0)}, timezone.now() + timedelta(seconds=5))
    assert not Task.objects.filter(workflow_id=done.id).exists()
    assert not Edge.objects.filter(workflow_id=done.id).exists() and not Workflow.objects.filter(pk=done.id).exists()
    # A finished task whose follower still waits: pruned, but the edge holding its result stays.
    assert not Task.objects.filter(pk=waiting.results[0].id).exists()
    assert json.loads(Edge.objects.get(workflow_id=waiting.id).result) == 2
    assert Workflow.objects.filter(pk=waiting.id).exists()
    start_worker("--queues", "emails")
    settled(waiting)
    assert value(waiting.last) == 3
