"""Where a limited claim's time goes, outside any worker: `python -m bench.gateprof` with
DJANGO_SETTINGS_MODULE=bench.settings_ox and BENCH_DB_URL naming a scratch database (it is
migrated and its ox tables emptied; never point it at a database a run is using).

On a backlog of N no-op tasks it runs `rounds` claims of ox.flow.gate.claim_limited (a
concurrency limit, `want` tasks a claim, the previous claim's tasks marked SUCCESSFUL in
between, as finished tasks would be), timing every statement the gate sends, then prints
the statements by time per claim and EXPLAIN (ANALYZE, BUFFERS) of the gate's reads. One
process, one connection, no contention: the floor of a gate round trip, not a worker's
figure. Not part of the matrix (bench/run does not run it).
"""

import argparse
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import django

TIMES: dict[str, list[float]] = {}


def _time_statements() -> None:
    from django.db.backends.utils import CursorWrapper

    original = CursorWrapper.execute

    def execute(self: Any, sql: Any, params: Any = None) -> Any:
        started = time.perf_counter()
        try:
            return original(self, sql, params)
        finally:
            record = TIMES.setdefault(" ".join(str(sql).split())[:100], [0, 0.0])
            record[0] += 1
            record[1] += time.perf_counter() - started

    CursorWrapper.execute = execute  # type: ignore[method-assign]


def _explain(cursor: Any, sql: str, params: list[Any]) -> list[str]:
    cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
    return [row[0] for row in cursor.fetchall()]


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.gateprof")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--want", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    import ox
    from bench.arms.ox import OxArm
    from bench.tasks import noop
    from ox.db.postgresql.claim import candidates_sql
    from ox.flow import gate
    from ox.flow.limits import QueueLimits

    call_command("migrate", verbosity=0, interactive=False)
    arm = OxArm()
    arm.reset(["ox_key_rate"])
    ox.enqueue_many(noop, [((), {})] * args.n)
    arm.analyze()
    limits = {"default": QueueLimits(concurrency=args.want)}
    _time_statements()
    lease = datetime.now(UTC) + timedelta(seconds=30)
    durations = []
    taken: list[object] = []
    deadline = time.monotonic() + 120
    for _ in range(args.rounds):
        if time.monotonic() > deadline:
            break
        with connection.cursor() as cursor:  # the last claim's tasks finish
            cursor.execute("UPDATE ox_task SET status = 'SUCCESSFUL' WHERE id = ANY(%s)", [taken])
        started = time.perf_counter()
        _w, gated = gate.claim_limited(connection, "prof", limits, (args.want, 0), datetime.now(UTC), lease)
        durations.append(time.perf_counter() - started)
        taken = [c.id for c in gated.claimed]
    claims = len(durations)
    rows = sorted(
        ((t, c, s) for t, (c, s) in TIMES.items() if not t.startswith("UPDATE ox_task SET status = 'SUCC")),
        key=lambda r: -r[2],
    )
    durations.sort()
    out: dict[str, Any] = {
        "claims": claims,
        "want": args.want,
        "claim_ms_p50": durations[claims // 2] * 1000,
        "claim_ms_p95": durations[int(claims * 0.95)] * 1000,
        "statements": [
            {"sql": t, "calls_per_claim": c / claims, "ms_per_claim": s * 1000 / claims} for t, c, s in rows
        ],
    }
    now = datetime.now(UTC)
    query, params = candidates_sql("false", ["default"], now, 64, 64, columns="c.id, c.queue, c.limit_key", gate=True)
    with connection.cursor() as cursor:
        out["explain_candidates"] = _explain(cursor, query, params)
        out["explain_running"] = _explain(
            cursor,
            "SELECT queue, limit_key, count(*) FROM ox_task WHERE status = 'RUNNING' AND queue IN (%s)"
            " GROUP BY queue, limit_key",
            ["default"],
        )
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{claims} claims of up to {args.want}: p50 {out['claim_ms_p50']:.3f} ms, p95 {out['claim_ms_p95']:.3f} ms")
    for s in out["statements"]:
        print(f"  {s['ms_per_claim']:7.3f} ms  x{s['calls_per_claim']:.2f}  {s['sql']}")
    for key in ("explain_candidates", "explain_running"):
        print(f"\n{key}:")
        print("\n".join("  " + line for line in out[key]))


if __name__ == "__main__":
    main()
