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

from django.db import transaction

from bench import procs
from bench.arms.base import Arm
from bench.fleet import Fleet, wait
from bench.launch import timing_file
from bench.tasks import LEDGER_TABLE, WORKLOADS, keyed

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

    n, keys, task = p["n"], p.get("keys"), WORKLOADS[p.get("task", "noop")]
    steps = p.get("chain")
    if steps:  # n tasks as n / steps chains (ox.chain), each step after the one before
        return lambda: [ox.chain(*[task.s() for _ in range(steps)]).enqueue() for _ in range(n // steps)]
    if not keys:
        return lambda: ox.enqueue_many(task, [((), {})] * n)
    limited = replace(keyed, limit_by=("account",))  # @task(limit_by="account")
    calls = [((), {"account": f"acct-{i % keys}"}) for i in range(n)]  # keys round-robin
    return lambda: ox.enqueue_many(limited, calls)


def _spans(arm: Arm) -> list[tuple[float, float, str | None]]:
    rows = arm.model.objects.filter(status=arm.done_status).values_list("started_at", "finished_at", "limit_key")
    return [(s.timestamp(), f.timestamp(), k) for s, f, k in rows]


def drain_once(arm: Arm, p: Params, v: Params) -> Result:
    """One drain of variant v ({"name", "processes", "concurrency", "limits"})."""
    arm.reset([LEDGER_TABLE, "ox_key_rate"])
    n = p["n"]
    env = {**p.get("worker_env", {}), "BENCH_OX_LIMITS": json.dumps(v.get("limits") or {})}
    fleet = Fleet(arm, {**p, "worker_env": env})
    # A variant may run a task of its own, or its tasks as chains of `chain` steps.
    p = {**p, "task": v.get("task", p.get("task", "noop")), "chain": v.get("chain")}
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
    info: dict[str, Any] = {**fleet.info(), "variant": v, "task": p.get("task", "noop"), "n": n, "keys": p.get("keys")}
    info.update(fill_s=committed - filled, wall_s=wall)
    out: Result = {"info": info}
    first, last = arm.span()
    if not finished or not first or not last:
        info["notes"].append(f"DNF: {arm.done()} of {n} done in {wall:.0f} s")
        return out
    span = (last - max(first, committed_at)).total_seconds()
    running, per_key = max_overlap(_spans(arm))
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
    timing = sql_timing(fleet, n)
    if timing:
        info["sql_timing"] = timing
    return out


def sql_timing(fleet: Fleet, n: int, top: int = 12) -> list[dict[str, Any]]:
    """A profiling run's (BENCH_PROFILE_SQL=1) statement times summed over the workers: the
    statements that took longest in all, with calls and ms per call and per task."""
    total: dict[str, list[float]] = {}
    for path in fleet.count_files:
        try:
            found = json.loads(timing_file(path).read_text())
        except (OSError, ValueError):
            continue
        for text, (calls, seconds) in found.items():
            record = total.setdefault(text, [0, 0.0])
            record[0] += calls
            record[1] += seconds
    ranked = sorted(total.items(), key=lambda item: -item[1][1])[:top]
    return [
        {
            "sql": text,
            "calls": int(calls),
            "total_s": round(seconds, 4),
            "ms_per_call": round(seconds * 1000 / calls, 4) if calls else None,
            "ms_per_task": round(seconds * 1000 / n, 4),
        }
        for text, (calls, seconds) in ranked
    ]


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


def spread(values: list[float]) -> dict[str, float] | None:
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
    kept = {m: {name: [x for x in xs if x is not None] for name, xs in samples[m].items()} for m in metrics}
    result: Result = {f"{m}_{name}": kept[m][name] for m in metrics for name in variants}
    result.update({f"ratio_{name}": values for name, values in ratios.items()})
    result["info"] = {
        "n": p["n"],
        "keys": p.get("keys"),
        "rounds": rounds_log,
        "variants": list(variants.values()),
        "order": "variants rotate per round",
        "spread": {
            **{f"throughput_{name}": spread(xs) for name, xs in kept["throughput"].items()},
            **{f"ratio_{name}": spread(values) for name, values in ratios.items()},
        },
        "notes": notes,
    }
    return result


# ------------------------------------------------------------------ unique enqueue
def _timed(task: Any, accounts: list[str]) -> tuple[float, list[Any]]:
    """Sequential enqueues (autocommit), one per account; seconds and the results."""
    started = time.perf_counter()
    results = [task.enqueue(account=account) for account in accounts]
    return time.perf_counter() - started, results


# A duplicate needs its unique call first: that pair keeps its order, plain moves around it.
ORDERS = (("plain", "unique", "duplicate"), ("unique", "plain", "duplicate"), ("unique", "duplicate", "plain"))


def compare_enqueue(arm: Arm, p: Params) -> Result:
    """Per round, on an emptied table: n plain enqueues, n unique ones (distinct arguments:
    each inserts) and the same n unique calls again (each a duplicate), interleaved in chunks
    of `chunk` calls (plain, unique, duplicate; the order rotating per chunk), so the machine's
    noise of the moment falls on all three alike. Per kind: calls over the summed time."""
    if arm.name != "ox":
        raise RuntimeError("the unique-enqueue cell measures ox's unique tasks")
    import ox

    n, chunk = p["n"], p.get("chunk", 100)
    unique = replace(keyed, unique=True)  # @task(unique=True): the key hashes the arguments
    kinds = ["plain", "unique", "duplicate"]
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    notes: list[str] = []
    for r in range(p["rounds"]):
        arm.reset([LEDGER_TABLE])
        spent = dict.fromkeys(kinds, 0.0)
        for c in range(n // chunk):
            accounts = {k: [f"{k[0]}-{c}-{i}" for i in range(chunk)] for k in ("plain", "unique")}
            accounts["duplicate"] = accounts["unique"]
            for kind in ORDERS[(r + c) % 3]:
                seconds, results = _timed(keyed if kind == "plain" else unique, accounts[kind])
                spent[kind] += seconds
                if kind == "duplicate" and not all(ox.is_duplicate(x) for x in results):
                    notes.append(f"round {r} chunk {c}: a repeated unique call was not answered as a duplicate")
        calls = n // chunk * chunk
        for kind in kinds:
            samples[kind].append(calls / spent[kind])
        rows = arm.model.objects.count()
        if rows != 2 * calls:
            notes.append(f"round {r}: {rows} rows after {calls} plain + {calls} unique calls, want {2 * calls}")
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
            "chunk": chunk,
            "rounds": rounds,
            "order": "per round an emptied table; chunks of plain / unique / duplicate calls, order rotating",
            "spread": {
                k: spread(v) for k, v in {**samples, "unique/plain": ratio_unique, "duplicate/plain": ratio_dup}.items()
            },
            "notes": notes,
        },
    }
