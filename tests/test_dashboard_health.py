"""The Health page: periodic schedules from ox.periodic.schedule_status() and the task table's
PostgreSQL health from ox.tablehealth.table_health(), each a polled partial."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.tasks import task_backends
from django.template.defaultfilters import filesizeformat
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from dashboard.views.health import health
from ox.connection import open_worker_connection
from ox.models import Task
from ox.periodic import Ticker, schedule_status
from ox.schedules import parse_schedule
from ox.tablehealth import table_health
from tests.helpers import wait_until
from tests.settings import TASKS
from tests.test_dashboard_support import render_at, staff_fixture  # noqa: F401

pytestmark = pytest.mark.django_db
postgres_only = pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL statistics")
sqlite_only = pytest.mark.skipif(connection.vendor != "sqlite", reason="the SQLite message")

URL = reverse("dashboard:health")
NOW = datetime(2026, 3, 10, 12, 0, 30, tzinfo=UTC)  # the fixed clock of the schedule tests
HX = {"HX-Request": "true"}


def tasks_with(**options):
    return {"default": {**TASKS["default"], "OPTIONS": {**TASKS["default"]["OPTIONS"], **options}}}


def row(body: str, name: str) -> str:
    """The schedules table's row for one schedule."""
    match = re.search(rf'<tr [^>]*data-schedule="{name}">(.*?)</tr>', body, re.S)
    assert match, f"no row for {name}"
    return match.group(1)


# ---------------------------------------------------------------- access and partials


def test_anonymous_is_sent_to_login(client):
    response = client.get(URL)
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    poll = client.get(f"{URL}?part=schedules", headers={**HX, "HX-Current-URL": "http://testserver/health/"})
    assert poll["HX-Redirect"].startswith(reverse("login"))


def test_non_staff_is_refused(client):
    client.force_login(User.objects.create_user("plain", password="pw"))
    assert client.get(URL).status_code == 403
    assert client.get(f"{URL}?part=table", headers=HX).status_code == 403


def test_page_and_partials_for_staff(client, staff):
    page = client.get(URL)
    assert page.status_code == 200
    body = page.content.decode()
    assert "<html" in body and 'aria-current="page">Health</a>' in body
    assert 'id="health-schedules"' in body and 'id="health-table"' in body
    assert f'hx-get="{URL}?part=schedules" hx-trigger="every 2s"' in body
    assert f'hx-get="{URL}?part=table" hx-trigger="every 5s"' in body

    both = client.get(URL, headers=HX).content.decode()
    assert "<html" not in both and 'id="health-schedules"' in both and 'id="health-table"' in both
    schedules = client.get(f"{URL}?part=schedules", headers=HX).content.decode()
    assert schedules.lstrip().startswith('<section class="card" id="health-schedules"')
    assert 'id="health-table"' not in schedules
    table = client.get(f"{URL}?part=table", headers=HX).content.decode()
    assert table.lstrip().startswith('<section class="card" id="health-table"')
    assert 'id="health-schedules"' not in table
    for response in (page, client.get(f"{URL}?part=table", headers=HX)):
        assert "HX-Request" in response["Vary"] and "no-cache" in response["Cache-Control"]


def test_nav_links_to_health_next_to_workers(client, staff):
    body = client.get(reverse("dashboard:workers")).content.decode()
    assert body.index(f'href="{reverse("dashboard:workers")}"') < body.index(f'href="{URL}"')


# ---------------------------------------------------------------- schedules


def test_no_schedules_configured(client, staff):
    assert schedule_status() == []
    body = client.get(f"{URL}?part=schedules", headers=HX).content.decode()
    assert "No schedules configured (<code>OPTIONS</code> <code>SCHEDULES</code>)" in body


def test_schedules_with_last_and_next_tick_and_the_missed_badge(client, staff):
    # One fixed clock for firing, schedule_status() and the rendering: what the row says is
    # then exact, however slow the machine. (With the wall clock, an every-60 s schedule's
    # next tick can be under a second away and read "now" or lie in the past by render time.)
    now = NOW
    # Hourly at a minute half an hour away: its due tick (11:30) is 30.5 min old at NOW, so one
    # left unrecorded is overdue (ox counts a tick missed after 60 s).
    hourly_spec = {"task": "tests.tasks.echo", "cron": f"{(now.minute + 30) % 60} * * * *", "args": [1]}
    beat_spec = {"task": "tests.tasks.echo", "every": 60, "args": ["hi"]}
    with override_settings(TASKS=tasks_with(SCHEDULES={"beat": beat_spec, "hourly": hourly_spec})):
        ticker = Ticker(task_backends["default"], [])
        beat, hourly = parse_schedule("beat", beat_spec), parse_schedule("hourly", hourly_spec)
        ticker.fire(connection, beat, beat.latest_tick(now), now)  # on time
        ticker.fire(connection, hourly, hourly.latest_tick(now) - timedelta(hours=2), now)  # stale
        status = {s.name: s for s in schedule_status(now)}
        assert status["beat"].missed is False and status["hourly"].missed is True

        body = render_at(health, staff, now, f"{URL}?part=schedules")

    beat_row, hourly_row = row(body, "beat"), row(body, "hourly")
    assert "tests.tasks.echo" in beat_row and "every 60s" in beat_row
    assert status["hourly"].description in hourly_row
    assert 'class="badge badge-failed">missed</span>' in hourly_row
    assert "missed</span>" not in beat_row and 'class="badge badge-ok">on time</span>' in beat_row
    for name in ("beat", "hourly"):
        task_id = status[name].last_task_id
        assert Task.objects.filter(pk=task_id).exists()
        assert f'href="{reverse("dashboard:task", args=[task_id])}"' in row(body, name)
    # Last tick 12:00:00 with the absolute instant in its title, 30 s before NOW; the next tick
    # 12:01:00, 30 s after it (the view read the injected clock, not the wall clock).
    last = status["beat"].last_tick_at
    assert last == datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    assert f'title="{last.isoformat(timespec="milliseconds")}">30 s ago</time>' in beat_row
    assert 'title="2026-03-10T12:01:00.000+00:00">in 30 s</time>' in beat_row
    assert 'title="2026-03-10T12:30:00.000+00:00">in 29 min</time>' in hourly_row


def test_without_an_injected_clock_the_page_reads_the_wall_clock(client, staff):
    # The URL never passes `now`: the page renders at the real time.
    spec = {"task": "tests.tasks.echo", "every": 3600}
    with override_settings(TASKS=tasks_with(SCHEDULES={"slow": spec})):
        before = timezone.now()
        body = client.get(f"{URL}?part=schedules", headers=HX).content.decode()
        after = timezone.now()
    nxt = datetime.fromisoformat(re.findall(r'<time datetime="([^"]+)"', row(body, "slow"))[-1])
    assert parse_schedule("slow", spec).next_tick(before) <= nxt <= parse_schedule("slow", spec).next_tick(after)


def test_schedules_partial_query_count(client, staff, django_assert_max_num_queries):
    specs = {f"s{i}": {"task": "tests.tasks.echo", "every": 60 * (i + 1)} for i in range(3)}
    with override_settings(TASKS=tasks_with(SCHEDULES=specs)):
        # session + user + its permissions (user and group) + at most two small indexed queries
        # per schedule
        with django_assert_max_num_queries(4 + 2 * len(specs)):
            response = client.get(f"{URL}?part=schedules", headers=HX)
    assert response.status_code == 200 and all(f'data-schedule="{name}"' in response.content.decode() for name in specs)


# ---------------------------------------------------------------- table health


def test_table_partial_query_count(client, staff, django_assert_max_num_queries):
    # session + user + its permissions (user and group) + table_health()'s statistics and
    # oldest-transaction queries (none on SQLite; on MariaDB/MySQL sizes, then purge lag and the
    # oldest transaction together)
    with django_assert_max_num_queries(4 if connection.vendor == "sqlite" else 6):
        response = client.get(f"{URL}?part=table", headers=HX)
    assert response.status_code == 200


@sqlite_only
def test_sqlite_has_no_table_statistics(client, staff):
    body = client.get(f"{URL}?part=table", headers=HX).content.decode()
    assert "Table statistics are PostgreSQL's; this database is SQLite." in body
    assert "dead tuples" not in body


@postgres_only
def test_postgres_table_numbers(client, staff):
    health = table_health()
    body = client.get(f"{URL}?part=table", headers=HX).content.decode()
    assert f"{health.dead_tuples} dead tuples" in body and "Last autovacuum" in body
    assert f'data-stat="table_bytes">{filesizeformat(health.table_bytes)}<' in body
    assert f'data-stat="index_bytes">{filesizeformat(health.index_bytes)}<' in body
    assert "fillfactor=80" in body
    assert 'role="alert"' not in body  # no transaction older than an hour


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_postgres_warns_about_an_old_open_transaction(client, staff):
    other = open_worker_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cursor.execute("SELECT count(*) FROM ox_task")  # takes the snapshot that pins xmin
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]

            def flagged() -> bool:  # older than the 0.1 s asked for below: wait for it, no guessed sleep
                oldest = table_health(max_xact_age=0.1).oldest_transaction
                return oldest is not None and oldest.pid == pid and oldest.age_seconds > 0.1

            wait_until(flagged, timeout=10)
            with override_settings(TASKS=tasks_with(HEALTH_MAX_XACT_AGE=0.1)):
                warned = client.get(f"{URL}?part=table", headers=HX).content.decode()
            calm = client.get(f"{URL}?part=table", headers=HX).content.decode()  # default: one hour
            cursor.execute("ROLLBACK")
    finally:
        other.close()
    assert 'role="alert"' in warned and f"pid {pid}, idle in transaction" in warned
    assert 'role="alert"' not in calm and f'<span class="mono">{pid}</span>' in calm


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_other_sessions_sql_text_is_never_shown(client, staff):
    # Issue #16: the page showed pg_stat_activity.query, literal values included: a session
    # key from an INSERT INTO django_session held open in another session was on screen.
    import io
    import json
    import secrets

    from django.core.management import call_command

    marker = f"leaked-session-key-{secrets.token_hex(8)}"
    other = open_worker_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                "INSERT INTO django_session (session_key, session_data, expire_date) VALUES (%s, 'x', now())",
                [marker],
            )
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
            # What PostgreSQL has on record for that session: its last statement, literal and all.
            # (The pid query was its last one, so look at the INSERT the way the page used to.)
            cursor.execute("SELECT %s", [marker])
            with connection.cursor() as ours:
                ours.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid])
                assert marker in ours.fetchone()[0]

            def oldest_is_ours() -> bool:
                oldest = table_health().oldest_transaction
                return oldest is not None and oldest.pid == pid

            wait_until(oldest_is_ours, timeout=10)
            page = client.get(URL).content.decode()
            partial = client.get(f"{URL}?part=table", headers=HX).content.decode()
            metrics = client.get("/ox/metrics").content.decode()
            out = io.StringIO()
            try:
                call_command("ox_health", "--json", stdout=out)
            except SystemExit:
                pass  # exit status 1 for a crossed threshold is fine here
            cursor.execute("ROLLBACK")
    finally:
        other.close()
    for shown in (page, partial, metrics, out.getvalue()):
        assert marker not in shown and "INSERT INTO" not in shown
    assert f'<span class="mono">{pid}</span>' in partial  # still enough to find the session
    assert json.loads(out.getvalue())["table"]["oldest_transaction"]["pid"] == pid
