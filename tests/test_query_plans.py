"""What a scraper or an open tab costs on a big table (PostgreSQL): every query that the
dashboard, the admin and /ox/metrics run against ox_task, EXPLAIN ANALYZEd (buffers touched) on
a table filled as scripts/dashboard_scale.py does, vacuumed and analyzed as autovacuum would
leave it.

- No Seq Scan on ox_task, except under a LIMIT (a capped count stops at 10,001 rows).
- A filter that matches nothing costs a few index pages (the issue's 85-850 ms cases).
- The cost of every page does not grow with the finished history: the same requests after the
  history doubled (older rows added) touch about as many buffers as before. A query that reads
  the table, or a whole index, through touches twice as many. The one kind allowed to change is
  a count that stopped at its cap (10,001 rows): what it costs depends on how many rows match
  per page, and the planner may pick another way to find the first 10,001 as the table grows.
- Nor with the backlog: the dashboard's counts and lists, /ox/metrics, the health check and the
  admin touch about as many buffers after the READY backlog doubled (20,000 -> 40,000 rows),
  the backlog counts stopping at their cap (lowered to BACKLOG_CAP here, so that a few thousand
  rows per queue already reach it).
"""

import importlib.util
import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Count, Min
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ox.health import Thresholds, check_health, queue_counts
from ox.models import Status, Task
from ox.paging import COUNT_CAP
from tests.conftest import ROOT

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="query plans are PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

HISTORY_ROWS = 100_000  # finished tasks over the last three days; as many again, older, later
# A backlog a full read of which shows: 20,000 READY rows are ~100 pages of the claim index
# and ~700 of heap; doubled, twice that.
READY_ROWS = 20_000
BACKLOG_CAP = 1_000  # ox.health.COUNT_CAP for the backlog test: each queue's due count reaches it
# A filter matching nothing probes index roots and a leaf or two (a task path: the finished and
# the READY path indexes; a queue: the finished, claim and lease indexes).
EMPTY_BUDGET = 150
GROWTH = 1.25  # after the history doubled, at most this many times the buffers (+ SLACK)
SLACK = 30


def _scale_module():
    spec = importlib.util.spec_from_file_location("dashboard_scale", ROOT / "scripts" / "dashboard_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fill_history(scale, days_back: int) -> None:
    """HISTORY_ROWS finished tasks enqueued over the three days ending `days_back` days ago, as
    dashboard_scale.py's fill (same paths, queues and status mix, UUIDv7 ids from the time)."""
    params = {"n": HISTORY_ROWS, "start": 1, "stop": HISTORY_ROWS, "days": 3, "back": days_back}
    with connection.cursor() as cursor:
        cursor.execute(scale.FILL_FINISHED, {**params, "tag": f"f{days_back}"})
        cursor.execute("VACUUM (ANALYZE) ox_task")


def fill_backlog(scale, hours_back: int) -> None:
    """READY_ROWS READY tasks enqueued over the hour ending `hours_back` hours ago."""
    with connection.cursor() as cursor:
        cursor.execute(scale.FILL_READY, {"n": READY_ROWS, "back": hours_back, "tag": f"r{hours_back}"})
        cursor.execute("VACUUM (ANALYZE) ox_task")


@pytest.fixture
def scale():
    scale = _scale_module()
    fill_history(scale, 0)
    fill_backlog(scale, 0)
    with connection.cursor() as cursor:
        cursor.execute(scale.FILL_RUNNING, {})
        cursor.execute(scale.FILL_ATTEMPTS)
        cursor.execute(scale.FILL_WORKERS, {})
        cursor.execute("VACUUM (ANALYZE) ox_task")
        cursor.execute("VACUUM (ANALYZE) ox_attempt")
    return scale


def nodes(plan, ancestors=()):
    """Every plan node with the node types above it."""
    yield plan, ancestors
    for child in plan.get("Plans", []):
        yield from nodes(child, (*ancestors, plan["Node Type"]))


def explain(sql: str) -> dict:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql)
        raw = cursor.fetchone()[0]
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]


def task_queries(client, path: str, params: dict, htmx: bool) -> list[str]:
    """The ox_task reads behind one request; path "check_health" is ox.health.check_health()."""
    with CaptureQueriesContext(connection) as captured:
        if path == "check_health":
            check_health(Thresholds())
        else:
            response = client.get(path, params, headers={"HX-Request": "true"} if htmx else {})
            assert response.status_code == 200, (path, params, response.status_code)
    sqls = [q["sql"] for q in captured.captured_queries]
    # ox_task as Django quotes it, or in ox.health's raw backlog query (WITH RECURSIVE ...); the
    # task list's UNION ALL of ox_task and the archive starts with its first part's "(SELECT".
    return [
        q
        for q in sqls
        if ('"ox_task"' in q or "FROM ox_task" in q) and q.lstrip().startswith(("SELECT", "WITH", "(SELECT"))
    ]


def measure(client, path: str, params: dict, htmx: bool) -> tuple[list[tuple[int, bool]], list[str]]:
    """For each ox_task query behind one request, (buffers touched, whether it is a count that
    stopped at the cap), and the whole-table reads found."""
    found, problems = [], []
    for sql in task_queries(client, path, params, htmx):
        plan = explain(sql)["Plan"]
        for node, above in nodes(plan):
            if node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "ox_task" and "Limit" not in above:
                problems.append(f"Seq Scan on ox_task: {sql}")
        child = (plan.get("Plans") or [{}])[0]
        capped = plan["Node Type"] == "Aggregate" and child.get("Node Type") == "Limit"
        capped = capped and child.get("Actual Rows") == COUNT_CAP + 1
        found.append((plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0), capped))
    return found, problems


def superuser_client(client):
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def test_filters_that_match_nothing_cost_a_few_index_pages(client, scale):
    superuser_client(client)
    empty = [
        ("/tasks/", {"queue": "nope"}, True),  # issue #16: 85 ms of parallel seq scans per poll
        ("/tasks/", {"task": "app.nothing_like_this"}, True),  # issue #16: 103 ms
        ("/tasks/", {"queue": "nope", "status": "FAILED"}, True),
        ("/tasks/retry-matching/", {"queue": "nope"}, False),
        ("/tasks/retry-matching/", {"task": "app.nothing_like_this"}, False),
        ("/admin/ox/task/", {"q": "zzz"}, False),  # issue #16: 850 ms (ILIKE over every row)
        ("/admin/ox/task/", {"queue": "nope"}, False),
    ]
    problems = []
    for path, params, htmx in empty:
        queries, found = measure(client, path, params, htmx)
        problems += found
        problems += [f"{path} {params}: {n} buffers (budget {EMPTY_BUDGET})" for n, _ in queries if n > EMPTY_BUDGET]
    assert not problems, "\n".join(problems)


def test_no_page_costs_more_as_the_history_grows(client, scale):
    superuser_client(client)
    day_ago = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    two_days_ago = (timezone.now() - timedelta(days=2)).strftime("%Y-%m-%dT%H:%M")
    pages = [
        ("/", {}, True),
        ("/tasks/", {}, True),
        ("/tasks/", {"queue": "reports"}, True),
        ("/tasks/", {"task": "app.send_invoice"}, True),
        ("/tasks/", {"status": "FAILED"}, True),
        ("/tasks/", {"status": "CANCELLED", "queue": "emails"}, True),
        ("/tasks/", {"status": "READY", "queue": "emails"}, True),
        ("/tasks/", {"enqueued_after": two_days_ago, "enqueued_before": day_ago}, True),
        ("/tasks/retry-matching/", {"queue": "emails", "status": "FAILED"}, False),
        ("/running/", {}, True),
        ("/workers/", {}, True),
        ("/ox/metrics", {}, False),  # issue #16: 210 ms, whole-table reads per scrape
        ("/admin/ox/task/", {}, False),  # issue #16: 590 ms (COUNT(*), DISTINCT queue, dates)
        ("/admin/ox/task/", {"q": "app.send_invoice"}, False),
        ("/admin/ox/task/", {"queue": "reports"}, False),
        ("/admin/ox/task/", {"status__exact": "FAILED"}, False),
        ("/admin/ox/task/", {"enqueued": "24h"}, False),
        ("/admin/ox/task/", {"o": "3"}, False),  # a sort by queue would sort the whole table
    ]
    before = {}
    problems = []
    for path, params, htmx in pages:
        before[(path, str(params))], found = measure(client, path, params, htmx)
        problems += found
    fill_history(scale, 3)  # the history doubles: as many tasks again, finished 3 to 6 days ago
    for path, params, htmx in pages:
        after, found = measure(client, path, params, htmx)
        problems += found
        then = before[(path, str(params))]
        assert len(then) == len(after), (path, params)
        # Counts that stopped at the cap both times are bounded by the cap, not the history.
        kept = [(b, a) for (b, b_capped), (a, a_capped) in zip(then, after, strict=True) if not (b_capped and a_capped)]
        was, now = sum(b for b, _ in kept), sum(a for _, a in kept)
        if now > was * GROWTH + SLACK:
            problems.append(f"{path} {params}: {was} -> {now} buffers as the history doubled")
    assert not problems, "\n".join(problems)


BACKLOG_PAGES = [
    ("/", {}, True),  # per-queue ready / scheduled counts and the oldest ready task
    ("/", {}, False),
    ("/ox/metrics", {}, False),  # the same counts, per scrape
    ("check_health", {}, False),  # manage.py ox_health
    ("/health/", {}, False),
    ("/running/", {}, True),
    ("/workers/", {}, True),
    ("/tasks/", {}, True),
    ("/tasks/", {"status": "READY"}, True),
    ("/tasks/", {"status": "READY", "queue": "emails"}, True),
    ("/tasks/", {"status": "READY", "queue": "bulk", "page": "3"}, True),  # a deep page: ids first
    ("/tasks/", {"status": "FAILED"}, True),  # newest failures, behind the backlog's newer ids
    ("/tasks/", {"status": "CANCELLED"}, True),
    ("/tasks/", {"task": "app.nothing_like_this"}, True),
    ("/tasks/", {"task": "app.send_invoice", "status": "READY"}, True),
    ("/tasks/", {"queue": "nope"}, True),
    ("/tasks/retry-matching/", {"queue": "emails", "status": "FAILED"}, False),
    ("/admin/ox/task/", {}, False),
    ("/admin/ox/task/", {"q": "zzz"}, False),
    ("/admin/ox/task/", {"status__exact": "READY"}, False),
    ("/admin/ox/task/", {"status__exact": "READY", "queue": "bulk"}, False),
    ("/admin/ox/task/", {"enqueued": "1h"}, False),
]


def test_no_page_costs_more_as_the_backlog_grows(client, scale, monkeypatch):
    monkeypatch.setattr("ox.health.COUNT_CAP", BACKLOG_CAP)
    superuser_client(client)
    before, problems = {}, []
    for path, params, htmx in BACKLOG_PAGES:
        before[(path, str(params))], found = measure(client, path, params, htmx)
        problems += found
    fill_backlog(scale, 1)  # the backlog doubles: as many READY tasks again, enqueued an hour earlier
    for path, params, htmx in BACKLOG_PAGES:
        after, found = measure(client, path, params, htmx)
        problems += found
        then = before[(path, str(params))]
        assert len(then) == len(after), (path, params)
        kept = [(b, a) for (b, b_capped), (a, a_capped) in zip(then, after, strict=True) if not (b_capped and a_capped)]
        was, now = sum(b for b, _ in kept), sum(a for _, a in kept)
        if now > was * GROWTH + SLACK:
            problems.append(f"{path} {params}: {was} -> {now} buffers as the backlog doubled")
    assert not problems, "\n".join(problems)


def test_backlog_counts_stop_at_the_cap_and_the_oldest_is_exact(scale):
    """What the overview, /ox/metrics and the health check show over 20,000 READY rows: counts
    that stop at the cap per queue, and the oldest due task exactly (the fill's first row)."""
    now = timezone.now()
    counts = {q.queue: q for q in queue_counts(now, cap=BACKLOG_CAP)}
    assert set(counts) >= {"default", "emails", "reports", "bulk"}
    for queue in ("default", "emails", "reports", "bulk"):
        assert (counts[queue].ready, counts[queue].ready_capped) == (BACKLOG_CAP, True), queue
    exact = {q.queue: q for q in queue_counts(now, cap=READY_ROWS)}
    due = dict(
        Task.objects.filter(status=Status.READY, run_after__lte=now)
        .values("queue")
        .annotate(n=Count("pk"))
        .values_list("queue", "n")
    )
    later = dict(
        Task.objects.filter(status=Status.READY, run_after__gt=now)
        .values("queue")
        .annotate(n=Count("pk"))
        .values_list("queue", "n")
    )
    assert {q: c.ready for q, c in exact.items() if c.ready} == due
    assert {q: c.scheduled for q, c in exact.items() if c.scheduled} == later
    assert not any(c.ready_capped or c.scheduled_capped for c in exact.values())
    for queue, c in exact.items():
        oldest = Task.objects.filter(status=Status.READY, queue=queue, run_after__lte=now).aggregate(m=Min("run_after"))
        assert counts[queue].oldest_ready_age == c.oldest_ready_age
        assert c.oldest_ready_age == pytest.approx((now - oldest["m"]).total_seconds()), queue
