"""InnoDB table health on MariaDB/MySQL: sizes from information_schema.TABLES, the history list
length (purge lag), and the server's oldest open transaction, on the real server; and how the
dashboard's health page, `ox_health --json` and /ox/metrics show them."""

import io
import json
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.template.defaultfilters import filesizeformat
from django.test import override_settings
from django.urls import reverse

from ox.db.mysql.health import InnoDBTableHealth
from ox.metrics import render_metrics
from ox.tablehealth import table_health
from tests import tasks
from tests.helpers import wait_until
from tests.test_dashboard_health import tasks_with
from tests.test_dashboard_support import staff_fixture  # noqa: F401
from tests.test_metrics import parse

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(connection.vendor != "mysql", reason="InnoDB statistics (MariaDB, MySQL)"),
]

URL = reverse("dashboard:health")
HX = {"HX-Request": "true"}
# InnoDB serves INNODB_TRX from a cache that it refreshes only when nobody has read it for 100 ms
# (trx_i_s_cache, CACHE_MIN_IDLE_TIME_US): polled faster, it would show the first snapshot forever.
POLL = 0.25


def innodb(**kwargs) -> InnoDBTableHealth:
    health = table_health(**kwargs)
    assert isinstance(health, InnoDBTableHealth), health
    return health


@contextmanager
def open_transaction(marker: str = "") -> Iterator[int]:
    """A second connection with a write transaction left open; yields its thread id. The write
    makes it a read-write InnoDB transaction (trx_started set), as a forgotten session is."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("START TRANSACTION")
            cursor.execute(
                "INSERT INTO django_session (session_key, session_data, expire_date) VALUES (%s, 'x', NOW())",
                [marker or f"open-{secrets.token_hex(8)}"],
            )
            cursor.execute("SELECT CONNECTION_ID()")
            thread_id = cursor.fetchone()[0]
            try:
                yield thread_id
            finally:
                cursor.execute("ROLLBACK")
    finally:
        other.close()


def oldest_is(thread_id: int, older_than: float = 0.0):
    """A wait_until() predicate: the server's oldest transaction is `thread_id`, older than
    `older_than` seconds (waited for, not slept: trx_started has whole seconds)."""

    def check() -> InnoDBTableHealth | None:
        health = innodb(max_xact_age=older_than)
        oldest = health.oldest_transaction
        return health if oldest and oldest.thread_id == thread_id and oldest.age_seconds > older_than else None

    return check


# ---------------------------------------------------------------- ox.tablehealth


def test_sizes_are_present_and_positive():
    for i in range(20):
        tasks.echo.enqueue(i)
    health = innodb()
    assert health.kind == "innodb" and health.table == "ox_task"
    # InnoDB allocates at least a page per index, so a table with rows has both sizes above 0.
    assert health.data_bytes > 0 and health.index_bytes > 0
    assert health.total_bytes == health.data_bytes + health.index_bytes
    assert health.free_bytes >= 0 and health.estimated_rows >= 0
    assert health.transactions_visible  # root has PROCESS


def test_history_list_length_is_an_int_or_none():
    history = innodb().history_list_length
    assert history is None or (isinstance(history, int) and history >= 0)


def test_missing_table_is_none():
    assert table_health(table="ox_no_such_table") is None


@pytest.mark.django_db(transaction=True)
def test_an_open_transaction_is_the_oldest_and_flips_the_warning():
    with open_transaction() as thread_id:
        health = wait_until(oldest_is(thread_id, older_than=0.1), timeout=10, interval=POLL)
        assert health.warning and health.oldest_transaction.state == "RUNNING"
        assert health.oldest_transaction.age_seconds > 0.1
        calm = innodb(max_xact_age=3600)
        assert calm.oldest_transaction.thread_id == thread_id and calm.warning is False

    def gone() -> bool:
        after = innodb(max_xact_age=0.1).oldest_transaction
        return after is None or after.thread_id != thread_id

    wait_until(gone, timeout=10, interval=POLL)


# ---------------------------------------------------------------- dashboard


def test_dashboard_shows_the_innodb_figures(client, staff):
    tasks.echo.enqueue(1)
    health = innodb()
    body = client.get(f"{URL}?part=table", headers=HX).content.decode()
    assert body.lstrip().startswith('<section class="card" id="health-table"')
    assert f'data-stat="data_bytes">{filesizeformat(health.data_bytes)}<' in body
    assert f'data-stat="index_bytes">{filesizeformat(health.index_bytes)}<' in body
    assert f'data-stat="free_bytes">{filesizeformat(health.free_bytes)}<' in body
    assert f'data-stat="total_bytes">{filesizeformat(health.total_bytes)}<' in body
    assert re.search(r'data-stat="estimated_rows">\d+<', body)
    # Server-wide, so other sessions move it between the two reads: a number, or "not available".
    assert re.search(r'data-stat="history_list_length">(\d+|not available)<', body)
    assert "Dead tuples and (auto)vacuum are PostgreSQL's; not available on MariaDB" in body
    assert "Table statistics are PostgreSQL" not in body and "Last autovacuum" not in body
    assert 'role="alert"' not in body


@pytest.mark.django_db(transaction=True)
def test_dashboard_warns_about_an_old_transaction_without_its_sql(client, staff):
    marker = f"leaked-session-key-{secrets.token_hex(8)}"
    with open_transaction(marker) as thread_id:
        wait_until(oldest_is(thread_id, older_than=0.1), timeout=10, interval=POLL)
        with override_settings(TASKS=tasks_with(HEALTH_MAX_XACT_AGE=0.1)):
            warned = client.get(f"{URL}?part=table", headers=HX).content.decode()
        calm = client.get(f"{URL}?part=table", headers=HX).content.decode()  # default: one hour
        metrics = client.get("/ox/metrics").content.decode()
        out = io.StringIO()
        try:
            call_command("ox_health", "--json", stdout=out)
        except SystemExit:
            pass  # exit status 1 for a crossed threshold is fine here
    assert 'role="alert"' in warned and f"thread {thread_id}, RUNNING" in warned
    assert 'role="alert"' not in calm and f'thread <span class="mono">{thread_id}</span>' in calm
    # INNODB_TRX.trx_query holds the other session's SQL, literals and all: never shown.
    for shown in (warned, calm, metrics, out.getvalue()):
        assert marker not in shown and "INSERT INTO" not in shown
    table = json.loads(out.getvalue())["table"]
    assert table["kind"] == "innodb" and table["oldest_transaction"]["thread_id"] == thread_id
    assert table["total_bytes"] == table["data_bytes"] + table["index_bytes"] and "dead_ratio" not in table


# ---------------------------------------------------------------- metrics


def test_metrics_export_the_innodb_figures(admin_client):
    tasks.echo.enqueue(1)
    health = innodb()
    samples = parse(render_metrics())
    label = ("table", "ox_task")
    for part, value in (("data", health.data_bytes), ("indexes", health.index_bytes), ("free", health.free_bytes)):
        assert samples[("ox_table_bytes", frozenset({label, ("part", part)}))] == value
    total = samples[("ox_table_bytes", frozenset({label, ("part", "total")}))]
    assert total == health.data_bytes + health.index_bytes > 0
    assert ("ox_table_estimated_rows", frozenset({label})) in samples
    assert samples[("ox_oldest_transaction_age_seconds", frozenset())] >= 0
    if health.history_list_length is not None:
        assert samples[("ox_innodb_history_list_length", frozenset())] >= 0
    # PostgreSQL's only: not exported as zeros that would read as "no bloat".
    assert not any(name in ("ox_table_dead_tuples", "ox_table_live_tuples") for name, _ in samples)

    text = admin_client.get("/ox/metrics").content.decode()  # the endpoint, too
    assert 'ox_table_bytes{table="ox_task",part="data"} ' in text
    assert "# TYPE ox_innodb_history_list_length gauge" in text or health.history_list_length is None
    assert "# TYPE ox_oldest_transaction_age_seconds gauge" in text


@pytest.mark.django_db(transaction=True)
def test_metrics_oldest_transaction_age(admin_client):
    with open_transaction() as thread_id:
        health = wait_until(oldest_is(thread_id, older_than=0.1), timeout=10, interval=POLL)
        samples = parse(render_metrics())
    assert samples[("ox_oldest_transaction_age_seconds", frozenset())] >= health.oldest_transaction.age_seconds
