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
"""

import importlib.util
import json
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ox.paging import COUNT_CAP
from tests.conftest import ROOT

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="query plans are PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
]

HISTORY_ROWS = 100_000  # finished tasks over the last three days; as many again, older, later
READY_ROWS = 2_000
# A filter matching nothing probes index roots and a leaf or two, plus, for a task path, the
# heap pages of the READY backlog (the claim index does not hold the path): about 70 pages of
# 2,000 READY rows.
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
    sql = scale.FILL_FINISHED.replace(
        "now() - interval '3 days' * (i::float8 / %(n)s)",
        f"now() - interval '{days_back} days' - interval '3 days' * (i::float8 / %(n)s)",
    ).replace("'f' || i::text", f"'f{days_back}' || i::text")
    assert sql != scale.FILL_FINISHED
    with connection.cursor() as cursor:
        cursor.execute(sql, {"n": HISTORY_ROWS})
        cursor.execute("VACUUM (ANALYZE) ox_task")


@pytest.fixture
def scale():
    scale = _scale_module()
    fill_history(scale, 0)
    with connection.cursor() as cursor:
        cursor.execute(scale.FILL_READY, {"n": READY_ROWS})
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
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path, params, headers={"HX-Request": "true"} if htmx else {})
    assert response.status_code == 200, (path, params, response.status_code)
    return [q["sql"] for q in captured.captured_queries if '"ox_task"' in q["sql"] and q["sql"].startswith("SELECT")]


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
