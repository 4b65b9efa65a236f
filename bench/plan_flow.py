"""ox against itself with concurrency and key limits, and unique enqueues (docs/flow-control.md):
ox only (the peers have neither), variants in rotating order within one agent (bench.flow)."""

from typing import Any

from bench.plan import PERSISTENT, Cell, Metric


def variant(name: str, processes: int, concurrency: int, limits: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "processes": processes, "concurrency": concurrency, "limits": {"default": limits or {}}}


def shape(v: dict[str, Any]) -> str:
    limits = ", ".join(f"{k} {x}" for k, x in v["limits"]["default"].items()) or "no limits"
    return f"{v['name']} = {v['processes']} process(es) x {v['concurrency']} threads, {limits}"


def compare_metrics(variants: list[dict[str, Any]], ratios: dict[str, list[str]]) -> tuple[Metric, ...]:
    names = [v["name"] for v in variants]
    return (
        *(Metric(f"throughput_{n}", f"throughput_{n}", "tasks/s", True) for n in names),
        *(Metric(f"ratio_{r}", f"ratio_{r}", f"{a}/{b}", True) for r, (a, b) in ratios.items()),
        *(Metric(f"cpu_ms_per_task_{n}", f"cpu_per_task_{n}", "ms", False) for n in names),
        *(Metric(f"statements_per_task_{n}", f"statements_per_task_{n}", "stmts", False) for n in names),
    )


def flow_cells() -> list[Cell]:
    """ox only (the peers have no concurrency limits or unique tasks): ox with a limit against
    ox without, variants in rotating order within one agent, >= 3 rounds, ratio per round."""
    cells = []
    rounds = 3
    for db, prefix, n in (("pg", "", 10_000), ("sqlite", "sqlite_", 2000)):
        on = " on SQLite (WAL)" if db == "sqlite" else ""
        shapes = {
            "limit_global": (
                [
                    variant("limited_p2c4", 2, 4, {"concurrency": 4}),
                    variant("unlimited_c4", 1, 4),
                    variant("unlimited_p2c4", 2, 4),
                ],
                {"limited_p2c4_unlimited_c4": ["limited_p2c4", "unlimited_c4"]},
                None,
                f"drain of {n:,} no-op tasks{on}: a queue limited to concurrency 4 drained by 2 processes x 4"
                " threads, against no limit at 1 x 4 (the same 4 at once) and 2 x 4 (reference)",
            ),
            "limit_keys": (
                [
                    variant("limited_c4", 1, 4, {"key_concurrency": 1}),
                    variant("unlimited_c4", 1, 4),
                    variant("limited_p2c4", 2, 4, {"key_concurrency": 1}),
                    variant("unlimited_p2c4", 2, 4),
                ],
                {
                    "limited_c4_unlimited_c4": ["limited_c4", "unlimited_c4"],
                    "limited_p2c4_unlimited_p2c4": ["limited_p2c4", "unlimited_p2c4"],
                },
                1000,
                f"drain of {n:,} keyed no-op tasks{on} over 1,000 limit keys (round-robin, @task(limit_by=...)):"
                " key_concurrency 1 against no limit, the same backlog and workers",
            ),
        }
        if db == "pg":
            # The same limit with tasks that take time (io_bound: a 50 ms sleep): what the gate
            # costs once the task, not the claim, is what a slot waits on.
            shapes["limit_global_io"] = (
                shapes["limit_global"][0],
                shapes["limit_global"][1],
                None,
                "drain of 400 io_bound tasks (time.sleep(0.05)): a queue limited to concurrency 4 drained by 2"
                " processes x 4 threads, against no limit at 1 x 4 and 2 x 4",
            )
        for name, (variants, ratios, keys, about) in shapes.items():
            settings = "; ".join(shape(v) for v in variants)
            cells.append(
                Cell(
                    f"{prefix}{name}",
                    "drain",
                    f"ox only (peers have no such limits): {about}. {settings}; CONN_MAX_AGE=600;"
                    f" {rounds} rounds, variants rotating",
                    compare_metrics(variants, ratios),
                    {
                        "n": 400 if name.endswith("_io") else n,
                        "task": "io_bound" if name.endswith("_io") else "noop",
                        "keys": keys,
                        "variants": variants,
                        "ratios": ratios,
                        "rounds": rounds,
                        "worker_env": PERSISTENT,
                    },
                    db=db,
                    arms=("ox",),
                    timeout=1800.0,
                )
            )
        m = 2000 if db == "pg" else 1000
        cells.append(
            Cell(
                f"{prefix}unique_enqueue",
                "enqueue_seq",
                f"ox only (peers have no unique tasks): sequential enqueues{on} in autocommit (agent process, no"
                f" worker), {m:,} per kind and round: plain vs @task(unique=True) with distinct arguments (each"
                " inserts) vs the same unique calls again (each a duplicate, answered with the holder's result);"
                " interleaved in chunks of 100, order rotating; 5 rounds",
                (
                    Metric("throughput_plain", "throughput_plain", "tasks/s", True),
                    Metric("throughput_unique", "throughput_unique", "tasks/s", True),
                    Metric("throughput_duplicate", "throughput_duplicate", "tasks/s", True),
                    Metric("ratio_unique_plain", "ratio_unique_plain", "unique/plain", True),
                    Metric("ratio_duplicate_plain", "ratio_duplicate_plain", "duplicate/plain", True),
                ),
                {"n": m, "chunk": 100, "rounds": 5, "variants": ["plain", "unique", "duplicate"]},
                db=db,
                arms=("ox",),
            )
        )
    return cells
