"""The limit arm's own jobs (bench.arms.limit.LimitArm.job_overrides), run in its agent like
bench.jobs: its schema, and the sequential enqueue as bare psycopg INSERTs. The drain cells run
the shared bench.jobs.drain unchanged."""

import os
import time
from typing import Any

from django.db import connection

from bench import jobs
from bench.arms.limit import LimitArm
from bench.limit_sql import INSERT, PAYLOAD, create_schema

Params = dict[str, Any]
Result = dict[str, Any]


def setup(arm: LimitArm, p: Params) -> Result:
    """The limit's table and index (bench.limit_sql.DDL), then the ledger table every arm has."""
    with connection.cursor() as cursor:
        create_schema(cursor)
        cursor.execute(jobs._ledger_ddl())
    return jobs.describe(arm, p)


def enqueue_seq(arm: LimitArm, p: Params) -> Result:
    """N INSERTs of a minimal task row, each its own autocommit transaction (one round trip, one
    durable commit), on one psycopg connection opened before the clock starts: the fastest a
    sequential durable enqueue can be on this server. psycopg prepares the statement on the
    server once it has run 5 times (prepare_threshold, its default), as it would for any
    application that keeps its connection."""
    import psycopg

    jobs._reset(arm)
    n = p["n"]
    with psycopg.connect(os.environ["BENCH_DB_URL"], autocommit=True) as conn:
        started = time.perf_counter()
        for _ in range(n):
            conn.execute(INSERT, (PAYLOAD,))
        elapsed = time.perf_counter() - started
    written = arm.counts().get("ready", 0)
    if written != n:
        raise RuntimeError(f"{written} ready rows after {n} enqueues")
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed, "path": INSERT}}
