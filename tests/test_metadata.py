"""Task metadata (ox.metadata), in the shape of Django's proposal (new-features #141): given at
enqueue, read and saved by the running task (fenced, at most one write per interval from its
thread, the rest by the heartbeat), saved at the end whatever the outcome, read back with the
result. On every database; the running parts with real worker subprocesses."""

import math
from datetime import timedelta

import pytest
from django.db import connection
from django.tasks import TaskResultStatus, task_backends
from django.test.utils import CaptureQueriesContext

import ox
from ox import clock, sql
from ox.metadata import MAX_BYTES, InvalidMetadata, OxTaskResult, context_for, flush_waiting
from ox.models import Task
from tests import metadata_tasks as mt
from tests import tasks
from tests.helpers import wait_until
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)


def result(r):
    return task_backends["default"].get_result(r.id)


def test_the_backend_says_it_supports_metadata():
    assert task_backends["default"].supports_metadata is True


def test_metadata_given_at_enqueue_comes_back_with_the_result():
    given = {"trace": "00-abc-01", "tags": ["a", "b"], "n": 3, "nested": {"ü": None}}
    r = tasks.echo.using(metadata=given).enqueue(1)
    assert isinstance(r, OxTaskResult) and r.metadata == given
    assert result(r).metadata == given
    assert result(tasks.echo.enqueue(2)).metadata == {}  # none given: an empty dict, as proposed
    assert Task.objects.get(id=tasks.echo.enqueue(3).id).metadata is None  # and nothing written


def test_metadata_is_copied_at_using_so_later_changes_to_the_callers_dict_do_not_leak():
    given = {"a": 1}
    bound = tasks.echo.using(metadata=given)
    given["a"] = 2
    assert result(bound.enqueue(1)).metadata == {"a": 1}


def test_bulk_enqueue_stores_the_metadata_of_every_row():
    results = ox.enqueue_many(tasks.echo.using(metadata={"batch": 7}), [((i,), {}) for i in range(5)])
    assert [result(r).metadata for r in results] == [{"batch": 7}] * 5


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (["not", "a", "dict"], "must be a dict"),
        ({1: "x"}, "key"),
        ({"x": math.nan}, "(?i)nan"),
        ({"x": "\ud800"}, "surrogate"),
        ({"x": "a\x00b"}, "NUL"),
        ({"x": "y" * MAX_BYTES}, "bytes"),
    ],
)
def test_bad_metadata_is_refused_at_using_with_a_clear_error_and_nothing_is_stored(bad, says):
    with pytest.raises(InvalidMetadata, match=says):
        tasks.echo.using(metadata=bad).enqueue(1)
    assert not Task.objects.exists()


def test_a_running_task_reads_its_metadata_and_its_progress_is_saved(start_worker):
    r = mt.progress.using(metadata={"job": "export"}).enqueue(4, 0.01)
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    done = result(r)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == {"job": "export"}
    assert done.metadata == {"job": "export", "progress": 1.0}


def test_progress_is_visible_while_the_task_runs(start_worker):
    r = mt.progress.enqueue(30, 0.2)  # six seconds of steps
    start_worker()
    seen: set[float] = set()

    def midway():
        value = result(r).metadata.get("progress")
        if value is not None:
            seen.add(value)
        return any(0 < v < 1 for v in seen) and len(seen) >= 2

    wait_until(midway, timeout=30, interval=0.1)
    wait_until(lambda: result(r).status == TaskResultStatus.SUCCESSFUL, timeout=30)
    assert result(r).metadata["progress"] == 1.0


def test_async_tasks_save_metadata_too(start_worker):
    r = mt.aprogress.using(metadata={"k": "v"}).enqueue(50)
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    done = result(r)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == {"k": "v"}
    assert done.metadata == {"k": "v", "progress": 1.0}


def test_metadata_changed_but_not_saved_is_saved_when_the_task_fails(start_worker):
    r = mt.stage_then_fail.enqueue()
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0, worker.output()
    done = result(r)
    assert done.status == TaskResultStatus.FAILED and done.metadata == {"stage": "uploading"}


def test_unstorable_metadata_fails_that_task_clearly_and_the_worker_goes_on(start_worker):
    bad = mt.save_nan.enqueue()
    good = tasks.echo.enqueue("after")
    worker = start_worker("--batch", "--concurrency", "1")
    assert worker.wait(timeout=60) == 0, worker.output()
    failed = result(bad)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[-1].exception_class_path == "ox.metadata.InvalidMetadata"
    assert "is nan" in failed.errors[-1].traceback
    assert failed.metadata == {}  # the bad value never reached the row
    assert result(good).status == TaskResultStatus.SUCCESSFUL


def test_the_stage_saved_while_running_then_the_last_one_at_the_end(start_worker):
    r = mt.stage_until_released.enqueue("go")
    start_worker()
    wait_until(lambda: result(r).metadata.get("stage") == "waiting", timeout=30)
    assert result(r).status == TaskResultStatus.RUNNING
    Ledger.objects.create(key="go", pid=0)
    wait_until(lambda: result(r).status == TaskResultStatus.SUCCESSFUL, timeout=30)
    assert result(r).metadata == {"stage": "done"}


def test_refresh_brings_the_metadata_along(start_worker):
    r = mt.stage_until_released.enqueue("released")
    start_worker()
    wait_until(lambda: result(r).metadata.get("stage") == "waiting", timeout=30)
    assert r.metadata == {}
    r.refresh()
    assert r.metadata == {"stage": "waiting"}


def _claim_one(queue: str = "default"):
    now = clock.db_now(connection)
    (claimed,) = sql.claim(connection, "w-test", [queue], (1, 0), now, now + timedelta(seconds=60))
    result_ = task_backends["default"].get_result(str(claimed.id))
    return claimed, result_


def test_frequent_saves_cost_one_write_per_interval_and_the_heartbeat_writes_the_last():
    tasks.echo.enqueue(1)
    claimed, running = _claim_one()
    context = context_for(running, claimed.id, claimed.fence, connection.alias)
    with CaptureQueriesContext(connection) as queries:
        for i in range(1000):
            context.metadata["progress"] = i / 999
            assert context.save_metadata() is True
    writes = [q for q in queries.captured_queries if q["sql"].startswith("UPDATE ox_task SET metadata")]
    assert 1 <= len(writes) <= 3, len(writes)  # the first at once; the rest wait for the interval
    assert Task.objects.get(id=claimed.id).metadata != {"progress": 1.0}
    assert flush_waiting(connection) == 1  # the worker's heartbeat
    assert Task.objects.get(id=claimed.id).metadata == {"progress": 1.0}
    assert flush_waiting(connection) == 0


def test_an_attempt_whose_lease_was_taken_writes_no_metadata():
    tasks.echo.using(metadata={"owner": "first"}).enqueue(1)
    claimed, running = _claim_one()
    context = context_for(running, claimed.id, claimed.fence, connection.alias)
    Task.objects.filter(id=claimed.id).update(fence=claimed.fence + 1)  # a rescue and a new claim
    context.metadata["owner"] = "stale attempt"
    assert context.save_metadata() is False
    assert Task.objects.get(id=claimed.id).metadata == {"owner": "first"}


def test_a_finished_task_takes_no_late_metadata():
    tasks.echo.enqueue(1)
    claimed, running = _claim_one()
    context = context_for(running, claimed.id, claimed.fence, connection.alias)
    Task.objects.filter(id=claimed.id).update(status="SUCCESSFUL")
    context.metadata["late"] = True
    assert context.save_metadata() is False
    assert Task.objects.get(id=claimed.id).metadata is None


# ---------------------------------------------------------------- the dashboard


@pytest.fixture
def staff_client(client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user("meta-staff", password="pw", is_staff=True, is_superuser=True))
    return client


def test_the_task_page_shows_the_metadata_and_a_progress_bar(staff_client):
    from django.urls import reverse

    from tests.test_dashboard_support import make_task

    task = make_task("RUNNING", metadata={"progress": 0.42, "stage": "uploading <b>", "rows": 12})
    body = staff_client.get(reverse("dashboard:task", args=[task.pk])).content.decode()
    assert '<progress value="0.4200" max="1">' in body and "42 %" in body
    assert "uploading &lt;b&gt;" in body and "<b>" not in body.split("uploading", 1)[1][:10]
    assert "&quot;rows&quot;: 12" in body


@pytest.mark.parametrize("odd", [{"progress": 1.5}, {"progress": -0.1}, {"progress": "half"}, {"progress": True}, {}])
def test_progress_outside_zero_to_one_draws_no_bar(staff_client, odd):
    from django.urls import reverse

    from tests.test_dashboard_support import make_task

    task = make_task("RUNNING", metadata=odd or None)
    body = staff_client.get(reverse("dashboard:task", args=[task.pk])).content.decode()
    assert "<progress" not in body and body.count('id="task-metadata"') == 1


def test_the_running_page_shows_each_tasks_progress(staff_client):
    from django.urls import reverse

    from tests.test_dashboard_support import make_task

    make_task("RUNNING", metadata={"progress": 0.25})
    make_task("RUNNING", worker_id="w-2")
    body = staff_client.get(reverse("dashboard:running")).content.decode()
    assert body.count("<progress") == 1 and '<progress value="0.2500"' in body and "25 %" in body


def test_the_overview_lists_running_tasks_that_report_progress(staff_client):
    from django.urls import reverse

    from tests.test_dashboard_support import make_task

    make_task("RUNNING", metadata={"progress": 0.5, "stage": "copying"})
    make_task("RUNNING")  # reports nothing: not listed
    make_task("SUCCESSFUL", metadata={"progress": 1.0})  # finished: not listed
    body = staff_client.get(reverse("dashboard:overview"), headers={"HX-Request": "true"}).content.decode()
    section = body.split('id="overview-progress"', 1)[1].split("</section>", 1)[0]
    assert section.count("<progress") == 1 and "50 %" in section and "copying" in section
