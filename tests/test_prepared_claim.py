"""The worker's claims as prepared statements with generic plans (ox.db.postgresql.prepared),
on its own connection only, and never behind a transaction pooler. The plans themselves, on a
large backlog, are pinned in tests/test_claim_plans.py (their "(generic plan)" entries)."""

import json
from datetime import timedelta

import pytest
from django.db import OperationalError, connection, connections
from django.test.utils import CaptureQueriesContext

from ox import clock, sql
from ox.connection import open_worker_connection
from ox.models import Status, Task
from tests.test_dashboard_support import make_task

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
]


def claim_on(conn, limit: int = 1, queues: tuple[str, ...] = ("default",)) -> list:
    now = clock.db_now(conn)
    return sql.claim(conn, "w-prep", list(queues), (limit, 0), now, now + timedelta(seconds=30))


def arg(claimed) -> int:
    return json.loads(claimed.args_json)[0]


def prepared(conn) -> list[tuple[str, int, int]]:
    """The session's prepared statements: (its text's start, generic plans, custom plans)."""
    with conn.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements ORDER BY statement")
        return [(text[:20], generic, custom) for text, generic, custom in cursor.fetchall()]


def setting(conn, name: str) -> str:
    with conn.cursor() as cursor:
        cursor.execute("SELECT current_setting(%s)", [name])
        return cursor.fetchone()[0]


def test_the_worker_connection_prepares_its_claims_with_a_generic_plan():
    for i in range(3):
        make_task(args=[i])
    conn = open_worker_connection("default")
    try:
        assert setting(conn, "plan_cache_mode") == "force_generic_plan"
        now = clock.db_now(conn)
        with CaptureQueriesContext(conn) as captured:  # Django's cursor wrapper still sees it
            first = sql.claim(conn, "w-prep", ["default"], (1, 0), now, now + timedelta(seconds=30))
        assert len(captured.captured_queries) == 1
        second, third, none = claim_on(conn), claim_on(conn), claim_on(conn)
        assert [len(first), len(second), len(third), len(none)] == [1, 1, 1, 0]
        assert sorted(arg(c) for c in first + second + third) == [0, 1, 2]
        # One statement, planned once without its parameters' values, never per call.
        [(text, generic, custom)] = prepared(conn)
        assert text.startswith("WITH pick_false")
        assert generic >= 1 and custom == 0
        assert Task.objects.filter(status=Status.RUNNING, worker_id="w-prep").count() == 3
    finally:
        conn.close()


def test_limits_share_few_statements_and_the_results_match_unprepared():
    for i in range(40):
        make_task(args=[i], priority=i % 3)
    conn = open_worker_connection("default")
    try:
        sizes = (2, 3, 4, 20)
        got = [[arg(c) for c in claim_on(conn, n)] for n in sizes]
        assert [len(g) for g in got] == list(sizes)
        # The same claims, in the same order, as Django's own (unprepared) connection makes.
        Task.objects.filter(status=Status.RUNNING).update(status=Status.READY, worker_id="")
        assert [[arg(c) for c in claim_on(connection, n)] for n in sizes] == got
        # The candidates' bound is in the text, rounded up to a power of two (2, 3 and 4 read
        # 16 candidates per level, 20 reads 64): a prefetch size that moves from claim to
        # claim does not prepare a statement each time.
        assert len(prepared(conn)) == 2
        assert prepared(connection) == []
    finally:
        conn.close()


def test_nothing_else_is_prepared_even_with_server_side_binding(monkeypatch):
    direct = connections.settings["default"]
    risky = {**direct.get("OPTIONS", {}), "server_side_binding": True, "prepare_threshold": 0}
    monkeypatch.setitem(connections.settings, "default", {**direct, "OPTIONS": risky})
    conn = open_worker_connection("default")
    try:
        with conn.cursor() as cursor:
            for i in range(10):  # psycopg would prepare these at its threshold
                cursor.execute("SELECT %s::int + 1", [i])
        make_task()
        assert len(claim_on(conn)) == 1
        assert [text for text, _g, _c in prepared(conn)] == ["WITH pick_false AS ("]
    finally:
        conn.close()


def test_a_pooled_worker_connection_prepares_nothing():
    make_task()
    conn = open_worker_connection("default", pooled=True)
    try:
        assert setting(conn, "plan_cache_mode") == "auto"
        assert len(claim_on(conn)) == 1
        assert prepared(conn) == []
    finally:
        conn.close()


def test_a_reconnect_prepares_again_on_the_new_session():
    for i in range(2):
        make_task(args=[i])
    conn = open_worker_connection("default")
    try:
        assert len(claim_on(conn)) == 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [conn.connection.info.backend_pid])
        with pytest.raises(OperationalError):
            claim_on(conn)
        conn.close()  # what the worker does with a broken connection before it reconnects
        assert len(claim_on(conn)) == 1
        assert setting(conn, "plan_cache_mode") == "force_generic_plan"
        [(_text, generic, custom)] = prepared(conn)
        assert generic == 1 and custom == 0
    finally:
        conn.close()


def test_a_column_added_while_a_worker_runs_does_not_break_its_prepared_claim():
    # A migration run beside live workers: PostgreSQL replans a prepared statement whose table
    # changed, and the claim's RETURNING names its columns, so its result keeps its shape.
    for i in range(2):
        make_task(args=[i])
    conn = open_worker_connection("default")
    try:
        assert len(claim_on(conn)) == 1
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE ox_task ADD COLUMN ox_test_extra integer")
        try:
            [claimed] = claim_on(conn)
            assert arg(claimed) == 1
        finally:
            with connection.cursor() as cursor:
                cursor.execute("ALTER TABLE ox_task DROP COLUMN ox_test_extra")
    finally:
        conn.close()
