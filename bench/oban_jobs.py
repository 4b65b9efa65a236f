"""The oban arm's jobs (bench.arms.oban.ObanArm.job_overrides), run in its agent like bench.jobs.
Where oban differs from a Django backend they have their own code: the schema is installed with
`oban install`, and enqueues are oban's async `Worker.enqueue()` on an event loop of the agent's,
over a psycopg pool of their own (what an asyncio web process using oban does). The drain and kill
cells run the shared jobs unchanged, through the arm's fill / counts / running_on."""

import os
import subprocess
import sys
import time
from typing import Any

from django.db import connection

from bench import jobs
from bench.arms.oban import ObanArm, run_client
from bench.fleet import REPO
from bench.peer_jobs import dispatch_with

Params = dict[str, Any]
Result = dict[str, Any]


def setup(arm: ObanArm, p: Params) -> Result:
    """oban's schema by its documented install (`oban install --dsn ...`, prefix public), then the
    ledger table every arm has."""
    out = subprocess.run(  # noqa: S603  (our interpreter, oban's CLI module)
        [sys.executable, "-m", "oban", "install", "--dsn", os.environ["BENCH_DB_URL"]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"oban install failed ({out.returncode}): {out.stderr.strip()}")
    with connection.cursor() as cursor:
        cursor.execute(jobs._ledger_ddl())
    result = jobs.describe(arm, p)
    result["info"]["install"] = out.stderr.strip()[-2000:]
    return result


def enqueue_seq(arm: ObanArm, p: Params) -> Result:
    """N sequential `await Noop.enqueue()` calls on one event loop (each an INSERT in its own
    transaction on the client pool's one connection); the pool opens before the clock starts."""
    from bench.oban_workers import Noop

    jobs._reset(arm)
    n = p["n"]

    async def work(oban: Any) -> float:
        started = time.perf_counter()
        for _ in range(n):
            await Noop.enqueue()
        return time.perf_counter() - started

    elapsed = run_client(work)
    written = arm.counts().get("available", 0)
    if written != n:
        raise RuntimeError(f"{written} available jobs after {n} enqueues")
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed, "path": "await Worker.enqueue()"}}


def dispatch(arm: ObanArm, p: Params) -> Result:
    """The dispatch cell with `await Stamp.enqueue({"key": key})` (committed when it returns), on
    one client kept open across the samples."""
    import asyncio
    import threading

    from oban import Oban
    from psycopg_pool import AsyncConnectionPool

    from bench.oban_workers import Stamp

    # One loop in a thread of its own keeps the client's pool open between samples, while the
    # shared dispatch loop stays synchronous.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def open_client() -> AsyncConnectionPool:
        pool = AsyncConnectionPool(os.environ["BENCH_DB_URL"], min_size=1, max_size=1, open=False)
        await pool.open()
        Oban(pool=pool)
        return pool

    pool = asyncio.run_coroutine_threadsafe(open_client(), loop).result(30)

    def enqueue(key: int) -> None:
        asyncio.run_coroutine_threadsafe(Stamp.enqueue({"key": key}), loop).result(30)

    try:
        return dispatch_with(arm, p, enqueue, {"path": "await Stamp.enqueue({'key': k})"})
    finally:
        asyncio.run_coroutine_threadsafe(pool.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def enqueue_atomic(arm: ObanArm, p: Params) -> Result:
    """The enqueue_atomic cell, oban's way: `async with conn.transaction(): await
    Noop.enqueue(conn=conn)` on the caller's own async psycopg connection (autocommit, as Django's
    is outside atomic()), so the job commits with the caller's transaction (BEGIN, oban's INSERT,
    COMMIT); the connection opens before the clock starts and is kept across the samples."""
    import psycopg

    from bench.oban_workers import Noop

    jobs._reset(arm)
    n = p["n"]

    async def work(oban: Any) -> list[float]:
        samples = []
        conn = await psycopg.AsyncConnection.connect(os.environ["BENCH_DB_URL"], autocommit=True)
        try:
            for _ in range(n):
                started = time.perf_counter()
                async with conn.transaction():
                    await Noop.enqueue(conn=conn)
                samples.append((time.perf_counter() - started) * 1000)
        finally:
            await conn.close()
        return samples

    samples = run_client(work)
    written = arm.counts().get("available", 0)
    if written != n:
        raise RuntimeError(f"{written} available jobs after {n} enqueues")
    path = "async with conn.transaction(): await Noop.enqueue(conn=conn)"
    return {"latency_ms": samples, "info": {"n": n, "path": path}}


def bulk(arm: ObanArm, p: Params) -> Result:
    """The bulk_enqueue cell: `await oban.enqueue_many(jobs)` for N new no-op jobs (the Job objects
    built inside the clock, as a caller does), on the client's pool connection, one transaction;
    open-source oban sends one INSERT per job (bulk inserts are Oban Pro's)."""
    from bench.oban_workers import Noop

    jobs._reset(arm)
    n = p["n"]

    async def work(oban: Any) -> float:
        started = time.perf_counter()
        await oban.enqueue_many([Noop.new({}) for _ in range(n)])
        return time.perf_counter() - started

    elapsed = run_client(work)
    counts = arm.counts()
    if counts != {"available": n}:
        raise RuntimeError(f"bulk enqueue of {n} left {counts}")
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed, "path": arm.bulk_path}}


class ObanCalls:
    """An enqueue_p* producer's enqueue (bench.producer): enqueue_seq's `await Noop.enqueue()` on an
    oban client (no queues) over a pool of one psycopg connection, all of a round's calls awaited
    back to back in one coroutine on the producer's own event loop, as enqueue_seq runs its N."""

    path = "await Worker.enqueue()"

    def __init__(self) -> None:
        import asyncio

        from oban import Oban
        from psycopg_pool import AsyncConnectionPool

        async def open_client() -> AsyncConnectionPool:
            pool = AsyncConnectionPool(os.environ["BENCH_DB_URL"], min_size=1, max_size=1, open=False)
            await pool.open()
            Oban(pool=pool)  # the client Worker.enqueue() finds
            return pool

        self.loop = asyncio.new_event_loop()
        self.pool = self.loop.run_until_complete(open_client())

    def one(self) -> None:
        from bench.oban_workers import Noop

        self.loop.run_until_complete(Noop.enqueue())

    def until(self, end_at: float) -> int:
        from bench.oban_workers import Noop

        async def calls() -> int:
            count = 0
            while time.time() < end_at:
                await Noop.enqueue()
                count += 1
            return count

        return self.loop.run_until_complete(calls())

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.pool.close())
        finally:
            self.loop.close()


def producer() -> ObanCalls:
    return ObanCalls()
