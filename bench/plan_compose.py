"""What composing and observing tasks costs (docs/composing.md), ox only (no peer has task
metadata): ox against itself, variants in rotating order within one agent (bench.flow)."""

from bench.plan import PERSISTENT, Cell
from bench.plan_flow import compare_metrics, variant

ROUNDS = 3
# The progress cell's throughput is set by its sleeps and how fast 100 slots refill: a round's
# ratio moved 0.85-1.18 within one run (20261204T080357Z). More rounds for a steadier median.
PROGRESS_ROUNDS = 7


def compose_cells() -> list[Cell]:
    return [*_progress(), *(_chain(c) for c in (1, 4))]


def _chain(concurrency: int) -> Cell:
    """workflow_chain_c1/c4: 10,000 no-op tasks as 2,000 chains of five steps (each step's
    success makes the next READY in its transaction) against 10,000 independent no-op tasks.
    Target (issue 13): the chain costs at most 1.5x, i.e. chain5/plain >= 0.667."""
    variants = [
        {**variant("chain5", 1, concurrency), "task": "noop_step", "chain": 5},
        {**variant("plain", 1, concurrency), "task": "noop_step"},
    ]
    ratios = {"chain5_plain": ["chain5", "plain"]}
    return Cell(
        f"workflow_chain_c{concurrency}",
        "drain",
        "ox only (no peer has workflows here): drain of 10,000 no-op tasks enqueued as 2,000 chains of"
        " 5 steps (ox.chain: each step gets the one before's result) against the same 10,000 as"
        f" independent tasks; 1 worker process, concurrency {concurrency}, CONN_MAX_AGE=600; PostgreSQL;"
        f" {ROUNDS} rounds, variants rotating",
        compare_metrics(variants, ratios),
        {
            "n": 10_000,
            "task": "noop_step",
            "variants": variants,
            "ratios": ratios,
            "rounds": ROUNDS,
            "worker_env": PERSISTENT,
        },
        db="pg",
        arms=("ox",),
        timeout=1200.0,
    )


def _progress() -> list[Cell]:
    """progress_metadata: 100 async tasks at once, each a second of ten steps saving its
    progress after every step (ten saves a second each: a thousand a second in all), against
    the same tasks without the saves. Target (issue 13): the saves cost at most 10% of the
    drain's throughput."""
    variants = [
        {**variant("progress", 1, 1), "task": "progress_async"},
        {**variant("plain", 1, 1), "task": "plain_async"},
    ]
    ratios = {"progress_plain": ["progress", "plain"]}
    return [
        Cell(
            "progress_metadata",
            "drain",
            "ox only (peers have no task metadata): drain of 1,000 async tasks, each ten steps of"
            " asyncio.sleep(0.1), saving context.metadata['progress'] after every step (await"
            " asave_metadata(): ten saves a second per task), against the same tasks without the saves;"
            " 1 worker process, --async-concurrency 100 (the default: 100 tasks at once), CONN_MAX_AGE=600;"
            f" PostgreSQL; {PROGRESS_ROUNDS} rounds, variants rotating",
            compare_metrics(variants, ratios),
            {
                "n": 1000,
                "task": "plain_async",
                "variants": variants,
                "ratios": ratios,
                "rounds": PROGRESS_ROUNDS,
                "worker_env": PERSISTENT,
            },
            db="pg",
            arms=("ox",),
            timeout=1200.0,
        )
    ]
