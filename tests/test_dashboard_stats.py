"""ox.stats: the numbers, and on PostgreSQL that every dashboard query reads an index."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ox import stats
from ox.models import Status, Task
from tests.test_dashboard_support import make_task

pytestmark = pytest.mark.django_db


def test_overview_minutes_and_windows():
    now = timezone.now()
    make_task(Status.SUCCESSFUL, finished_at=now - timedelta(minutes=5))
    make_task(Status.SUCCESSFUL, finished_at=now - timedelta(hours=2))  # outside the hour
    make_task(Status.FAILED, finished_at=now - timedelta(hours=3))  # in the 24 h, not the hour
    data = stats.overview(now)
    assert len(data.minutes) == 60 and data.minutes[-1] <= now
    assert sum(data.succeeded_per_minute) == 1 and sum(data.failed_per_minute) == 0
    assert (data.total.succeeded_1h, data.total.failed_1h, data.total.failed_24h) == (1, 0, 1)
    assert data.total.throughput == pytest.approx(1 / 60)


def test_oldest_ready_ignores_scheduled():
    now = timezone.now()
    make_task(run_after=now - timedelta(minutes=3))
    make_task(run_after=now + timedelta(minutes=30))
    total = stats.overview(now).total
    assert (total.ready, total.scheduled) == (1, 1)
    assert (now - total.oldest_ready_at) == timedelta(minutes=3)


def test_leases_soonest_first():
    now = timezone.now()
    late = make_task(Status.RUNNING, lease_expires_at=now + timedelta(seconds=50))
    soon = make_task(Status.RUNNING, lease_expires_at=now + timedelta(seconds=5))
    rows, total = stats.leases()
    assert [r.pk for r in rows] == [soon.pk, late.pk] and total == 2
    rows, total = stats.leases(limit=1)
    assert len(rows) == 1 and total == 2


def test_id_floor_orders_like_enqueue_time():
    # Bracket the id's minting between two clock reads rather than guess how long it took
    # (a one-second guess fails on a loaded machine). id_floor() floors to the millisecond;
    # 2 ms above `after` stays above the id's millisecond whatever the float rounding.
    before = timezone.now()
    task = make_task()
    after = timezone.now()
    row = Task.objects.get(pk=task.pk)
    assert stats.id_floor(before) < row.pk < stats.id_floor(after + timedelta(milliseconds=2))


@pytest.mark.skipif(connection.vendor != "postgresql", reason="query plans are PostgreSQL's")
def test_dashboard_queries_never_scan_the_table():
    for status in (Status.READY, Status.RUNNING, Status.FAILED, Status.SUCCESSFUL):
        make_task(status)
    with CaptureQueriesContext(connection) as captured:
        stats.overview()
        stats.leases()
        list(Task.objects.filter(status__in=(Status.FAILED, Status.CANCELLED), queue="emails").values("pk"))
    with connection.cursor() as cursor:
        # With sequential scans priced out, a plan that still has one has no index to use.
        cursor.execute("SET LOCAL enable_seqscan = off")
        for query in captured.captured_queries:
            cursor.execute("EXPLAIN " + query["sql"])
            plan = "\n".join(r[0] for r in cursor.fetchall())
            assert "Seq Scan" not in plan, f"{query['sql']}\n{plan}"
