"""The soak's report lines and its checks: what must hold over a run for it to pass (scripts/soak.py)."""

import statistics
from dataclasses import dataclass

from scripts.soak_model import SoakResult, Window

MIB = 1024 * 1024


def header(db_vendor: str) -> str:
    dead = "n_dead_tup" if db_vendor == "postgresql" else "freelist"
    extra = f"{'vacuums':>7}" if db_vendor == "postgresql" else f"{'file_MiB':>8} {'wal_MiB':>7}"
    return (
        f"{'win':>3} {'t_s':>6} {'enqueued':>8} {'drained':>8} {'rate/s':>7} {'pending':>7} {dead:>10} "
        f"{'table_MiB':>9} {'index_MiB':>9} {'ready_KiB':>9} {'arch_MiB':>8} {extra} {'rss_MiB':>7} {'cpu_ms/task':>11}"
    )


def format_row(w: Window) -> str:
    def mib(v: int | None) -> str:
        return "-" if v is None else f"{v / MIB:.2f}"

    if w.file_bytes is None:
        extra = f"{'-' if w.vacuums is None else w.vacuums:>7}"
    else:
        extra = f"{mib(w.file_bytes):>8} {mib(w.wal_bytes):>7}"
    ready = "-" if w.ready_index_bytes is None else f"{w.ready_index_bytes / 1024:.0f}"
    cpu = "-" if w.cpu_ms_per_task is None else f"{w.cpu_ms_per_task:.3f}"
    return (
        f"{w.index:>3} {w.seconds:>6.0f} {w.enqueued:>8} {w.drained:>8} {w.rate:>7.0f} {w.pending:>7} "
        f"{'-' if w.dead is None else w.dead:>10} {mib(w.table_bytes):>9} {mib(w.index_bytes):>9} {ready:>9} "
        f"{mib(w.archive_bytes):>8} {extra} {w.rss_kib / 1024:>7.1f} {cpu:>11}"
    )


def summary(r: SoakResult) -> str:
    return (
        f"enqueued {r.enqueued_total}, left {r.statuses}, pruned (logged) {r.pruned_logged}, "
        f"unaccounted {r.unaccounted}, attempt rows {r.attempt_rows}, retried {r.retried}, "
        f"drained {'-' if r.drain_seconds is None else f'{r.drain_seconds:.1f} s'} after the producers stopped, "
        f"worker exit codes {r.worker_exit_codes}"
    )


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def third_rate(windows: list[Window], lengths: dict[int, float]) -> float:
    """Tasks drained per second over the windows taken together (`lengths`: each window's
    seconds, by index)."""
    seconds = sum(lengths[w.index] for w in windows)
    return sum(w.drained for w in windows) / seconds if seconds else 0.0


def thirds[T](values: list[T]) -> tuple[list[T], list[T]]:
    """The first and last third of the compared windows (at least 2 each when there are 4+)."""
    k = max(2, len(values) // 3) if len(values) >= 4 else 1
    return values[:k], values[-k:]


# Growth allowed between the first and last third of the run: 20%, or at least this much on top
# (a table of a few hundred pages moves by a few dozen pages as the prune sawtooth and the
# sampling moment line up differently; that is not growth).
BOUND_RATIO = 1.2
BOUND_FLOOR = {
    "dead": 20_000,
    "table_bytes": 2 * MIB,
    "index_bytes": 2 * MIB,
    "ready_index_bytes": 2 * MIB,
    "archive_bytes": 2 * MIB,
}
BOUND_FLOOR_SQLITE = {"dead": 512, "file_bytes": 2 * MIB}  # freelist pages; the whole file
# Absolute sanity caps, far above the steady state (a few thousand live rows, a few MiB): a run
# that passes the relative check while already huge still fails here.
CAP = {
    "dead": 2_000_000,
    "table_bytes": 512 * MIB,
    "index_bytes": 256 * MIB,
    "ready_index_bytes": 64 * MIB,
    "archive_bytes": 1024 * MIB,
}
CAP_SQLITE = {"dead": 100_000, "file_bytes": 512 * MIB}
THROUGHPUT_TOLERANCE = 0.2
RSS_MARGIN_KIB = 8 * 1024  # a fixed allowance: the allocator's arenas settle over the first minutes


def bounded_metrics(vendor_name: str) -> dict[str, tuple[int, int]]:
    """metric -> (floor, cap) for the bounded-size checks on this database."""
    if vendor_name in ("postgresql", "mysql"):
        return {m: (BOUND_FLOOR[m], CAP[m]) for m in BOUND_FLOOR}
    floors = {**BOUND_FLOOR, **BOUND_FLOOR_SQLITE}
    caps = {**CAP, **CAP_SQLITE}
    names = ("dead", "file_bytes", "table_bytes", "index_bytes", "ready_index_bytes", "archive_bytes")
    return {m: (floors[m], caps[m]) for m in names}


def checks(r: SoakResult) -> list[Check]:
    compared = r.windows[r.config.warmup_windows :]
    out: list[Check] = []
    if len(compared) < 2:
        return [Check("windows", False, f"only {len(compared)} windows after warm-up: run longer")]

    rates = [w.rate for w in compared]
    first_w, last_w = thirds(compared)
    # Each window's own seconds: `seconds` counts from the producers' start to its end.
    starts = [0.0, *(w.seconds for w in r.windows[:-1])]
    lengths = {w.index: w.seconds - start for w, start in zip(r.windows, starts, strict=True)}
    a, b = third_rate(first_w, lengths), third_rate(last_w, lengths)
    ratio = b / a if a else 0.0
    # A stall of the whole machine slows the producers as much as the worker, and both catch up
    # after it: a third's rate is its summed drain over its summed time (one slow window and the
    # catch-up after it cancel out, where a median of three kept the slow one). A last third that
    # drained what was enqueued in it kept up, whatever the producers managed: the worker falling
    # behind (what a slowing claim or table would do) shows as work left over.
    enqueued, drained = sum(w.enqueued for w in last_w), sum(w.drained for w in last_w)
    kept_up = enqueued > 0 and drained >= (1 - THROUGHPUT_TOLERANCE) * enqueued
    out.append(
        Check(
            "throughput",
            a >= 0.8 * r.rate and (abs(ratio - 1) <= THROUGHPUT_TOLERANCE or kept_up),
            f"drain rate first third {a:,.0f}/s, last third {b:,.0f}/s (ratio {ratio:.2f}, allowed "
            f"1 ± {THROUGHPUT_TOLERANCE}, or the last third drained at least {1 - THROUGHPUT_TOLERANCE:.0%} of"
            f" what it enqueued: {drained:,} of {enqueued:,}); target {r.rate:,.0f}/s; per window"
            f" {[round(x) for x in rates]}",
        )
    )

    for metric, (floor, cap) in bounded_metrics(r.vendor).items():
        values = [getattr(w, metric) for w in compared]
        if any(v is None for v in values):
            continue
        f_max, l_max = max(thirds(values)[0]), max(thirds(values)[1])
        bound = max(BOUND_RATIO * f_max, f_max + floor)
        out.append(
            Check(
                f"bounded:{metric}",
                l_max <= bound and max(values) <= cap,
                f"first-third max {f_max:,}, last-third max {l_max:,} (bound {bound:,.0f}), "
                f"run max {max(values):,} (cap {cap:,}); per window {values}",
            )
        )

    rss = [w.rss_kib for w in compared]
    first_rss, last_rss = thirds(rss)
    f_rss, l_rss = statistics.median(first_rss), statistics.median(last_rss)
    middle = rss[len(first_rss) : len(rss) - len(last_rss)]
    m_rss = statistics.median(middle) if middle else f_rss
    # Growing: the last third above the first by more than the margin, and still climbing from
    # the middle third (by half the margin: what a steady climb over the run would show). A
    # warm-up that settled by the middle passes: the worker's SQLite statements and allocator
    # arenas add ~14 MiB over its first ~2 minutes, then RSS stays flat (5-minute run).
    growing = l_rss > f_rss + RSS_MARGIN_KIB and l_rss > m_rss + RSS_MARGIN_KIB / 2
    out.append(
        Check(
            "memory",
            not growing,
            f"worker RSS median first third {f_rss / 1024:.1f} MiB, middle {m_rss / 1024:.1f} MiB, last third "
            f"{l_rss / 1024:.1f} MiB (allowed: +{RSS_MARGIN_KIB / 1024:.0f} MiB over the first third, or "
            f"+{RSS_MARGIN_KIB / 2048:.0f} MiB over the middle)",
        )
    )

    # Lost: vanished without the pruner, ended in any status but SUCCESSFUL (FAILED, CANCELLED),
    # RUNNING after its worker's clean exit, or run more than once. READY left over is a backlog
    # the workers did not drain in time: a separate check, a throughput symptom, not a loss.
    wrong = {s: n for s, n in r.statuses.items() if s not in ("SUCCESSFUL", "READY")}
    out.append(Check("nothing lost", r.unaccounted == 0 and not wrong and r.retried == 0, summary(r)))
    out.append(
        Check(
            "drained",
            r.drain_seconds is not None and not r.statuses.get("READY"),
            f"READY left: {r.statuses.get('READY', 0)}, drained "
            + ("-" if r.drain_seconds is None else f"{r.drain_seconds:.1f} s")
            + f" after the producers stopped (allowed {r.config.drain_timeout:g} s)",
        )
    )
    out.append(Check("workers exit 0", all(code == 0 for code in r.worker_exit_codes), f"{r.worker_exit_codes}"))
    return out
