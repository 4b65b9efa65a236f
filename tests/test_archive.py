"""The archive (ox.archive): finished tasks move out of ox_task, and every reader and writer of
tasks (get_result, the dashboard, the admin, retry, prune, stats, metrics) works across both
tables. The PostgreSQL plans of the archive's statements are in tests/test_archive_plans.py."""

import json
import re
import signal
import threading
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection, transaction
from django.forms.models import model_to_dict
from django.tasks import TaskResultStatus, task_backends
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from ox import clock, operations, stats
from ox.archive import ARCHIVER_KEY, Archiver, archive, archive_batch
from ox.conf import OxOptions
from ox.metrics import render_metrics
from ox.models import ArchivedTask, Attempt, Outcome, Status, Task
from ox.prune import prune
from ox.sql import LOCK_NAMESPACE
from tests.helpers import wait_until
from tests.test_dashboard_support import operator_fixture, staff_fixture  # noqa: F401

pytestmark = pytest.mark.django_db

pg = connection.vendor == "postgresql"
AFTER = timedelta(minutes=5)
_serial = iter(range(1, 10**9))


def new_id(moment) -> uuid.UUID:
    """A UUIDv7-like id of `moment`, strictly increasing across calls: tests can tell the order."""
    ms = int(moment.timestamp() * 1000)
    return uuid.UUID(int=(ms << 80) | (0x7 << 76) | (0b10 << 62) | next(_serial))


def make(status, age=timedelta(minutes=10), n=1, attempts=0, queue="default", path="tests.tasks.noop", **fields):
    """`n` tasks of `status`, enqueued and (when finished) finished `age` ago, one after the
    other; `attempts` failed Attempt rows each."""
    now = clock.db_now(connection)
    rows = []
    for i in range(n):
        at = now - age + timedelta(milliseconds=i)
        finished = status in (Status.SUCCESSFUL, Status.FAILED, Status.CANCELLED)
        values = {
            "id": new_id(at),
            "task_path": path,
            "queue": queue,
            "status": status,
            "run_after": at,
            "enqueued_at": at,
            "started_at": at,
            "last_attempted_at": at,
            "finished_at": at if finished else None,
            "attempts": max(attempts, 1),
            "max_attempts": max(attempts, 1),
            "worker_id": "w-1",
            "return_value": {"n": i} if status == Status.SUCCESSFUL else None,
            **fields,
        }
        rows.append(Task.objects.create(**values))
        for number in range(1, attempts + 1):
            Attempt.objects.create(
                task=rows[-1],
                number=number,
                worker_id="w-1",
                started_at=at,
                finished_at=at,
                outcome=Outcome.FAILED,
                exception_class_path="builtins.ValueError",
                traceback=f"Traceback: boom {number}",
            )
    return rows


def archive_all():
    return archive(connection, timedelta(0), clock.db_now(connection) + timedelta(seconds=1))


def statuses(model):
    return {s: model.objects.filter(status=s).count() for s in Status}


# ---------------------------------------------------------------- the move


def test_moves_only_finished_rows_past_the_cutoff_per_status_in_batches():
    old_ok = make(Status.SUCCESSFUL, n=5)
    old_failed = make(Status.FAILED, n=3, attempts=2)
    make(Status.CANCELLED, n=2)
    recent = make(Status.SUCCESSFUL, age=timedelta(minutes=1), n=2)
    # Live tasks never move, whatever their times say (a finished_at is left on them on purpose).
    live = make(Status.READY, finished_at=clock.db_now(connection) - timedelta(days=1))
    live += make(Status.RUNNING, finished_at=clock.db_now(connection) - timedelta(days=1))
    before = {row.pk: model_to_dict(Task.objects.get(pk=row.pk)) for row in old_ok + old_failed}
    with CaptureQueriesContext(connection) as ctx:
        result = archive(connection, AFTER, clock.db_now(connection), batch_size=2)
    assert result.moved == {"SUCCESSFUL": 5, "FAILED": 3, "CANCELLED": 2} and result.done
    assert result.batches == 3 + 2 + 1  # 2+2+1, 2+1, 2
    inserts = [q["sql"] for q in ctx.captured_queries if "INSERT INTO ox_task_archive" in q["sql"]]
    # One statement per batch, and a last one that finds nothing (MariaDB: its pick finds
    # nothing, and no INSERT is sent).
    assert len(inserts) == 3 + 2 + (1 if connection.vendor == "mysql" else 2)
    assert statuses(ArchivedTask) == {**dict.fromkeys(Status, 0), "SUCCESSFUL": 5, "FAILED": 3, "CANCELLED": 2}
    assert set(Task.objects.values_list("pk", flat=True)) == {r.pk for r in recent + live}
    for pk, values in before.items():  # column for column
        assert model_to_dict(ArchivedTask.objects.get(pk=pk)) == values
    # Attempts stay where they were, by task id.
    assert Attempt.objects.count() == 6
    assert set(Attempt.objects.values_list("task_id", flat=True)) == {r.pk for r in old_failed}


def test_a_batch_takes_the_oldest_first():
    oldest = make(Status.SUCCESSFUL, age=timedelta(hours=2), n=2)
    make(Status.SUCCESSFUL, age=timedelta(hours=1), n=2)
    assert archive_batch(connection, "SUCCESSFUL", clock.db_now(connection), 2, wait=True) == 2
    assert set(ArchivedTask.objects.values_list("pk", flat=True)) == {r.pk for r in oldest}


def test_sqlite_batch_statements_search_indexes():
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's plans are in tests/test_archive_plans.py; MariaDB moves rows by id")
    from ox.archive import batch_sql

    make(Status.SUCCESSFUL, n=3)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        for statement in batch_sql(connection):
            now = clock.db_now(connection)
            cursor.execute("EXPLAIN QUERY PLAN " + statement, ["SUCCESSFUL", now, now, 10])
            plan = [row[-1] for row in cursor.fetchall()]
            assert not [step for step in plan if step.startswith("SCAN ox_task")], plan
            assert any("ox_task_status_finished" in step for step in plan), plan


def test_archiver_duty_paces_itself_and_stops_at_its_budget():
    make(Status.SUCCESSFUL, n=5)
    archiver = Archiver(AFTER, batch_size=2)
    assert archiver.interval == 30.0 and archiver.poll == 5.0  # 5m / 10, at most 30 s
    for _ in range(10):  # a round may run out of its budget on a busy machine, then carries on
        archiver.run(connection, clock.db_now(connection))
        if not Task.objects.exists():
            break
    assert ArchivedTask.objects.count() == 5 and not Task.objects.exists()
    make(Status.SUCCESSFUL, n=1)
    rounds = archiver.rounds
    archiver.run(connection, clock.db_now(connection))  # caught up: not due again for 30 s
    assert archiver.rounds == rounds and Task.objects.count() == 1
    result = archive(connection, AFTER, clock.db_now(connection), budget=-1)
    assert result.done is False and result.total == 0  # out of budget before the first batch
    assert Archiver(timedelta(0), 10).interval == 1.0


@pytest.mark.django_db(transaction=True)
def test_an_archiver_holding_the_lock_makes_the_other_skip():
    if not pg:
        pytest.skip("advisory locks are PostgreSQL's; SQLite's single writer serialises archivers")
    from ox.connection import open_worker_connection

    make(Status.SUCCESSFUL, n=2)
    other = open_worker_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_NAMESPACE, ARCHIVER_KEY])
            result = archive(connection, AFTER, clock.db_now(connection), wait=False)
            assert result.busy and not result.done and result.total == 0
            cursor.execute("ROLLBACK")
        assert archive(connection, AFTER, clock.db_now(connection), wait=False).total == 2
    finally:
        other.close()


def test_options():
    assert OxOptions.from_dict({}).archive_age() == timedelta(minutes=5)
    assert OxOptions.from_dict({"ARCHIVE_AFTER": None}).archive_age() is None
    assert OxOptions.from_dict({"ARCHIVE_AFTER": 90}).archive_age() == timedelta(seconds=90)
    for bad in ({"ARCHIVE_AFTER": "soon"}, {"ARCHIVE_AFTER": -1}, {"ARCHIVE_BATCH": 0}, {"ARCHIVE_BATCH": "5"}):
        with pytest.raises(ImproperlyConfigured, match="ARCHIVE_"):
            OxOptions.from_dict(bad)


def test_workers_take_the_duty_unless_archive_after_is_none():
    from types import SimpleNamespace

    from ox.duties import worker_duties

    def duties(**options):
        worker = SimpleNamespace(options=OxOptions.from_dict(options), conn=connection, alias="default", backend=None)
        return {duty.name: duty for duty in worker_duties(worker)}

    assert duties()["archive"].interval == 5.0
    assert duties(ARCHIVE_AFTER="20s")["archive"].interval == 2.0  # a tenth of it, at least 1 s
    assert "archive" not in duties(ARCHIVE_AFTER=None)


def test_archive_tasks_command():
    from django.core.management import CommandError

    make(Status.SUCCESSFUL, age=timedelta(hours=2), n=3)
    make(Status.FAILED, age=timedelta(minutes=30))
    out = StringIO()
    call_command("archive_tasks", "--older-than", "1h", "--batch-size", "2", stdout=out)
    assert "SUCCESSFUL: moved 3 tasks" in out.getvalue() and "FAILED: moved 0 tasks" in out.getvalue()
    assert "total: 3 tasks in 2 batches of at most 2" in out.getvalue()
    call_command("archive_tasks", stdout=StringIO())  # ARCHIVE_AFTER: 5m
    assert ArchivedTask.objects.count() == 4 and not Task.objects.exists()
    for args, fragment in ((("--older-than", "soon"), "not a duration"), (("--batch-size", "0"), "at least 1")):
        with pytest.raises(CommandError, match=fragment):
            call_command("archive_tasks", *args, stdout=StringIO())


# ---------------------------------------------------------------- reads


def test_get_result_reads_archived_tasks():
    [ok] = make(Status.SUCCESSFUL)
    [failed] = make(Status.FAILED, attempts=2, path="tests.tasks.always_fails")
    [cancelled] = make(Status.CANCELLED)
    archive_all()
    assert not Task.objects.exists() and ArchivedTask.objects.count() == 3
    backend = task_backends["default"]
    result = backend.get_result(str(ok.pk))
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == {"n": 0}
    assert result.worker_ids == ["w-1"] and result.finished_at == ok.finished_at
    result = backend.get_result(str(failed.pk))
    assert result.status == TaskResultStatus.FAILED
    assert [e.traceback for e in result.errors] == ["Traceback: boom 1", "Traceback: boom 2"]
    assert [e.exception_class_path for e in result.errors] == ["builtins.ValueError"] * 2
    result = backend.get_result(str(cancelled.pk))
    assert result.status == TaskResultStatus.FAILED and result.errors[-1].exception_class_path.endswith("TaskCancelled")
    from django.tasks.exceptions import TaskResultDoesNotExist

    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(str(uuid.uuid4()))


def test_stats_find_archived_tasks_and_count_them(client, staff):
    [failed] = make(Status.FAILED, attempts=1, queue="emails")
    make(Status.SUCCESSFUL, n=2, queue="emails")
    before = stats.overview()
    archive_all()
    task = stats.find_task(failed.pk)
    assert isinstance(task, ArchivedTask) and [a.number for a in stats.attempts_of(task)] == [1]
    after = stats.overview()
    emails = {q.queue: q for q in after.queues}["emails"]
    assert (emails.failed_24h, emails.failed_1h, emails.succeeded_1h) == (1, 1, 2)
    assert after.succeeded_per_minute == before.succeeded_per_minute
    assert after.failed_per_minute == before.failed_per_minute


def test_metrics_count_finished_tasks_in_the_archive():
    make(Status.SUCCESSFUL, age=timedelta(minutes=1), n=3, queue="emails")
    make(Status.FAILED, age=timedelta(minutes=1), queue="emails")
    line = re.compile(r'^ox_tasks_finished_recent\{queue="emails",status="(\w+)"\} (\d+)$', re.M)
    before = dict(line.findall(render_metrics()))
    archive(connection, timedelta(seconds=30), clock.db_now(connection))
    assert Task.objects.count() == 0
    assert dict(line.findall(render_metrics())) == before == {"SUCCESSFUL": "3", "FAILED": "1", "CANCELLED": "0"}


def test_dashboard_task_page_shows_an_archived_task(client, staff):
    [failed] = make(Status.FAILED, attempts=2, path="tests.tasks.always_fails")
    archive_all()
    page = client.get(reverse("dashboard:task", args=[failed.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert "tests.tasks.always_fails" in html and "Traceback: boom 2" in html
    assert [a.number for a in page.context["attempts"]] == [1, 2]


def listed(client, **params):
    response = client.get(reverse("dashboard:tasks"), params, headers={"HX-Request": "true"})
    assert response.status_code == 200
    return [t.pk for t in response.context["page"].object_list], response


def test_dashboard_list_merges_both_tables_newest_first(client, staff, monkeypatch):
    # Interleaved in time: old finished ones archived, the rest in ox_task.
    rows = []
    for i in range(30):
        rows += make(Status.FAILED if i % 3 == 0 else Status.SUCCESSFUL, age=timedelta(minutes=60 - i), queue="emails")
    rows += make(Status.READY, age=timedelta(minutes=1), n=3)
    archive(connection, timedelta(minutes=44, seconds=30), clock.db_now(connection))  # i <= 15: archived
    assert ArchivedTask.objects.count() == 16 and Task.objects.count() == 17
    newest_first = [r.pk for r in reversed(rows)]
    ids, response = listed(client)
    assert ids == newest_first and response.context["paginator"].count == 33
    ids, _ = listed(client, status="FAILED")
    assert ids == [r.pk for r in reversed(rows) if r.status == Status.FAILED]
    ids, _ = listed(client, queue="emails", status="SUCCESSFUL")
    assert ids == [r.pk for r in reversed(rows) if r.status == Status.SUCCESSFUL]
    ids, _ = listed(client, id=str(rows[0].pk))
    assert ids == [rows[0].pk]
    ids, response = listed(client, queue="nope")
    assert ids == [] and response.context["paginator"].count == 0
    # READY or RUNNING: ox_task alone (the archive has finished tasks only).
    with CaptureQueriesContext(connection) as ctx:
        ids, _ = listed(client, status="READY")
    assert ids == newest_first[:3]
    assert not [q for q in ctx.captured_queries if "ox_task_archive" in q["sql"]]
    # Pages across both tables, and the capped count.
    monkeypatch.setattr("dashboard.views.tasks.PAGE_SIZE", 10)
    pages = [listed(client, page=str(n))[0] for n in (1, 2, 3, 4)]
    assert sum(pages, []) == newest_first
    monkeypatch.setattr("dashboard.views.tasks.COUNT_CAP", 20)
    _, response = listed(client)
    assert response.context["paginator"].capped and b"more than 20" in response.content


def test_enqueue_range_filter_applies_the_exact_time_within_the_id_slack(client, staff):
    """The id range is widened by ID_CLOCK_SLACK; within that band the exact enqueued_at
    decides (an id minted on a host whose clock is off by up to the slack), in both tables."""
    bound = (clock.db_now(connection) - timedelta(hours=1)).replace(second=0, microsecond=0)
    second = timedelta(seconds=1)
    cases = {  # (id time, enqueued_at) relative to the bound
        "early id, enqueued after": (-30 * second, second),
        "late id, enqueued before": (30 * second, -second),
        "well after": (timedelta(minutes=5), timedelta(minutes=5)),
        "well before": (-timedelta(minutes=5), -timedelta(minutes=5)),
    }

    def rows() -> dict[str, uuid.UUID]:
        return {
            name: make(Status.SUCCESSFUL, id=new_id(bound + id_at), enqueued_at=bound + enqueued)[0].pk
            for name, (id_at, enqueued) in cases.items()
        }

    archived = rows()
    archive_all()
    hot = rows()
    assert ArchivedTask.objects.count() == Task.objects.count() == 4
    at = bound.strftime("%Y-%m-%dT%H:%M")
    after, _ = listed(client, enqueued_after=at)
    assert set(after) == {t[name] for t in (archived, hot) for name in ("early id, enqueued after", "well after")}
    before, _ = listed(client, enqueued_before=at)
    assert set(before) == {t[name] for t in (archived, hot) for name in ("late id, enqueued before", "well before")}


# ---------------------------------------------------------------- retry


def test_retry_moves_an_archived_task_back_as_ready():
    [failed] = make(Status.FAILED, attempts=3, path="tests.tasks.always_fails", max_attempts=3)
    [cancelled] = make(Status.CANCELLED)
    [ok] = make(Status.SUCCESSFUL)
    archive_all()
    changed = operations.retry([failed.pk, cancelled.pk, ok.pk])
    assert changed.retried == 2
    again = Task.objects.get(pk=failed.pk)
    # always_fails has max_attempts=4: a fresh budget of 4 on top of the 3 spent.
    assert (again.status, again.attempts, again.max_attempts, again.finished_at) == (Status.READY, 3, 7, None)
    assert Task.objects.get(pk=cancelled.pk).status == Status.READY
    assert list(ArchivedTask.objects.values_list("pk", flat=True)) == [ok.pk]  # successes stay
    assert Attempt.objects.filter(task_id=failed.pk).count() == 3  # history kept
    assert operations.retry([failed.pk]).retried == 0  # READY now: nothing to retry


def test_dashboard_retries_archived_tasks(client, operator):
    [one] = make(Status.FAILED, queue="emails")
    others = make(Status.FAILED, n=3, queue="emails")
    [bulk] = make(Status.CANCELLED, queue="reports")
    make(Status.FAILED, queue="reports")
    archive_all()
    response = client.post(reverse("dashboard:retry", args=[one.pk]), follow=True)
    assert response.status_code == 200 and Task.objects.get(pk=one.pk).status == Status.READY
    client.post(reverse("dashboard:bulk"), {"action": "retry", "ids": [str(bulk.pk)]})
    assert Task.objects.get(pk=bulk.pk).status == Status.READY
    confirm = client.get(reverse("dashboard:retry_matching"), {"queue": "emails"})
    assert confirm.context["count"] == 3
    client.post(reverse("dashboard:retry_matching"), {"queue": "emails", "expected": "3"})
    assert set(Task.objects.filter(status=Status.READY).values_list("pk", flat=True)) == {
        one.pk,
        bulk.pk,
        *(r.pk for r in others),
    }
    assert list(ArchivedTask.objects.values_list("queue", flat=True)) == ["reports"]


def test_admin_lists_archived_tasks_read_only_with_retry(client):
    [failed] = make(Status.FAILED, attempts=1, queue="emails")
    make(Status.SUCCESSFUL, n=2)
    archive_all()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    url = reverse("admin:ox_archivedtask_changelist")
    page = client.get(url)
    assert page.status_code == 200 and page.context["cl"].result_count == 3
    assert client.get(url, {"queue": "emails"}).context["cl"].result_count == 1
    assert client.get(url, {"status__exact": "FAILED"}).context["cl"].result_count == 1
    assert client.get(url, {"q": "tests.tasks.noop"}).context["cl"].result_count == 3
    detail = client.get(reverse("admin:ox_archivedtask_change", args=[failed.pk]))
    assert detail.status_code == 200 and b"Traceback: boom 1" in detail.content
    assert b'name="_save"' not in detail.content  # read-only
    assert client.get(reverse("admin:ox_archivedtask_add")).status_code == 403
    assert client.get(reverse("admin:ox_archivedtask_delete", args=[failed.pk])).status_code == 403
    client.post(url, {"action": "retry_tasks", "_selected_action": [str(failed.pk)]})
    assert Task.objects.get(pk=failed.pk).status == Status.READY


def test_archived_tasks_in_the_admin_follow_the_task_permissions(client):
    from tests.test_dashboard_support import staff_user

    [failed] = make(Status.FAILED)
    archive_all()
    url = reverse("admin:ox_archivedtask_changelist")
    client.force_login(staff_user("nobody"))
    assert client.get(url).status_code == 403
    client.force_login(staff_user("viewer", "view_task"))
    page = client.get(url)
    assert page.status_code == 200 and page.context["action_form"] is None  # no Retry without change_task
    client.post(url, {"action": "retry_tasks", "_selected_action": [str(failed.pk)]})
    assert ArchivedTask.objects.filter(pk=failed.pk).exists()  # not allowed: nothing moved
    client.force_login(staff_user("operator", "view_task", "change_task"))
    client.post(url, {"action": "retry_tasks", "_selected_action": [str(failed.pk)]})
    assert Task.objects.get(pk=failed.pk).status == Status.READY


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_archives_and_runs_a_retried_archived_task(start_worker):
    from tests import tasks

    done = tasks.echo.enqueue("kept")
    [failed] = make(Status.FAILED, attempts=1)  # tests.tasks.noop: succeeds when run again
    options = {"ARCHIVE_AFTER": 0, "ARCHIVE_BATCH": 2}
    worker = start_worker(env={"OX_TEST_OPTIONS": json.dumps(options)})
    try:
        wait_until(lambda: ArchivedTask.objects.filter(pk__in=[done.id, failed.pk]).count() == 2, timeout=30)
        assert tasks.echo.get_result(done.id).return_value == "kept"
        assert operations.retry([failed.pk]).retried == 1
        # The worker runs it (in ox_task), then archives it again, SUCCESSFUL this time.
        wait_until(lambda: ArchivedTask.objects.filter(pk=failed.pk, status=Status.SUCCESSFUL).exists(), timeout=30)
    finally:
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output()
    again = tasks.noop.get_result(str(failed.pk))
    assert again.status == TaskResultStatus.SUCCESSFUL and len(again.errors) == 1  # the old attempt stays
    assert re.search(r"archived \d+ finished tasks", worker.output()), worker.output()


def _in_thread(call):
    """Run `call` on a thread (its own database connection, PostgreSQL); returns (thread, out):
    out["pid"] is the thread's backend, out["value"] (or out["error"]) what `call` gave."""
    out: dict = {}

    def run():
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                out["pid"] = cursor.fetchone()[0]
            out["value"] = call()
        except BaseException as exc:  # noqa: BLE001  (reported by the test)
            out["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _waiting(thread, out) -> bool:
    """The thread's backend waits for a lock (or the thread is done: the caller then says so)."""
    if not thread.is_alive():
        return True
    if "pid" not in out:
        return False
    with connection.cursor() as cursor:  # pg_blocking_pids is live, even inside a transaction
        cursor.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", [out["pid"]])
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_retry_racing_the_archiver_retries_once():
    """PostgreSQL, READ COMMITTED: the archiver has moved the task and not committed yet while a
    retry runs; the retry's UPDATE of ox_task waits for it, finds the row gone, and the retry
    takes the task from the archive in its next statement. Once, READY, in ox_task."""
    if not pg:
        pytest.skip("SQLite has one writer: an archiver and a retry never overlap")
    [failed] = make(Status.FAILED, attempts=1)
    with transaction.atomic():
        assert archive_batch(connection, "FAILED", clock.db_now(connection), 10, wait=True) == 1
        thread, out = _in_thread(lambda: operations.retry([failed.pk]))
        wait_until(lambda: _waiting(thread, out), timeout=15)
        assert thread.is_alive(), out  # the retry waits for the archiver's transaction
    thread.join(30)
    assert "error" not in out, out
    assert out["value"].retried == 1
    row = Task.objects.get(pk=failed.pk)
    assert (row.status, row.max_attempts) == (Status.READY, 1 + 3)
    assert not ArchivedTask.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_archiver_skips_a_task_a_retry_holds():
    if not pg:
        pytest.skip("SQLite has one writer: an archiver and a retry never overlap")
    [failed] = make(Status.FAILED, attempts=1)
    with transaction.atomic():
        assert operations.retry([failed.pk]).retried == 1
        thread, out = _in_thread(lambda: archive_batch(connection, "FAILED", clock.db_now(connection), 10, True))
        thread.join(15)
        assert out.get("value") == 0 and "error" not in out, out  # skipped, not waited for
    assert Task.objects.get(pk=failed.pk).status == Status.READY and not ArchivedTask.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_two_retries_of_an_archived_task_move_it_back_once():
    if not pg:
        pytest.skip("SQLite has one writer: two retries never overlap")
    [failed] = make(Status.FAILED, attempts=1)
    archive_all()
    with transaction.atomic():
        assert operations.retry([failed.pk]).retried == 1
        thread, out = _in_thread(lambda: operations.retry([failed.pk]))
        wait_until(lambda: _waiting(thread, out), timeout=15)
        assert thread.is_alive(), out  # the second retry waits for the first one's move
    thread.join(30)
    assert out.get("value") == operations.Changed(retried=0), out
    row = Task.objects.get(pk=failed.pk)
    assert (row.status, row.max_attempts) == (Status.READY, 4) and not ArchivedTask.objects.exists()


# ---------------------------------------------------------------- prune


def test_prune_deletes_from_the_archive_with_attempts():
    make(Status.FAILED, age=timedelta(days=10), n=3, attempts=2)
    make(Status.SUCCESSFUL, age=timedelta(days=10), n=2)
    archive_all()
    make(Status.FAILED, age=timedelta(days=10), n=1, attempts=1)  # still in ox_task
    make(Status.FAILED, age=timedelta(days=1), n=1)  # too young for the rule
    archive_all()
    make(Status.FAILED, age=timedelta(days=10), n=1)  # in ox_task
    out = StringIO()
    call_command("prune_tasks", "--older-than", "7d", "--status", "FAILED", "--dry-run", stdout=out)
    assert "FAILED: would delete 5 tasks" in out.getvalue()  # 4 in the archive, 1 in ox_task
    result = prune(connection, {"FAILED": timedelta(days=7)}, clock.db_now(connection), batch_size=2)
    assert result.deleted == {"FAILED": 5} and result.batches == 3
    assert statuses(ArchivedTask)["FAILED"] == 1 and statuses(ArchivedTask)["SUCCESSFUL"] == 2
    assert not Task.objects.exists() and Attempt.objects.count() == 0


def test_migration_names_the_archive_indexes():
    names = {index.name for index in ArchivedTask._meta.indexes}
    with connection.cursor() as cursor:
        found = {
            name
            for name, info in connection.introspection.get_constraints(cursor, "ox_task_archive").items()
            if info["index"]
        }
        assert names <= found
        attempt_fks = [
            info
            for info in connection.introspection.get_constraints(cursor, "ox_attempt").values()
            if info["foreign_key"]
        ]
    assert not attempt_fks  # an archived task's attempts outlive its ox_task row
    with connection.cursor() as cursor:
        attempt_indexes = connection.introspection.get_constraints(cursor, "ox_attempt").values()
    assert any(info["index"] and info["columns"] == ["task_id"] for info in attempt_indexes)  # still looked up
    if pg:
        with connection.cursor() as cursor:
            cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'ox_task_archive'")
            assert "fillfactor=100" in cursor.fetchone()[0]
