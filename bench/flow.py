"""ox's flow control against itself, in one agent (ox only: the peers have no such limits or
unique tasks). Variants of one measurement run in rounds, their order rotating per round, so
a figure and the one it is compared with share the machine's state of the moment:

- compare_drain (the drain job with `variants`): per variant, workers with that variant's
  shape and limits (BENCH_OX_LIMITS, read by bench.settings_ox) boot on an empty queue and go
  idle; a backlog of N tasks (no-op, or the keyed no-op spread over `keys` limit keys) is
  committed in one transaction and drained. Throughput as in the drain job (the rows' own
  timestamps). The rows also tell the most tasks ever running at once, overall and per key:
  the limits held, or the figure is void.
- compare_enqueue (the enqueue_seq job with `variants`): N sequential enqueues in autocommit
  of the keyed no-op, plain vs unique (distinct arguments, so each inserts), and then the same
  N again (every key held: each a duplicate answered with the holder's result).

Ratios are per round (a variant over its reference in the same round); the cell's figure is
their median, and every round's sample is kept.
"""

import json
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction

from bench import procs
from bench.arms.base import Arm
from bench.fleet import Fleet, wait
from bench.tasks import LEDGER_TABLE, keyed, noop

Params = dict[str, Any]
Result = dict[str, Any]


def rotated(names: list[str], round_no: int) -> list[str]:
    """The variants' order in round `round_no`: shifted by one each round."""
    shift = round_no % len(names)
    return names[shift:] + names[:shift]


def max_overlap(spans: list[tuple[float, float, str | None]]) -> tuple[int, int]:
    """Most tasks running at once (start..finish in the rows), overall and within one key."""
    events: list[tuple[float, int, str | None]] = []
    for start, end, key in spans:
        events += [(start, 1, key), (end, -1, key)]
    events.sort(key=lambda e: (e[0], e[1]))  # a finish before a start at the same instant
    now = best = best_key = 0
    per_key: Counter[str | None] = Counter()
    for _t, step, key in events:
        now += step
        best = max(best, now)
        if key is not None:
            per_key[key] += step
            best_key = max(best_key, per_key[key])
    return best, best_key


def _fill(p: Params) -> Callable[[], None]:
    """The backlog, written through ox's own bulk path (ox.enqueue_many)."""
    import ox

    n, keys = p["n"], p.get("keys")
    if not keys:
        return lambda: ox.enqueue_many(noop, [((), {})] * n)
    limited = replace(keyed, limit_by=("account",))  # @task(limit_by="account")
    calls = [((), {"account": f"acct-{i % keys}"}) for i in range(n)]  # keys round-robin
    return lambda: ox.enqueue_many(limited, calls)


def _spans() -> list[tuple[float, float, str | None]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT started_at, finished_at, limit_key FROM ox_task WHERE status = 'SUCCESSFUL'")
        return [(s.timestamp(), f.timestamp(), k) for s, f, k in cursor.fetchall()]


def drain_once(arm: Arm, p: Params, v: Params) -> Result:
    """One drain of variant v ({"name", "processes", "concurrency", "limits"})."""
    arm.reset([LEDGER_TABLE, "ox_key_rate"])
    n = p["n"]
    env = {**p.get("worker_env", {}), "BENCH_OX_LIMITS": json.dumps(v.get("limits") or {})}
    fleet = Fleet(arm, {**p, "worker_env": env})
    fill = _fill(p)
    try:
        fleet.start_all(v["processes"], v["concurrency"])
        cpu0, _ = procs.measure(fleet.procs)
        filled = time.monotonic()
        with transaction.atomic():
            fill()
            arm.analyze()
            committed_at = datetime.now(UTC)
        committed = time.monotonic()
        finished = wait(lambda: arm.done() >= n, p.get("timeout", 300.0), 0.2, fleet)
        wall = time.monotonic() - committed
        cpu1, _ = procs.measure(fleet.procs)
    finally:
        fleet.stop()
    info: dict[str, Any] = {**fleet.info(), "variant": v, "fill_s": committed - filled, "wall_s": wall}
    out: Result = {"info": info}
    first, last = arm.span()
    if not finished or not first or not last:
        info["notes"].append(f"DNF: {arm.done()} of {n} done in {wall:.0f} s")
        return out
    span = (last - max(first, committed_at)).total_seconds()
    running, per_key = max_overlap(_spans())
    info.update(span_s=span, max_running=running, max_running_per_key=per_key)
    limits = (v.get("limits") or {}).get("default", {})
    if limits.get("concurrency") and running > limits["concurrency"]:
        info["notes"].append(f"limit broken: {running} running at once, concurrency {limits['concurrency']}")
    if limits.get("key_concurrency") and per_key > limits["key_concurrency"]:
        info["notes"].append(f"limit broken: {per_key} of one key at once, key_concurrency {limits['key_concurrency']}")
    out.update(throughput=n / span, wall_throughput=n / wall, cpu_ms_per_task=(cpu1 - cpu0) * 1000 / n)
    counts = fleet.sql_counts()
    if counts is not None:
        out["statements_per_task"] = sum(counts.values()) / n
        info["sql_counts"] = counts
    return out


def _ratios(samples: dict[str, list[float | None]], pairs: dict[str, list[str]], rounds: int) -> dict[str, list]:
    """Per round, each pair's numerator variant over its denominator variant."""
    out: dict[str, list[float]] = {}
    for name, (num, den) in pairs.items():
        values = []
        for r in range(rounds):
            a, b = samples[num][r], samples[den][r]
            if a is not None and b:
                values.append(a / b)
        out[name] = values
    return out


def _spread(values: list[float]) -> dict[str, float] | None:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None


def compare_drain(arm: Arm, p: Params) -> Result:
    if arm.name != "ox":
        raise RuntimeError("the flow-control cells measure ox's limits")
    variants = {v["name"]: v for v in p["variants"]}
    metrics = ("throughput", "cpu_ms_per_task", "statements_per_task")
    samples: dict[str, dict[str, list[float | None]]] = {m: {name: [] for name in variants} for m in metrics}
    rounds_log: list[dict[str, Any]] = []
    notes: list[str] = []
    for r in range(p["rounds"]):
        for name in rotated(list(variants), r):
            res = drain_once(arm, p, variants[name])
            for m in metrics:
                samples[m][name].append(res.get(m))
            notes += [f"round {r} {name}: {note}" for note in res["info"].get("notes", [])]
            rounds_log.append({"round": r, "variant": name, **{m: res.get(m) for m in metrics}, "info": res["info"]})
    ratios = _ratios(samples["throughput"], p["ratios"], p["rounds"])
    result: Result = {f"{m}_{name}": [x for x in samples[m][name] if x is not None] for m in metrics for name in variants}
    result.update({f"ratio_{name}": values for name, values in ratios.items()})
    result["info"] = {
        "n": p["n"],
        "keys": p.get("keys"),
        "rounds": rounds_log,
        "variants": list(variants.values()),
        "order": "variants rotate per round",
        "spread": {
            **{f"throughput_{name}": _spread([x for x in v if x is not None]) for name, v in samples["throughput"].items()},
            **{f"ratio_{name}": _spread(values) for name, values in ratios.items()},
        },
        "notes": notes,
    }
    return result


# ------------------------------------------------------------------ unique enqueue
def _enqueue_n(task: Any, n: int) -> float:
    """n sequential enqueues (autocommit) of distinct arguments; tasks/s."""
    started = time.perf_counter()
    for i in range(n):
        task.enqueue(account=f"acct-{i}")
    return n / (time.perf_counter() - started)


def compare_enqueue(arm: Arm, p: Params) -> Result:
    """Per round, on an emptied table each: n plain enqueues; n unique ones (each inserts) and
    then the same n again (each a duplicate). The two steps' order alternates per round."""
    if arm.name != "ox":
        raise RuntimeError("the unique-enqueue cell measures ox's unique tasks")
    import ox
    from ox.models import Task as TaskRow

    n = p["n"]
    unique = replace(keyed, unique=True)  # @task(unique=True): the key hashes the arguments
    samples: dict[str, list[float]] = {"plain": [], "unique": [], "duplicate": []}
    notes: list[str] = []
    for r in range(p["rounds"]):
        for step in rotated(["plain", "unique"], r):
            arm.reset([LEDGER_TABLE])
            if step == "plain":
                samples["plain"].append(_enqueue_n(keyed, n))
                continue
            samples["unique"].append(_enqueue_n(unique, n))
            samples["duplicate"].append(_enqueue_n(unique, n))
            rows = TaskRow.objects.count()
            if rows != n or not ox.is_duplicate(unique.enqueue(account="acct-0")):
                notes.append(f"round {r}: {rows} rows after {n} unique + {n} duplicate enqueues (want {n})")
    rounds = p["rounds"]
    ratio_unique = [samples["unique"][r] / samples["plain"][r] for r in range(rounds)]
    ratio_dup = [samples["duplicate"][r] / samples["plain"][r] for r in range(rounds)]
    return {
        "throughput_plain": samples["plain"],
        "throughput_unique": samples["unique"],
        "throughput_duplicate": samples["duplicate"],
        "ratio_unique_plain": ratio_unique,
        "ratio_duplicate_plain": ratio_dup,
        "info": {
            "n": n,
            "rounds": rounds,
            "order": "plain first in even rounds, unique (then duplicate) first in odd ones",
            "spread": {k: _spread(v) for k, v in {**samples, "unique/plain": ratio_unique}.items()},
            "notes": notes,
        },
    }
