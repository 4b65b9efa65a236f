"""The jobs of issue #10 ("cost flat with the backlog"), run inside an agent like bench.jobs:

- backlog: drain the first N no-op tasks out of a READY backlog of `total` (N <= total), so
  the cost of a claim with a big table behind it shows; optionally with database-side figures
  (bench.pgstats) for the processes-scaling cells.
- notify: ox enqueue throughput from P producer processes with the NOTIFY trigger on and off,
  one idle ox worker LISTENing the whole time.
"""

import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from bench import pgstats, procs
from bench.arms.base import Arm
from bench.fleet import Fleet
from bench.producers import Crowd
from bench.tasks import LEDGER_TABLE, noop

Params = dict[str, Any]
Result = dict[str, Any]
TRIGGER = "ox_task_notify"


def wait_done(arm: Arm, n: int, cap: float, fleet: Fleet) -> tuple[bool, int]:
    """Wait until n tasks are done, at most `cap` seconds. Polls sparsely (counting done rows
    of a million-row table is not free for an arm without an index on its status): the next
    look is half the time the current rate says is left, between 0.2 and 2 s."""
    start = time.monotonic()
    deadline = start + cap
    done = 0
    while True:
        done = arm.done()
        now = time.monotonic()
        if done >= n or now >= deadline:
            return done >= n, done
        if not fleet.alive():
            raise RuntimeError("every worker exited: " + procs.tail(fleet.procs[-1].log))
        rate = done / (now - start) if done else 0.0
        pause = (n - done) / rate / 2 if rate else 0.5
        time.sleep(min(max(pause, 0.2), 2.0, max(deadline - now, 0.01)))


def backlog(arm: Arm, p: Params) -> Result:
    """Workers boot on an empty queue and go idle; a backlog of `total` no-op tasks is written
    in one transaction (bench.arms.base.Arm.fill_fast; not timed) and ANALYZEd inside it; the
    workers drain it until N are done or `cap` seconds pass. Throughput is N over the first
    start to the N-th earliest finish in the task rows (the workers' own timestamps); when the
    cap ends it first, it is what finished over the first start to the last finish, marked
    bounded. CPU and statement figures as in the drain job, over the tasks done by then."""
    arm.reset([LEDGER_TABLE])
    n, total, cap = p["n"], p["total"], p.get("cap", 600.0)
    stats_wanted = p.get("db_stats") and connection.vendor == "postgresql"
    fleet = Fleet(arm, p)
    sampler: pgstats.Sampler | None = None
    # SQLite: the workers start after the fill and a checkpoint that empties the WAL. A 1M-row
    # fill in one transaction leaves ~0.5 GB of WAL, and until a checkpoint has copied it back
    # every page a reader needs is looked up in the WAL's index first (measured: the drain ran
    # at 0.71x of the 10k cell with the workers up during the fill, 1.05x started after the
    # checkpoint); a backlog that grows over hours is checkpointed as it grows. The
    # throughput's clock starts at the first task start.
    sqlite = connection.vendor == "sqlite"
    try:
        if not sqlite:
            fleet.start_all(p["processes"], p["concurrency"])
        filled = time.monotonic()
        with transaction.atomic():
            arm.fill_fast(noop, total)
            arm.analyze()
            # Taken before COMMIT: on SQLite the committing call also checkpoints the WAL
            # (seconds for a 1M-row backlog), while workers already see and drain the rows.
            committed_at = datetime.now(UTC)
        fill_s = time.monotonic() - filled
        if sqlite:
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                info_checkpoint = cursor.fetchone()
            fleet.start_all(p["processes"], p["concurrency"], work_waiting=True)
        cpu0, _ = procs.measure(fleet.procs)
        committed = time.monotonic()
        if stats_wanted:
            pgstats.wait_for_flush(connection)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                agent_pid = cursor.fetchone()[0]
            sampler = pgstats.Sampler(os.environ["BENCH_DB_URL"], connection.settings_dict["NAME"], {agent_pid})
            sampler.start()
        finished, done_at_end = wait_done(arm, n, cap, fleet)
        wall = time.monotonic() - committed
        cpu1, hwm_kb = procs.measure(fleet.procs)
        if sampler is not None:
            sampler.stop_sampling()
    finally:
        fleet.stop()
    first, last, spanned = arm.first_n(n)
    info: dict[str, Any] = {**fleet.info(), "n": n, "total": total, "cap_s": cap, "fill_s": fill_s, "wall_s": wall}
    if sqlite:
        info["workers_started"] = "after the fill and PRAGMA wal_checkpoint(TRUNCATE) (busy, log, checkpointed):"
        info["checkpoint"] = list(info_checkpoint)
    info.update(done_at_end=done_at_end, bounded=not finished)
    result: Result = {"info": info}
    if sampler is not None:
        info["db"] = sampler.finish(arm.done())
        figures = info["db"]
        per = figures["per_task"]
        result.update(
            xact_per_task=per.get("xact_commit_per_task"),
            wal_bytes_per_task=per.get("wal_bytes_per_task"),
            wal_records_per_task=per.get("wal_records_per_task"),
            lock_wait_share=figures["waits"]["lock_wait_share"],
            active_backends=figures["waits"]["mean_active"],
        )
        if figures["pg_cpu_s"] is not None and done_at_end:
            result["pg_cpu_ms_per_task"] = sum(figures["pg_cpu_s"].values()) * 1000 / done_at_end
    if not first or not last or not spanned:
        info["notes"].append(f"DNF: nothing finished in {wall:.0f} s")
        return result
    span = (last - max(first, committed_at)).total_seconds()
    result.update(throughput=spanned / span, wall_throughput=done_at_end / wall)
    result["cpu_ms_per_task"] = (cpu1 - cpu0) * 1000 / max(done_at_end, 1)
    result["peak_rss_mb"] = hwm_kb / 1024
    info.update(span_s=span, spanned=spanned)
    if not finished:
        info["notes"].append(
            f"bounded: {done_at_end} of {n} done when the {cap:.0f} s cap ended the cell; throughput is"
            f" the rate of the {spanned} that finished (backlog {total:,})"
        )
    counts = fleet.sql_counts()
    if counts is not None:
        result["statements_per_task"] = sum(counts.values()) / max(done_at_end, 1)
        info["sql_counts"] = counts
    return result


# ------------------------------------------------------------------ notify
def set_trigger(enabled: bool) -> bool:
    """Enable or disable ox's NOTIFY trigger in this (bench) database; returns whether it is
    enabled afterwards, read back from pg_trigger."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE ox_task {'ENABLE' if enabled else 'DISABLE'} TRIGGER {TRIGGER}")
        cursor.execute("SELECT tgenabled FROM pg_trigger WHERE tgname = %s", [TRIGGER])
        row = cursor.fetchone()
    return bool(row) and row[0] != "D"


def listening() -> int:
    """Backends of this database whose last statement was a LISTEN (the idle worker's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%%'"
        )
        return cursor.fetchone()[0]


def round_pattern(rounds: int) -> list[str]:
    """off, on, on, off, ...: each mode as often as the other and as often early as late."""
    return [("off", "on", "on", "off")[i % 4] for i in range(rounds)]


def on_off(samples: dict[str, list[float]]) -> float | None:
    on, off = samples.get("on") or [], samples.get("off") or []
    if not on or not off:
        return None
    return statistics.median(on) / statistics.median(off)


def notify(arm: Arm, p: Params) -> Result:
    """P producer processes (bench.producer) each call noop.enqueue() sequentially in
    autocommit for `seconds`, all starting at once; tasks/s = all calls / (last producer's end
    - start). Rounds alternate the NOTIFY trigger off/on/on/off; the table is truncated before
    each round. One ox worker idles the whole time on another queue ("bench_idle"): it LISTENs
    and wakes on every notification like a real idle worker, but takes none of the tasks, so
    the producers do not compete with task execution. With idle_worker false there is none:
    what NOTIFY costs a commit when nobody listens."""
    if arm.name != "ox":
        raise RuntimeError("the notify cell measures ox's trigger")
    arm.reset([LEDGER_TABLE])
    producers, seconds = p["producers"], p["seconds"]
    fleet = Fleet(arm, {**p, "queue": "bench_idle"})
    samples: dict[str, list[float]] = {"on": [], "off": []}
    rounds: list[dict[str, Any]] = []
    idle_worker = p.get("idle_worker", True)
    crowd: Crowd | None = None
    try:
        if idle_worker:
            fleet.start_all(1, 1)
        env = {**os.environ, **{k: str(v) for k, v in p.get("worker_env", {}).items()}}
        if p.get("notify_mode"):
            # The producers' sessions only (libpq reads PGOPTIONS at connect): ox.notify =
            # always notifies at every enqueue, whether or not a worker waits (migration 0012).
            env["PGOPTIONS"] = f"-c ox.notify={p['notify_mode']}"
        crowd = Crowd(Path(p["log_dir"]) / "producers", env)  # ox's noop.enqueue(), the default hook
        crowd.start(producers)
        for k, mode in enumerate(round_pattern(p.get("rounds", 4))):
            enabled = set_trigger(mode == "on")
            with connection.cursor() as cursor:
                cursor.execute("TRUNCATE ox_task CASCADE")
            listeners = listening()
            idle0, _ = procs.measure(fleet.procs)
            start_at, results = crowd.round(k, seconds)
            idle1, _ = procs.measure(fleet.procs)
            calls = sum(r["count"] for r in results)
            elapsed = max(r["end"] for r in results) - start_at
            rate = calls / elapsed
            samples[mode].append(rate)
            rounds.append(
                {
                    "mode": mode,
                    "trigger_enabled": enabled,
                    "listeners": listeners,
                    "calls": calls,
                    "seconds": elapsed,
                    "tasks_per_s": rate,
                    "idle_worker_cpu_s": idle1 - idle0,
                }
            )
    finally:
        if crowd is not None:
            crowd.release()
        try:
            set_trigger(True)
        finally:
            if crowd is not None:
                crowd.stop()
            fleet.stop()
    notes = list(fleet.notes)
    if any(r["trigger_enabled"] != (r["mode"] == "on") for r in rounds):
        notes.append("the trigger's state did not follow the round's mode")
    if idle_worker and any(r["listeners"] < 1 for r in rounds):
        notes.append("no LISTENing backend seen in some round")
    info = {**fleet.info(), "producers": producers, "seconds": seconds, "rounds": rounds, "notes": notes}
    info["notify_mode"] = p.get("notify_mode") or "default (only when a worker of the queue is marked idle)"
    info["idle_worker"] = (
        "one ox worker, concurrency 1, --queues bench_idle: LISTENs, wakes, takes nothing" if idle_worker else "none"
    )
    return {
        "throughput_on": samples["on"],
        "throughput_off": samples["off"],
        "on_off_ratio": on_off(samples),
        "listeners": [r["listeners"] for r in rounds],
        "info": info,
    }


JOBS: dict[str, Callable[[Arm, Params], Result]] = {"backlog": backlog, "notify": notify}
