"""Durable steps (ox.steps): a retried attempt gets recorded results back instead of running
finished steps again; recording is fenced to the attempt; a worker SIGKILLed mid-task leaves
its finished steps recorded. Real worker subprocesses, on every database."""

import signal
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count
from django.tasks import TaskResultStatus, task_backends

import ox
from ox import clock, sql, steps
from ox.models import Step, Task
from tests import step_tasks as st
from tests.helpers import wait_until
from tests.test_durability import options
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def result(r):
    return task_backends["default"].get_result(r.id)


def runs(key: str) -> dict[str, int]:
    rows = Ledger.objects.filter(key__startswith=f"{key}:").values_list("key").annotate(n=Count("id"))
    return {k.split(":", 1)[1]: n for k, n in rows}


def test_a_task_failing_at_step_five_runs_only_step_five_again(start_worker):
    r = st.five_steps.enqueue("f", 5)
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    done = result(r)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 150 and done.attempts == 2
    assert runs("f") == {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 2}
    recorded = list(Step.objects.filter(task_id=r.id).order_by("started_at").values_list("name", "result", "attempt"))
    assert recorded == [("s1", 10, 1), ("s2", 20, 1), ("s3", 30, 1), ("s4", 40, 1), ("s5", 50, 2)]


def test_a_retry_from_the_dashboard_replays_the_recorded_steps(start_worker):
    r = st.five_steps.enqueue("m", 3)
    Task.objects.filter(id=r.id).update(max_attempts=1)  # no automatic retry: it ends FAILED
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert result(r).status == TaskResultStatus.FAILED
    assert runs("m") == {"s1": 1, "s2": 1, "s3": 1}
    assert ox.retry([r.id]).retried == 1
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    assert result(r).status == TaskResultStatus.SUCCESSFUL and result(r).return_value == 150
    assert runs("m") == {"s1": 1, "s2": 1, "s3": 2, "s4": 1, "s5": 1}


def test_async_steps_are_recorded_and_replayed_as_json(start_worker):
    r = st.async_steps.enqueue("a")
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    done = result(r)
    assert done.status == TaskResultStatus.SUCCESSFUL
    # A tuple comes back a list, on the attempt that ran the step as on the one that replayed it.
    assert done.return_value == [{"n": 1, "pair": [1, 1]}, {"n": 2, "pair": [2, 2]}]
    assert runs("a") == {"s1": 1, "s2": 2}


def test_a_worker_sigkilled_in_step_four_leaves_steps_one_to_three_run_once(start_worker, tmp_path):
    # SQLite has no liveness lock: the rescue waits for the lease, kept short here.
    env = options(lease=3.0, heartbeat=0.5, rescue_interval=0.5, liveness_grace=1.0)
    gate = tmp_path / "gate"
    r = st.killed_in_step_four.enqueue("k", str(gate))
    first = start_worker("--concurrency", "1", env=env)
    wait_until(lambda: Step.objects.filter(task_id=r.id).count() == 3, timeout=30)
    first.signal(signal.SIGKILL)
    first.wait(timeout=10)
    gate.touch()  # a later attempt would not wait anyway; this one is gone
    second = start_worker("--concurrency", "1", env=env)
    wait_until(lambda: result(r).status == TaskResultStatus.SUCCESSFUL, timeout=60, interval=0.2)
    assert result(r).return_value == [10, 20, 30, "four", 50], second.output()
    assert runs("k") == {"s1": 1, "s2": 1, "s3": 1, "s4": 1, "s5": 1}
    assert result(r).attempts == 2


@pytest.mark.parametrize(
    ("fn", "says"),
    [(st.same_name_twice, "already used in this attempt"), (st.unstorable_step, "JSON")],
)
def test_a_misused_step_fails_its_task_clearly_and_the_worker_goes_on(start_worker, fn, says):
    bad = fn.enqueue()
    good = st.five_steps.enqueue("after", 0)
    worker = start_worker("--batch", "--concurrency", "1")
    assert worker.wait(timeout=60) == 0, worker.output()
    failed = result(bad)
    assert failed.status == TaskResultStatus.FAILED and says in failed.errors[-1].traceback
    assert result(good).status == TaskResultStatus.SUCCESSFUL


def test_a_step_outside_a_worker_is_a_clear_error():
    with pytest.raises(steps.StepError, match="only inside a task run by an ox worker"):
        ox.step("x", int, 1)


def _claimed():
    st.five_steps.enqueue("direct", 0)
    now = clock.db_now(connection)
    (claimed,) = sql.claim(connection, "w-test", ["default"], (1, 0), now, now + timedelta(seconds=60))
    return claimed


def test_an_attempt_whose_lease_was_taken_records_nothing_and_stops():
    claimed = _claimed()
    token = steps.enter(claimed.id, claimed.fence, claimed.attempts, connection.alias)
    try:
        assert ox.step("first", int, 1) == 1
        Task.objects.filter(id=claimed.id).update(fence=claimed.fence + 1)  # rescued and claimed again
        with pytest.raises(steps.LeaseLost, match="not recorded"):
            ox.step("second", int, 2)
    finally:
        steps.leave(token)
    assert list(Step.objects.filter(task_id=claimed.id).values_list("name", flat=True)) == ["first"]


def test_pruning_a_task_prunes_its_steps():
    from ox.prune import prune_batch

    claimed = _claimed()
    token = steps.enter(claimed.id, claimed.fence, claimed.attempts, connection.alias)
    try:
        ox.step("kept-until-pruned", int, 1)
    finally:
        steps.leave(token)
    long_ago = clock.db_now(connection) - timedelta(days=400)
    Task.objects.filter(id=claimed.id).update(status="SUCCESSFUL", finished_at=long_ago)
    assert prune_batch(connection, "SUCCESSFUL", long_ago + timedelta(seconds=1), 100, wait=True) == 1
    assert not Step.objects.filter(task_id=claimed.id).exists()


def test_the_task_page_lists_the_steps_with_their_durations(client, start_worker):
    from django.contrib.auth.models import User
    from django.urls import reverse

    r = st.five_steps.enqueue("page", 2)
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    client.force_login(User.objects.create_user("steps-staff", password="pw", is_staff=True, is_superuser=True))
    body = client.get(reverse("dashboard:task", args=[r.id])).content.decode()
    section = body.split('id="task-steps"', 1)[1].split("</section>", 1)[0]
    assert [f">s{n}<" in section for n in range(1, 6)] == [True] * 5
    assert section.count("<tr>") == 6  # the head and five steps


def test_docs_composing_names_only_tests_and_names_that_exist():
    """docs/composing.md: every test file it cites exists, and every `ox.` name resolves."""
    import importlib
    import re

    from tests.conftest import ROOT

    text = (ROOT / "docs" / "composing.md").read_text()
    cited = set(re.findall(r"`(tests/[\w/]+\.py)", text))
    assert cited and all((ROOT / path).is_file() for path in cited), cited
    tracing_source = (ROOT / "ox" / "tracing.py").read_text()
    for name in set(re.findall(r"`(ox(?:\.\w+)+)", text)):
        if f'"{name}"' in tracing_source:
            continue  # a span attribute's name (ox.attempt, ox.outcome), set there
        module, _, attr = name.rpartition(".")
        try:
            target = importlib.import_module(name)
        except ImportError:
            target = getattr(importlib.import_module(module), attr, None)
        assert target is not None, name


def test_the_demo_trickles_only_under_run(settings, monkeypatch):
    """demo.apps: the trickle schedule is added under ./run (OX_RUN=1), not otherwise (the
    tests run with DEBUG on, as ./run does, and must not trickle)."""
    import copy
    import importlib

    from django.apps import apps

    # Looked up by name, not imported: ./run new NAME --without-demo removes the app, and then
    # these skip (tests/test_make_yours.py finds no import of it left anywhere).
    if not apps.is_installed("demo"):
        pytest.skip("the demo app was removed (./run new NAME --without-demo)")
    config = apps.get_app_config("demo")
    TRICKLE = importlib.import_module(f"{config.name}.apps").TRICKLE
    settings.TASKS = copy.deepcopy(settings.TASKS)
    assert "demo-trickle" not in settings.TASKS["default"]["OPTIONS"].get("SCHEDULES", {})
    monkeypatch.delenv("OX_RUN", raising=False)
    config.ready()
    assert "demo-trickle" not in settings.TASKS["default"]["OPTIONS"].get("SCHEDULES", {})
    monkeypatch.setenv("OX_RUN", "1")
    config.ready()
    assert settings.TASKS["default"]["OPTIONS"]["SCHEDULES"]["demo-trickle"] == TRICKLE


def test_the_demo_report_draws_its_bar_and_records_its_step(start_worker):
    from django.apps import apps
    from django.utils.module_loading import import_string

    if not apps.is_installed("demo"):
        pytest.skip("the demo app was removed (./run new NAME --without-demo)")
    export_report = import_string("demo.tasks.export_report")

    r = export_report.enqueue(5, 0.01)
    worker = start_worker("--batch", "--queues", "reports")
    assert worker.wait(timeout=60) == 0, worker.output()
    done = result(r)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5
    assert done.metadata == {"stage": "done", "progress": 1.0}
    assert list(Step.objects.filter(task_id=r.id).values_list("name", flat=True)) == ["load"]
