"""What the archive's statements cost as the archive grows (PostgreSQL, EXPLAIN ANALYZE with
BUFFERS): the archiver's batch statement, and every query the dashboard's task list (and task
page, overview, /ox/metrics, the admin's archive list) runs over ox_task and ox_task_archive,
on tables filled as scripts/dashboard_scale.py does, then again after the archive grew tenfold
(older rows added).

- No Seq Scan on either table, except under a LIMIT (a capped count stops at 10,001 rows).
- The batch statement reads ox_task's (status, finished_at) index and the archive only takes
  inserts: its buffers stay about flat (the archive's b-trees may gain a level, which adds a
  page per index per row inserted).
- Every page's row queries (the page, a task, the overview's and /ox/metrics' windows) touch
  about as many buffers after the growth as before.
- The paginators' counts stop at the cap (10,001 rows, from indexes): below the cap a count
  counts what matches, and the growth adds matches, so a count is held to what counting to the
  cap costs (COUNT_BUDGET), however big the archive.
"""

import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ox import clock
from ox.archive import batch_sql
from ox.models import ArchivedTask
from tests.test_query_plans import _scale_module, nodes

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="query plans are PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

ARCHIVE_ROWS = 20_000  # finished over the three days ending a day ago; then ten times as many
HOT_FINISHED = 3_000  # finished in the last minutes, in ox_task: what the archiver moves next
READY_ROWS = 5_000
BATCH = 500
GROWTH = 1.25  # after the archive grew tenfold, at most this many times the buffers (+ SLACK)
SLACK = 30
BATCH_GROWTH = 1.5  # the batch inserts BATCH rows into six b-trees, each of which may gain a level
# Buffers of a count that stops at the cap (cap + 1 = 10,001 entries of an index, and the heap
# pages of those not yet all-visible): 430-450 measured here, before and after the growth.
COUNT_BUDGET = 600


def fill_archive(scale, rows: int, back_days: float, days: float, tag: str) -> None:
    fill = scale.FILL_FINISHED.replace("INSERT INTO ox_task (", "INSERT INTO ox_task_archive (", 1)
    with connection.cursor() as cursor:
        cursor.execute(fill, {"n": rows, "start": 1, "stop": rows, "days": days, "back": back_days, "tag": tag})
        cursor.execute("VACUUM (ANALYZE) ox_task_archive")


@pytest.fixture
def scale():
    scale = _scale_module()
    with connection.cursor() as cursor:
        # ox_task: a backlog, some running, and the last few minutes' finished tasks.
        cursor.execute(scale.FILL_READY, {"n": READY_ROWS, "back": 0, "tag": "r0"})
        cursor.execute(scale.FILL_RUNNING, {})
        params = {"n": HOT_FINISHED, "start": 1, "stop": HOT_FINISHED, "days": 0.003, "back": 0, "tag": "h0"}
        cursor.execute(scale.FILL_FINISHED, params)
        cursor.execute(scale.FILL_ATTEMPTS)
        cursor.execute(scale.FILL_WORKERS, {})
        cursor.execute("VACUUM (ANALYZE) ox_task")
    fill_archive(scale, ARCHIVE_ROWS, 1, 3, "a0")
    with connection.cursor() as cursor:
        cursor.execute(scale.FILL_ATTEMPTS.replace("FROM ox_task WHERE", "FROM ox_task_archive WHERE"))
        cursor.execute("VACUUM (ANALYZE) ox_attempt")
    return scale


def explain(sql: str, params: object = None) -> dict:
    """EXPLAIN ANALYZE in a transaction that is rolled back (the batch statement moves rows)."""
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params)
            raw = cursor.fetchone()[0]
        finally:
            cursor.execute("ROLLBACK")
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


def buffers(plan: dict) -> int:
    return plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)


def seq_scans(plan: dict, label: str) -> list[str]:
    return [
        f"{label}: Seq Scan on {node['Relation Name']}"
        for node, above in nodes(plan)
        if node["Node Type"] == "Seq Scan"
        and node.get("Relation Name") in ("ox_task", "ox_task_archive")
        and "Limit" not in above
    ]


def index_reads(plan: dict) -> set[str]:
    return {node["Index Name"] for node, _ in nodes(plan) if "Index Name" in node}


def batch_plan() -> dict:
    cutoff = clock.db_now(connection)  # everything finished in ox_task is due
    return explain(batch_sql(connection)[0], ["SUCCESSFUL", cutoff, cutoff, BATCH])


def page_queries(client, path: str, params: dict) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, params, headers={"HX-Request": "true"} if path.startswith("/tasks") else {})
        assert response.status_code == 200, (path, params, response.status_code)
    return [
        q["sql"]
        for q in captured.captured_queries
        if ('"ox_task' in q["sql"] or "FROM ox_task" in q["sql"])
        and q["sql"].lstrip().startswith(("SELECT", "(", "WITH"))
    ]


def is_count(sql: str) -> bool:
    return sql.lstrip().startswith("SELECT COUNT(*)")


def measure(client, path: str, params: dict) -> tuple[list[tuple[int, str]], list[str], set[str]]:
    """(buffers, sql) of each row query behind one request; problems (whole-table reads, counts
    that do not stop at the cap or cost more than counting to it); the indexes read."""
    found, problems, indexes = [], [], set()
    for sql in page_queries(client, path, params):
        plan = explain(sql)
        problems += seq_scans(plan, f"{path} {params}: {sql[:120]}")
        indexes |= index_reads(plan)
        if not is_count(sql):
            found.append((buffers(plan), sql))
        elif path.startswith(("/tasks/", "/admin/")) and "retry-matching" not in path:
            limits = [n for n, _ in nodes(plan) if n["Node Type"] == "Limit"]
            if not limits or buffers(plan) > COUNT_BUDGET:
                problems.append(f"{path} {params}: count of {buffers(plan)} buffers, limits {len(limits)}: {sql}")
    return found, problems, indexes


def test_the_batch_statement_and_the_task_list_stay_flat_as_the_archive_grows_tenfold(client, scale):
    client.force_login(User.objects.create_superuser("root", password="pw"))
    archived = ArchivedTask.objects.order_by("-id").values_list("id", flat=True).first()
    day, two_days = (timezone.now() - timedelta(days=d) for d in (1.5, 2))
    pages = [
        ("/tasks/", {}),
        ("/tasks/", {"page": "3"}),
        ("/tasks/", {"status": "FAILED"}),
        ("/tasks/", {"status": "FAILED", "page": "2"}),
        ("/tasks/", {"status": "SUCCESSFUL"}),
        ("/tasks/", {"status": "CANCELLED", "queue": "emails"}),
        ("/tasks/", {"queue": "reports"}),
        ("/tasks/", {"task": "app.send_invoice"}),
        ("/tasks/", {"queue": "nope"}),
        (
            "/tasks/",
            {"enqueued_after": two_days.strftime("%Y-%m-%dT%H:%M"), "enqueued_before": day.strftime("%Y-%m-%dT%H:%M")},
        ),
        (f"/tasks/{archived}/", {}),
        ("/", {}),
        ("/ox/metrics", {}),
        ("/admin/ox/archivedtask/", {}),
        ("/admin/ox/archivedtask/", {"status__exact": "FAILED"}),
        ("/admin/ox/archivedtask/", {"queue": "reports"}),
        ("/admin/ox/archivedtask/", {"q": "app.send_invoice"}),
    ]
    problems: list[str] = []
    before_batch = batch_plan()
    problems += seq_scans(before_batch, "batch")
    before = {}
    for path, params in pages:
        before[(path, str(params))], found, _ = measure(client, path, params)
        problems += found
    fill_archive(scale, ARCHIVE_ROWS * 9, 4, 27, "a1")  # ten times the rows, all older
    assert ArchivedTask.objects.count() == ARCHIVE_ROWS * 10
    after_batch = batch_plan()
    problems += seq_scans(after_batch, "batch")
    assert "ox_task_status_finished" in index_reads(after_batch)
    was, now = buffers(before_batch), buffers(after_batch)
    print(f"batch of {BATCH}: {was} -> {now} buffers")
    if now > was * BATCH_GROWTH + SLACK:
        problems.append(f"batch statement: {was} -> {now} buffers as the archive grew tenfold")
    archive_indexes: set[str] = set()
    for path, params in pages:
        after, found, indexes = measure(client, path, params)
        problems += found
        archive_indexes |= {i for i in indexes if i.startswith("ox_archive") or i == "ox_task_archive_pkey"}
        then = before[(path, str(params))]
        assert len(then) == len(after), (path, params)
        was, now = sum(b for b, _ in then), sum(a for a, _ in after)
        print(f"{path} {params}: {was} -> {now} buffers")
        if now > was * GROWTH + SLACK:
            detail = [(b, a, sql[:160]) for (b, sql), (a, _) in zip(then, after, strict=True)]
            problems.append(f"{path} {params}: {was} -> {now} buffers as the archive grew tenfold: {detail}")
    # The archive's lists are read through its indexes, each of them used by some page.
    assert {"ox_archive_queue", "ox_archive_path", "ox_archive_status", "ox_archive_status_finished"} <= (
        archive_indexes
    ), archive_indexes
    assert not problems, "\n".join(problems)


def test_retry_matching_counts_archived_failures_from_an_index(client, scale):
    """ "Retry all N matching" counts exactly (the operator confirms that number): over the
    archive, an index-only count of the partial (status, queue, id) index of failures."""
    client.force_login(User.objects.create_superuser("root", password="pw"))
    _, problems, indexes = measure(client, "/tasks/retry-matching/", {"queue": "emails", "status": "FAILED"})
    assert not problems, problems
    assert "ox_archive_failed_queue" in indexes, indexes
