#!/usr/bin/env python
"""Measure every dashboard page and partial at scale on PostgreSQL.

Creates a scratch database (default `oxscale`), fills it with 10,000,000 finished tasks spread
over the last 30 days and 1,000,000 READY ones over the last hour (four queues, three
priorities, one in ten scheduled ahead), with INSERT ... SELECT generate_series, the secondary
indexes built after the rows, then VACUUM ANALYZE: about three minutes. It then renders each
page and htmx partial, the admin's task list with its filters and search, the health page and
/ox/metrics with Django's test Client and prints the server time per page (median and worst
of several runs) and its query count. The database is dropped at the end unless --keep (and
--keep reuses it next time: measure, change, measure again without refilling).

    .venv/bin/python scripts/dashboard_scale.py [--finished 10000000] [--ready 1000000] [--days 30] [--keep]

The budget is 100 ms per render; the exit status is 1 when a page's median is over it.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUDGET_MS = 100.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("OX_SCALE_URL", "postgres://postgres@127.0.0.1:5432/oxscale"))
    parser.add_argument("--finished", type=int, default=10_000_000)
    parser.add_argument("--ready", type=int, default=1_000_000)
    # 10M over 30 days is ~14,000 finished an hour, the rate of the old 1M-over-3-days fill:
    # the history grows, the load on the last hour's windows stays the same.
    parser.add_argument("--days", type=float, default=30.0, help="days the finished tasks span")
    parser.add_argument("--runs", type=int, default=9, help="timed renders per page")
    parser.add_argument("--keep", action="store_true", help="keep the database (and reuse it next time)")
    parser.add_argument("--explain", action="store_true", help="print the plans of the overview's queries")
    return parser.parse_args()


def admin_connection(url: str):  # noqa: ANN201  (psycopg is imported late, after the checks)
    import psycopg

    parts = urlsplit(url)
    return psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True)


def create_database(url: str, reuse: bool) -> bool:
    """Returns whether the database already existed (and was kept)."""
    name = urlsplit(url).path.lstrip("/")
    with admin_connection(url) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists and reuse:
            return True
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return False


def drop_database(url: str) -> None:
    from django.db import connections

    connections.close_all()
    name = urlsplit(url).path.lstrip("/")
    with admin_connection(url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# A task id is a UUIDv7 minted at enqueue: 48 bits of milliseconds, then version and random
# bits. Built here from the row's enqueued_at, so id order is enqueue order as in production.
UUID7_SQL = """(
    lpad(to_hex((extract(epoch FROM {ts}) * 1000)::bigint), 12, '0')
    || '7' || substr(md5({seed}), 1, 3) || '8' || substr(md5({seed}), 4, 15)
)::uuid"""

# Rows i = start..stop of n, oldest first (i = 1 is `back` + `days` days ago, i = n is `back`
# days ago): ids then ascend with the heap, as enqueues leave them, and the primary key is
# built by appending. `tag` keeps the ids of two fills apart (the plan test adds older history).
FILL_FINISHED = """
INSERT INTO ox_task (id, task_path, queue, priority, status, args, kwargs, run_after, enqueued_at,
    started_at, last_attempted_at, finished_at, attempts, max_attempts, worker_id, lease_expires_at,
    fence, return_value, cancel_requested)
SELECT {id}, path, queue, 0, status, '[1, 2]', '{{}}', enq, enq, enq + interval '20 ms',
    enq + interval '20 ms', enq + interval '60 ms', 1, 3, 'scale-worker-1', NULL, 1,
    CASE WHEN status = 'SUCCESSFUL' THEN '3'::jsonb END, false
FROM (
    SELECT i,
        now() - interval '1 day' * %(back)s - interval '1 day' * %(days)s * (1 - i::float8 / %(n)s)
            - interval '1 second' AS enq,
        (ARRAY['demo.tasks.add', 'demo.tasks.checksum', 'demo.tasks.flaky_email', 'app.send_invoice',
               'app.resize_image'])[1 + i %% 5] AS path,
        CASE WHEN (i / 3) %% 20 < 12 THEN 'default' WHEN (i / 3) %% 20 < 17 THEN 'emails' ELSE 'reports' END AS queue,
        CASE WHEN i %% 50 = 0 THEN 'FAILED' WHEN i %% 200 = 1 THEN 'CANCELLED' ELSE 'SUCCESSFUL' END AS status
    FROM generate_series(%(start)s, %(stop)s) AS i
) AS rows
""".format(id=UUID7_SQL.format(ts="enq", seed="%(tag)s || i::text"))

# The backlog: enqueued over the hour ending `back` hours ago, oldest first, over four queues
# (half of it in `default`) and three priorities; one task in ten is scheduled up to two days
# ahead. `tag` keeps the ids of two fills apart (the plan test doubles the backlog).
FILL_READY = """
INSERT INTO ox_task (id, task_path, queue, priority, status, args, kwargs, run_after, scheduled_for,
    enqueued_at, attempts, max_attempts, worker_id, fence, cancel_requested)
SELECT {id}, path, queue, priority, 'READY', '[1, 2]', '{{}}', COALESCE(later, enq), later, enq, 0, 3, '', 0, false
FROM (
    SELECT i,
        now() - interval '1 hour' * (%(back)s + 1 - i::float8 / %(n)s) - interval '1 second' AS enq,
        CASE WHEN (i / 3) %% 10 = 1 THEN now() + interval '1 minute' + interval '2 days' * ((i / 10) %% 1000) / 1000 END
            AS later,
        (ARRAY['demo.tasks.add', 'demo.tasks.checksum', 'demo.tasks.flaky_email', 'app.send_invoice',
               'app.resize_image'])[1 + (i / 7) %% 5] AS path,
        CASE WHEN i %% 20 < 10 THEN 'default' WHEN i %% 20 < 15 THEN 'emails' WHEN i %% 20 < 18 THEN 'reports'
             ELSE 'bulk' END AS queue,
        CASE WHEN (i / 20) %% 10 < 7 THEN 0 WHEN (i / 20) %% 10 < 9 THEN 10 ELSE -10 END AS priority
    FROM generate_series(1, %(n)s) AS i
) AS rows
""".format(id=UUID7_SQL.format(ts="enq", seed="%(tag)s || i::text"))

FILL_RUNNING = """
INSERT INTO ox_task (id, task_path, queue, priority, status, args, kwargs, run_after, enqueued_at,
    started_at, last_attempted_at, attempts, max_attempts, worker_id, lease_expires_at, fence, cancel_requested)
SELECT {id}, 'app.resize_image', 'default', 0, 'RUNNING', '[]', '{{}}', enq, enq, now(), now(), 1, 3,
    'scale-worker-' || (1 + i %% 4), now() + interval '30 seconds', 1, false
FROM (SELECT i, now() - interval '1 second' * i AS enq FROM generate_series(1, 40) AS i) AS rows
""".format(id=UUID7_SQL.format(ts="enq", seed="'x' || i::text"))

FILL_ATTEMPTS = """
INSERT INTO ox_attempt (task_id, number, worker_id, started_at, finished_at, outcome, exception_class_path, traceback)
SELECT id, 1, worker_id, started_at, finished_at, 'failed', 'builtins.RuntimeError',
    'Traceback (most recent call last):' || chr(10) || '  File "app.py", line 1, in run' || chr(10)
    || 'RuntimeError: the scale test fails one task in fifty'
FROM ox_task WHERE status = 'FAILED'
"""

FILL_WORKERS = """
INSERT INTO ox_worker (id, host, pid, queues, concurrency, lock_key, started_at, heartbeat_at, stopped_at)
SELECT 'scale-worker-' || i, 'host-' || (i %% 2), 1000 + i, '["default", "emails", "reports"]', 4, i,
    now() - interval '1 hour', now() - CASE WHEN i <= 4 THEN interval '1 second' ELSE interval '5 minutes' END,
    CASE WHEN i > 6 THEN now() - interval '5 minutes' END
FROM generate_series(1, 8) AS i
"""


CHUNK = 1_000_000  # finished rows per INSERT: progress to print, and no single huge statement

# The secondary indexes of ox_task (not the primary key, which constraints and the attempts'
# foreign key hang on): dropped before the fill and built after it, which is several times
# faster than maintaining seven indexes row by row.
SECONDARY_INDEXES = """
SELECT indexname, indexdef FROM pg_indexes
WHERE tablename = 'ox_task'
  AND indexname NOT IN (SELECT conname FROM pg_constraint WHERE conrelid = 'ox_task'::regclass)
"""


def timed(cursor, label: str, sql: str, params: dict | None = None) -> None:  # noqa: ANN001
    start = time.perf_counter()
    cursor.execute(sql, params)
    print(f"  {label} in {time.perf_counter() - start:.1f} s", flush=True)


def fill(finished: int, ready: int, days: float) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '512MB'")
        cursor.execute("SET synchronous_commit = off")  # a scratch database: nothing to lose
        cursor.execute(SECONDARY_INDEXES)
        indexes = cursor.fetchall()
        for name, _ in indexes:
            cursor.execute(f'DROP INDEX "{name}"')
        for start in range(1, finished + 1, CHUNK):
            stop = min(start + CHUNK - 1, finished)
            params = {"n": finished, "start": start, "stop": stop, "days": days, "back": 0, "tag": "f"}
            timed(cursor, f"inserted finished tasks {start:,}..{stop:,}", FILL_FINISHED, params)
        timed(cursor, f"inserted {ready:,} ready tasks", FILL_READY, {"n": ready, "back": 0, "tag": "r"})
        timed(cursor, "inserted 40 running tasks", FILL_RUNNING, {})
        timed(cursor, "inserted attempt rows for the failed", FILL_ATTEMPTS)
        timed(cursor, "inserted 8 workers", FILL_WORKERS, {})
        for name, definition in indexes:
            timed(cursor, f"built {name}", definition)
        # Statistics for the planner, and the visibility map that lets counts be index-only.
        timed(cursor, "vacuum analyze ox_task", "VACUUM (ANALYZE) ox_task")
        timed(cursor, "vacuum analyze ox_attempt", "VACUUM (ANALYZE) ox_attempt")


def pages() -> list[tuple[str, str, dict[str, str], bool]]:
    """(label, path, query, htmx) for every page and partial."""
    from ox.models import Status, Task

    failed = Task.objects.filter(status=Status.FAILED).order_by("-id").values_list("id", flat=True).first()
    done = Task.objects.filter(status=Status.SUCCESSFUL).order_by("id").values_list("id", flat=True).first()
    day_ago = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(time.time() - 86400))
    two_days_ago = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(time.time() - 2 * 86400))
    found = []
    for htmx in (False, True):
        kind = "partial" if htmx else "page"
        found += [
            (f"overview {kind}", "/", {}, htmx),
            (f"tasks {kind}", "/tasks/", {}, htmx),
            (f"running {kind}", "/running/", {}, htmx),
            (f"workers {kind}", "/workers/", {}, htmx),
            (f"task detail (failed) {kind}", f"/tasks/{failed}/", {}, htmx),
        ]
    found += [
        ("tasks status=FAILED", "/tasks/", {"status": "FAILED"}, True),
        ("tasks status=READY queue=emails", "/tasks/", {"status": "READY", "queue": "emails"}, True),
        ("tasks status=CANCELLED", "/tasks/", {"status": "CANCELLED"}, True),
        ("tasks queue=reports", "/tasks/", {"queue": "reports"}, True),
        ("tasks task=app.send_invoice", "/tasks/", {"task": "app.send_invoice"}, True),
        ("tasks task=<no such task>", "/tasks/", {"task": "app.nothing_like_this"}, True),
        ("tasks enqueued 2 d..1 d ago", "/tasks/", {"enqueued_after": two_days_ago, "enqueued_before": day_ago}, True),
        ("tasks page 200", "/tasks/", {"page": "200"}, True),
        ("tasks id=<oldest>", "/tasks/", {"id": str(done)}, True),
        ("tasks bad filter", "/tasks/", {"status": "NOPE"}, True),
        ("retry-matching confirm (all)", "/tasks/retry-matching/", {}, False),
        (
            "retry-matching status=FAILED queue=emails",
            "/tasks/retry-matching/",
            {"status": "FAILED", "queue": "emails"},
            False,
        ),
        ("tasks status=READY", "/tasks/", {"status": "READY"}, True),
        ("tasks task=app.send_invoice status=READY", "/tasks/", {"task": "app.send_invoice", "status": "READY"}, True),
        ("tasks queue=bulk status=READY p.100", "/tasks/", {"queue": "bulk", "status": "READY", "page": "100"}, True),
        ("health page", "/health/", {}, False),
        ("health partial", "/health/", {}, True),
        ("health partial schedules", "/health/", {"part": "schedules"}, True),
        ("health partial table", "/health/", {"part": "table"}, True),
        ("benchmarks page", "/benchmarks/", {}, False),
        ("tasks queue=<no such queue>", "/tasks/", {"queue": "nope"}, True),
        ("/ox/metrics", "/ox/metrics", {}, False),
        ("admin task list", "/admin/ox/task/", {}, False),
        ("admin search <no such path>", "/admin/ox/task/", {"q": "zzz"}, False),
        ("admin search app.send_invoice", "/admin/ox/task/", {"q": "app.send_invoice"}, False),
        ("admin queue=reports", "/admin/ox/task/", {"queue": "reports"}, False),
        ("admin status=FAILED", "/admin/ox/task/", {"status__exact": "FAILED"}, False),
        ("admin status=READY", "/admin/ox/task/", {"status__exact": "READY"}, False),
        ("admin status=READY queue=bulk", "/admin/ox/task/", {"status__exact": "READY", "queue": "bulk"}, False),
        ("admin enqueued=1h", "/admin/ox/task/", {"enqueued": "1h"}, False),
        ("admin enqueued=24h queue=emails", "/admin/ox/task/", {"enqueued": "24h", "queue": "emails"}, False),
        ("admin task change page", f"/admin/ox/task/{failed}/change/", {}, False),
    ]
    return found


def measure(runs: int) -> list[tuple[str, float, float, int, int]]:
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client

    user, _ = User.objects.get_or_create(username="scale", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    rows = []
    for label, path, query, htmx in pages():
        headers = {"HX-Request": "true"} if htmx else {}
        queries: list[str] = []

        def count(execute, sql, params, many, context, queries=queries):  # noqa: ANN001, ANN202
            queries.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(count):
            status = client.get(path, query, headers=headers).status_code
        client.get(path, query, headers=headers)  # warm
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            client.get(path, query, headers=headers)
            times.append((time.perf_counter() - start) * 1000)
        rows.append((label, statistics.median(times), max(times), len(queries), status))
        print(f"  {label:<48} {rows[-1][1]:7.1f} ms", flush=True)
    return rows


def explain() -> None:
    from django.db import connection

    from ox import stats
    from ox.models import Task

    with connection.cursor() as cursor:
        from django.test.utils import CaptureQueriesContext

        with CaptureQueriesContext(connection) as queries:
            stats.overview()
            list(Task.objects.filter(status="FAILED").order_by("-id")[:50])
        for q in queries.captured_queries:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + q["sql"])
            print("\n" + q["sql"][:160])
            print("\n".join(r[0] for r in cursor.fetchall()))


def main() -> int:
    args = parse_args()
    if not args.url.startswith(("postgres://", "postgresql://")):
        print("dashboard_scale.py measures PostgreSQL: --url must be a postgres:// URL", file=sys.stderr)
        return 2
    os.environ["DATABASE_URL"] = args.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "oxproject.settings")
    # A local measurement, as ./run: DEBUG's plain static storage (no collectstatic) and a local
    # key (the settings default DEBUG to off). The test environment below turns DEBUG off again.
    os.environ.setdefault("DJANGO_DEBUG", "1")
    os.environ.setdefault("OX_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.core.management import call_command
    from django.test.utils import setup_test_environment

    setup_test_environment()  # DEBUG off, "testserver" allowed
    reused = create_database(args.url, reuse=args.keep)
    try:
        print(f"{'Reusing' if reused else 'Creating'} {args.url} ...", flush=True)
        call_command("migrate", verbosity=0)
        if not reused:
            fill(args.finished, args.ready, args.days)
        if args.explain:
            explain()
        print("Measuring (Django test Client, server time) ...", flush=True)
        rows = measure(args.runs)
    finally:
        if not args.keep:
            drop_database(args.url)
    width = max(len(r[0]) for r in rows)
    print(f"\n{'page':<{width}}  {'median ms':>9}  {'max ms':>7}  {'queries':>7}  status")
    print("-" * (width + 38))
    over = 0
    for label, median, worst, queries, status in rows:
        flag = "" if median <= BUDGET_MS else "  OVER BUDGET"
        over += bool(flag)
        print(f"{label:<{width}}  {median:9.1f}  {worst:7.1f}  {queries:7d}  {status}{flag}")
    print(f"\n{args.finished:,} finished + {args.ready:,} ready tasks; budget {BUDGET_MS:.0f} ms per render.")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
