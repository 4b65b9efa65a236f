"""What the oban and celery jobs share: the dispatch cell with an arm's own enqueue (neither is a
Django Tasks backend, so bench.jobs.dispatch's `stamp.enqueue(key)` does not reach them)."""

import random
import time
from collections.abc import Callable
from typing import Any

from django.db import connection

from bench import jobs, procs
from bench.arms.base import Arm
from bench.fleet import Fleet, wait
from bench.tasks import LEDGER_TABLE

Params = dict[str, Any]
Result = dict[str, Any]


def dispatch_with(arm: Arm, p: Params, enqueue: Callable[[int], None], info: dict[str, Any]) -> Result:
    """bench.jobs.dispatch with the arm's enqueue: an idle worker (one process, concurrency 1);
    `enqueue(key)` returns once the job is durable where the arm keeps it; then until the task's
    first line reads the clock (its ledger row). A random pause of 0..gap seconds between samples;
    the idle worker's CPU over a few seconds of an empty queue first, and its resident memory at
    their end."""
    jobs._reset(arm)
    fleet = Fleet(arm, p)
    samples: list[float] = []
    timeouts = 0
    rng = random.Random(p.get("seed", 0))  # noqa: S311
    try:
        fleet.start_all(1, 1)
        cpu0, _ = procs.measure(fleet.procs)
        time.sleep(p.get("idle_s", 3.0))
        cpu1, _ = procs.measure(fleet.procs)
        idle_pct = (cpu1 - cpu0) * 100 / p.get("idle_s", 3.0)
        # Its resident memory then, before any sample: the worker and its descendants (celery's
        # main process and its pool process).
        idle_rss_mb = procs.rss_kb(fleet.procs) / 1024
        for key in range(p["n"]):
            time.sleep(rng.uniform(0, p["gap"]))
            enqueue(key)
            committed = time.time()
            seen: list[float] = []

            def started(key: int = key, seen: list[float] = seen) -> bool:
                with connection.cursor() as cursor:
                    cursor.execute(f"SELECT t FROM {LEDGER_TABLE} WHERE task_key = %s", [key])  # noqa: S608
                    row = cursor.fetchone()
                if row:
                    seen.append(row[0])
                return bool(row)

            if wait(started, p.get("timeout", 10.0), 0.005, fleet):
                samples.append((seen[0] - committed) * 1000)
            else:
                timeouts += 1
        # What one idle worker holds in memory once it has run tasks (the drains' peak_rss is under load).
        _, hwm_kb = procs.measure(fleet.procs)
    finally:
        fleet.stop()
    out = {**fleet.info(), "n": p["n"], "timeouts": timeouts, "gap_s": p["gap"], "peak_rss_mb": hwm_kb / 1024, **info}
    return {"latency_ms": samples, "idle_cpu_pct": idle_pct, "idle_rss_mb": idle_rss_mb, "info": out}
