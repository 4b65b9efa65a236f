#!/usr/bin/env python
"""Measure every dashboard page and partial at scale on PostgreSQL.

Creates a scratch database (default `oxscale`), fills it with 1,000,000 finished tasks spread
over the last three days and 10,000 READY ones (INSERT ... SELECT generate_series: seconds, not
minutes), then renders each page and htmx partial with Django's test Client and prints the
server time per page (median and worst of several runs) and its query count. The database is
dropped at the end unless --keep.

    .venv/bin/python scripts/dashboard_scale.py [--finished 1000000] [--ready 10000] [--keep]

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
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--ready", type=int, default=10_000)
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

FILL_FINISHED = """
INSERT INTO ox_task (id, task_path, queue, priority, status, args, kwargs, run_after, enqueued_at,
    started_at, last_attempted_at, finished_at, attempts, max_attempts, worker_id, lease_expires_at,
    fence, return_value, cancel_requested)
SELECT {id}, path, queue, 0, status, '[1, 2]', '{{}}', enq, enq, enq + interval '20 ms',
    enq + interval '20 ms', enq + interval '60 ms', 1, 3, 'scale-worker-1', NULL, 1,
    CASE WHEN status = 'SUCCESSFUL' THEN '3'::jsonb END, false
FROM (
    SELECT i,
        now() - interval '3 days' * (i::float8 / %(n)s) - interval '1 second' AS enq,
        (ARRAY['demo.tasks.add', 'demo.tasks.checksum', 'demo.tasks.flaky_email', 'app.send_invoice',
               'app.resize_image'])[1 + i %% 5] AS path,
        CASE WHEN (i / 3) %% 20 < 12 THEN 'default' WHEN (i / 3) %% 20 < 17 THEN 'emails' ELSE 'reports' END AS queue,
        CASE WHEN i %% 50 = 0 THEN 'FAILED' WHEN i %% 200 = 1 THEN 'CANCELLED' ELSE 'SUCCESSFUL' END AS status
    FROM generate_series(1, %(n)s) AS i
) AS rows
""".format(id=UUID7_SQL.format(ts="enq", seed="'f' || i::text"))

FILL_READY = """
INSERT INTO ox_task (id, task_path, queue, priority, status, args, kwargs, run_after, enqueued_at,
    attempts, max_attempts, worker_id, fence, cancel_requested)
SELECT {id}, 'demo.tasks.add', CASE WHEN i %% 4 = 0 THEN 'emails' ELSE 'default' END, 0, 'READY',
    '[1, 2]', '{{}}', enq, enq, 0, 3, '', 0, false
FROM (SELECT i, now() - interval '10 minutes' * (i::float8 / %(n)s) AS enq
      FROM generate_series(1, %(n)s) AS i) AS rows
""".format(id=UUID7_SQL.format(ts="enq", seed="'r' || i::text"))

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


def fill(finished: int, ready: int) -> None:
    from django.db import connection

    steps = [
        (f"{finished:,} finished tasks", FILL_FINISHED, {"n": finished}),
        (f"{ready:,} ready tasks", FILL_READY, {"n": ready}),
        ("40 running tasks", FILL_RUNNING, {}),
        ("attempt rows for the failed", FILL_ATTEMPTS, None),
        ("8 workers", FILL_WORKERS, {}),
    ]
    with connection.cursor() as cursor:
        for label, sql, params in steps:
            start = time.perf_counter()
            cursor.execute(sql, params)
            print(f"  inserted {label} in {time.perf_counter() - start:.1f} s", flush=True)
        start = time.perf_counter()
        # Statistics for the planner, and the visibility map that lets counts be index-only.
        cursor.execute("VACUUM (ANALYZE) ox_task")
        cursor.execute("VACUUM (ANALYZE) ox_attempt")
        print(f"  vacuum analyze in {time.perf_counter() - start:.1f} s", flush=True)


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
        ("benchmarks page", "/benchmarks/", {}, False),
        ("tasks queue=<no such queue>", "/tasks/", {"queue": "nope"}, True),
        ("/ox/metrics", "/ox/metrics", {}, False),
        ("admin task list", "/admin/ox/task/", {}, False),
        ("admin search <no such path>", "/admin/ox/task/", {"q": "zzz"}, False),
        ("admin search app.send_invoice", "/admin/ox/task/", {"q": "app.send_invoice"}, False),
        ("admin queue=reports", "/admin/ox/task/", {"queue": "reports"}, False),
        ("admin status=FAILED", "/admin/ox/task/", {"status__exact": "FAILED"}, False),
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
            fill(args.finished, args.ready)
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
