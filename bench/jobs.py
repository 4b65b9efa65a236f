"""The measurements, written once against the Arm interface and run inside an agent process
(the arm's settings are loaded). Each job returns plain JSON: metric key -> one sample or a
list of samples, plus "info" (what ran, notes). Every wait is bounded in time."""

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from bench import bare_row, flow, procs
from bench.arms.base import Arm
from bench.fleet import Fleet, wait
from bench.tasks import LEDGER_TABLE, WORKLOADS, ledger, noop, stamp

REPO = Path(__file__).resolve().parent.parent
Params = dict[str, Any]
Result = dict[str, Any]


# ------------------------------------------------------------------ helpers
def _ledger_ddl() -> str:
    # task_key, not key: KEY is a reserved word on MariaDB.
    if connection.vendor == "postgresql":
        columns = "id bigserial PRIMARY KEY, task_key integer, pid integer, t double precision"
    elif connection.vendor == "mysql":
        columns = "id bigint AUTO_INCREMENT PRIMARY KEY, task_key integer, pid integer, t double"
    else:
        columns = "id integer PRIMARY KEY AUTOINCREMENT, task_key integer, pid integer, t real"
    return f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} ({columns})"


def _reset(arm: Arm) -> None:
    arm.reset([LEDGER_TABLE])


def _ledger(since_id: int = 0) -> list[tuple[int, int, int, float]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, task_key, pid, t FROM {LEDGER_TABLE} WHERE id > %s ORDER BY id", [since_id])
        return list(cursor.fetchall())


# ------------------------------------------------------------------ jobs
def setup(arm: Arm, p: Params) -> Result:
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    with connection.cursor() as cursor:
        cursor.execute(_ledger_ddl())
    return describe(arm, p)


def describe(arm: Arm, p: Params) -> Result:
    """What this arm runs with: its options, and the database as this process sees it."""
    info: dict[str, Any] = {"options": arm.options(), "vendor": connection.vendor}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT version()")
            info["server_version"] = cursor.fetchone()[0]
        elif connection.vendor == "mysql":
            cursor.execute("SELECT version()")
            info["server_version"] = "MariaDB " + cursor.fetchone()[0]
        else:
            cursor.execute("SELECT sqlite_version()")
            info["server_version"] = "SQLite " + cursor.fetchone()[0]
    return {"info": info}


def enqueue_seq(arm: Arm, p: Params) -> Result:
    """N sequential task.enqueue() calls, each its own autocommit transaction. With
    `variants`: ox's plain against unique enqueues in rounds (bench.flow.compare_enqueue); with
    `bare_row`: ox's against its own INSERT run on bare psycopg (bench.bare_row.compare)."""
    if p.get("variants"):
        return flow.compare_enqueue(arm, p)
    if p.get("bare_row"):
        return bare_row.compare(arm, p)
    _reset(arm)
    n = p["n"]
    started = time.perf_counter()
    for _ in range(n):
        noop.enqueue()
    elapsed = time.perf_counter() - started
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed}}


def enqueue_atomic(arm: Arm, p: Params) -> Result:
    """Latency of `with atomic(): task.enqueue()`, commit included: what a view pays."""
    _reset(arm)
    samples = []
    for _ in range(p["n"]):
        started = time.perf_counter()
        with transaction.atomic():
            noop.enqueue()
        samples.append((time.perf_counter() - started) * 1000)
    return {"latency_ms": samples, "info": {"n": p["n"]}}


def bulk(arm: Arm, p: Params) -> Result:
    _reset(arm)
    n = p["n"]
    calls = [((), {})] * n
    started = time.perf_counter()
    arm.bulk_enqueue(noop, calls)
    elapsed = time.perf_counter() - started
    if arm.done() != 0 or arm.model.objects.count() != n:
        raise RuntimeError("bulk enqueue did not write the expected rows")
    return {"throughput": n / elapsed, "info": {"n": n, "seconds": elapsed, "path": arm.bulk_path}}


def drain(arm: Arm, p: Params) -> Result:
    """Workers boot on an empty queue and go idle; then a backlog of N tasks is committed in
    one transaction and drained. Throughput spans the first start to the last finish written
    in the task rows (boot and the first idle poll excluded); CPU is the workers' utime+stime
    from the commit to the end, over N; peak RSS is the summed VmHWM of the worker processes.
    With `variants`: ox with and without limits in rounds (bench.flow.compare_drain)."""
    if p.get("variants"):
        return flow.compare_drain(arm, p)
    _reset(arm)
    n, task = p["n"], WORKLOADS[p.get("task", "noop")]
    fleet = Fleet(arm, p)
    try:
        fleet.start_all(p["processes"], p["concurrency"])
        cpu0, _ = procs.measure(fleet.procs)
        with transaction.atomic():
            arm.fill(task, [((), {})] * n)
            arm.analyze()
            # Taken before COMMIT: on SQLite the committing call also checkpoints the WAL
            # (seconds for a 1M-row backlog), while workers already see and drain the rows.
            committed_at = datetime.now(UTC)
        committed = time.monotonic()
        finished = wait(lambda: arm.done() >= n, p.get("timeout", 600), 0.2, fleet)
        wall = time.monotonic() - committed
        cpu1, hwm_kb = procs.measure(fleet.procs)
        rss_each = [proc.hwm_kb / 1024 for proc in fleet.procs]
    finally:
        fleet.stop()
    done = arm.done()
    first, last = arm.span()
    result: Result = {"info": {**fleet.info(), "n": n, "task": p.get("task", "noop"), "done": done}}
    if not finished:
        result["info"]["notes"].append(f"DNF: {done} of {n} done in {wall:.0f} s")
        return result
    # A worker may stamp started_at before its claim waits out the backlog's commit (SQLite's
    # write lock): no task can start before the commit, so the span starts there at the earliest.
    span = (last - max(first, committed_at)).total_seconds() if first and last else wall
    result.update(
        throughput=n / span,
        wall_throughput=n / wall,
        cpu_ms_per_task=(cpu1 - cpu0) * 1000 / n,
        peak_rss_mb=hwm_kb / 1024,
    )
    result["info"].update(span_s=span, wall_s=wall, rss_mb_each=rss_each)
    counts = fleet.sql_counts()
    if counts is not None:
        # Counted over the workers' whole life (boot, idle polls and shutdown included).
        result["statements_per_task"] = sum(counts.values()) / n
        result["info"]["sql_counts"] = counts
    return result


def dispatch(arm: Arm, p: Params) -> Result:
    """An idle worker (one process, concurrency 1): enqueue one task, commit, and measure
    until the task's first line reads the clock. Between samples a random pause of
    0..gap seconds, so samples land at random points of the worker's poll cycle. First, the idle
    worker's CPU over `idle_s` seconds of an empty queue and its resident memory at their end."""
    _reset(arm)
    fleet = Fleet(arm, p)
    samples: list[float] = []
    timeouts = 0
    rng = random.Random(p.get("seed", 0))  # noqa: S311
    try:
        fleet.start_all(1, 1)
        # What an idle worker costs: its CPU over a few seconds of an empty queue.
        cpu0, _ = procs.measure(fleet.procs)
        time.sleep(p.get("idle_s", 3.0))
        cpu1, _ = procs.measure(fleet.procs)
        idle_pct = (cpu1 - cpu0) * 100 / p.get("idle_s", 3.0)
        # And what it holds in memory then, before any sample: the worker and its descendants
        # (dj-queue's supervisor with the worker and dispatcher it forks).
        idle_rss_mb = procs.rss_kb(fleet.procs) / 1024
        for key in range(p["n"]):
            time.sleep(rng.uniform(0, p["gap"]))
            with transaction.atomic():
                stamp.enqueue(key)
            committed = time.time()
            seen: list[float] = []

            def started(key: int = key, seen: list[float] = seen) -> bool:
                with connection.cursor() as cursor:
                    cursor.execute(f"SELECT t FROM {LEDGER_TABLE} WHERE task_key = %s", [key])
                    row = cursor.fetchone()
                if row:
                    seen.append(row[0])
                return bool(row)

            if wait(started, p.get("timeout", 10.0), 0.005, fleet):
                samples.append((seen[0] - committed) * 1000)
            else:
                timeouts += 1
    finally:
        fleet.stop()
    info = {**fleet.info(), "n": p["n"], "timeouts": timeouts, "gap_s": p["gap"]}
    return {"latency_ms": samples, "idle_cpu_pct": idle_pct, "idle_rss_mb": idle_rss_mb, "info": info}


def kill(arm: Arm, p: Params) -> Result:
    """SIGKILL a random worker every `every` seconds while W workers drain N ledger tasks,
    starting a replacement each time. Kills begin once the workers are working, only hit
    workers up for at least `boot_grace` seconds (killing a booting process tests nothing),
    and wait up to `aim` seconds for the victim to hold a RUNNING task before striking.

    For each task held (RUNNING) by a killed worker: rescue time = kill -> the row is no
    longer RUNNING under the dead worker (polled every 0.25 s); reclaim time = kill -> its
    next execution start in the ledger (this includes waiting behind the rest of the backlog
    when the system requeues at the back). A held task never taken back is "not rescued".
    After the last kill, wait until every task is final, or no task has finished for
    `stall` seconds, or `cap` seconds have passed: a slow arm still gets to finish."""
    _reset(arm)
    n, workers, grace = p["n"], p["workers"], p.get("boot_grace", 3.0)
    fleet = Fleet(arm, p)
    rng = random.Random(p.get("seed", 1))  # noqa: S311
    kills: list[dict[str, Any]] = []
    terminal = set(arm.terminal_statuses)
    born: dict[int, float] = {}

    def finished() -> int:
        return sum(v for k, v in arm.counts().items() if k in terminal)

    def booted() -> list[procs.Proc]:
        return [x for x in fleet.alive() if time.monotonic() - born[x.pid] >= grace]

    def track() -> None:
        """Note the moment each held task of a dead worker stops being RUNNING under it."""
        for k in kills:
            pending = [key for key in k["held"] if key not in k["rescued"]]
            if pending:
                still = set(arm.running_on(k["ident"], k["pid"]))
                for key in pending:
                    if key not in still:
                        k["rescued"][key] = time.time() - k["t"]

    def sleep_tracking(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            track()
            time.sleep(min(0.25, max(deadline - time.monotonic(), 0)))

    try:
        fleet.start_all(workers, 1)
        for proc in fleet.procs:
            born[proc.pid] = time.monotonic() - grace
        with transaction.atomic():
            arm.fill(ledger, [((key,), {"sleep_ms": p.get("sleep_ms", 10)}) for key in range(n)])
            arm.analyze()
        started = time.monotonic()
        wait(lambda: finished() > 0, 30, 0.05, fleet)
        for _ in range(p["kills"]):
            sleep_tracking(p["every"])
            if finished() >= n:
                break
            wait(lambda: bool(booted()), 30, 0.1)
            victim = rng.choice(booted())
            ident = fleet.idents[victim.pid]
            # Aim the kill at a moment the victim holds a task: that is the case under test.
            wait(lambda v=victim, i=ident: bool(arm.running_on(i, v.pid)), p.get("aim", 2.0), 0.02)
            t_kill = time.time()
            procs.kill(victim)
            held = arm.running_on(ident, victim.pid)
            kills.append({"t": t_kill, "pid": victim.pid, "ident": ident, "held": held, "rescued": {}})
            born[fleet.start(1).pid] = time.monotonic()
        last_kill = time.monotonic()
        progress = {"done": finished(), "at": time.monotonic()}

        def settled() -> bool:
            track()
            done = finished()
            if done != progress["done"]:
                progress.update(done=done, at=time.monotonic())
            return done >= n or time.monotonic() - progress["at"] >= p["stall"]

        wait(settled, p["cap"], 0.25)
        waited_after = time.monotonic() - last_kill
        total = time.monotonic() - started
    finally:
        fleet.stop()

    counts = arm.counts()
    runs: dict[int, list[float]] = {}
    for _id, key, _pid, t in _ledger():
        runs.setdefault(key, []).append(t)
    rescue_s: list[float] = []
    reclaim_s: list[float] = []
    for k in kills:
        for key in k["held"]:
            later = [t for t in runs.get(key, []) if t > k["t"]]
            if later:
                reclaim_s.append(min(later) - k["t"])
            if key in k["rescued"]:
                # Polled every 0.25 s: an upper bound, which a re-execution start tightens.
                rescue_s.append(min([k["rescued"][key], *(t - k["t"] for t in later[:1])]))
    held = sum(len(k["held"]) for k in kills)
    notes = []
    if held > len(rescue_s):
        notes.append(
            f"{held - len(rescue_s)} of {held} tasks held by killed workers not rescued within"
            f" {waited_after:.0f} s of the last kill ({total:.0f} s of the first)"
        )
    done = counts.get(arm.done_status, 0)
    final = sum(v for s, v in counts.items() if s in terminal)
    return {
        "finished": done,
        "stuck": n - final,
        "failed": final - done,
        "run_twice": sum(1 for times in runs.values() if len(times) > 1),
        "never_ran": n - len(runs),
        "held_at_kill": held,
        "not_rescued": held - len(rescue_s),
        "rescue_s": rescue_s,
        "reclaim_s": reclaim_s,
        "info": {
            **fleet.info(),
            "n": n,
            "kills": len(kills),
            "statuses": counts,
            "cap_s": p["cap"],
            "stall_s": p["stall"],
            "waited_after_last_kill_s": waited_after,
            "total_s": total,
            "notes": fleet.notes + notes,
            "kill_log": [{**k, "rescued": {str(key): s for key, s in k["rescued"].items()}} for k in kills],
        },
    }


JOBS: dict[str, Callable[[Arm, Params], Result]] = {
    "setup": setup,
    "describe": describe,
    "enqueue_seq": enqueue_seq,
    "enqueue_atomic": enqueue_atomic,
    "bulk": bulk,
    "drain": drain,
    "dispatch": dispatch,
    "kill": kill,
}
