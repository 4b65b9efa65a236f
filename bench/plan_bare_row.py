"""The enqueue_bare_row cell (ox only): ox's sequential enqueue against the very INSERT it sends,
run on bare psycopg (bench.bare_row), so the enqueue's cost splits into the row ox stores and ox's
own Python; and, in the same interleaved run, the limit's thin INSERT alone and behind Django's
Tasks API (bench.floor), so the gap to the limit splits into what Django's API costs any backend,
what ox's row costs and what ox's Python costs. Pure data, like bench.plan.

bench.plan adds it with `with_bare_row` after every other arm has joined the plan: the peers' plan
modules would otherwise give it their "not run yet", where every arm but ox cannot run it.
"""

from bench.arms import ARM_NAMES
from bench.plan import Cell, Metric

CELL = "enqueue_bare_row"
METRICS = (
    Metric("throughput_ox", "throughput_ox", "tasks/s", True),
    Metric("throughput_bare", "throughput_bare", "tasks/s", True),
    Metric("throughput_floor", "throughput_floor", "tasks/s", True),
    Metric("throughput_limit", "throughput_limit", "tasks/s", True),
    Metric("ratio_ox_bare", "ratio_ox_bare", "ox/bare", True),
    Metric("ratio_floor_limit", "ratio_floor_limit", "floor/limit", True),
    Metric("ratio_bare_limit", "ratio_bare_limit", "bare/limit", True),
    Metric("ratio_ox_floor", "ratio_ox_floor", "ox/floor", True),
    Metric("ratio_ox_limit", "ratio_ox_limit", "ox/limit", True),
)
REASON = (
    "cannot run: the cell measures ox's own row (noop.enqueue() against the same INSERT into ox_task run on"
    " bare psycopg), ox against itself"
)


def bare_row_cell(quick: bool) -> Cell:
    n, chunk, rounds = (1000, 100, 3) if quick else (2000, 100, 5)
    return Cell(
        CELL,
        "enqueue_seq",
        f"ox only: sequential enqueues in autocommit from the agent (no worker), {n:,} per kind and round: ox's"
        " noop.enqueue() (Django's connection, CONN_MAX_AGE 0 as in enqueue_seq, kept open: no request cycle"
        " closes it) against bare: the same INSERT into the same ox_task table (every column ox writes, the"
        " same index entries and NOTIFY trigger), its SQL text and parameters captured from one real"
        " noop.enqueue(), run with psycopg's prepare=True on a separate autocommit psycopg connection, a new"
        " uuid7 id and enqueued_at/run_after = now per call; both prepared (ox prepares its INSERT on"
        " PostgreSQL); limit: the limit arm's thin INSERT (bench.limit_sql's table and index as"
        " bench_floor_task, made for the cell in the same database) on that bare connection, prepared; floor:"
        " that same INSERT behind Django's Tasks API (Task.enqueue() through a backend doing only what the API"
        " requires: the row, the TaskResult, task_enqueued; bench.floor), the most a django.tasks backend"
        " writing one durable row per enqueue in autocommit can reach;"
        f" interleaved in chunks of {chunk}, the order of the four kinds rotated by one per chunk and per round;"
        f" {rounds} rounds, the tables emptied and one uncounted call of each kind before each;"
        " ratios per round (ox/bare 1.0: ox's Python costs nothing beyond psycopg's; floor/limit: the"
        " share of the limit Django's API leaves such a backend)",
        METRICS,
        {"n": n, "chunk": chunk, "rounds": rounds, "bare_row": True},
        arms=("ox",),
        timeout=600.0,
        cannot_run={arm: REASON for arm in ARM_NAMES if arm != "ox"},
    )


def with_bare_row(cells: list[Cell], quick: bool) -> list[Cell]:
    """The plan with enqueue_bare_row right after enqueue_seq (last if that is missing)."""
    cell = bare_row_cell(quick)
    out: list[Cell] = []
    for existing in cells:
        out.append(existing)
        if existing.name == "enqueue_seq":
            out.append(cell)
    return out if len(out) > len(cells) else [*out, cell]
