#!/usr/bin/env python
"""Soak test: sustained enqueue and drain at about half of capacity with periodic pruning.

Starts real `manage.py runworker` subprocesses with pruning on (OPTIONS PRUNE, PRUNE_INTERVAL,
through OX_TEST_OPTIONS), measures their capacity with bursts (unless --rate), then runs
producer subprocesses that enqueue `tests.tasks.noop` through Django's Tasks API
(`task.enqueue()` for a single due task, `ox.enqueue_many` for several) at --load (default 0.5)
of that capacity, at most --max-rate (1,500/s), for --minutes. Workers run with DEBUG off unless
--debug (Django's debug query log is memory the worker does not own; see SoakConfig.debug).
Every window it prints what was enqueued and drained, the drain rate, the READY/RUNNING
backlog, the table's health (PostgreSQL: n_dead_tup, heap size, index size, the
ox_task_ready_claim index's size, vacuums so far; SQLite: freelist pages, file size, WAL size,
the same per-object sizes from dbstat) and the worker's RSS and CPU per task.

    .venv/bin/python scripts/soak.py --minutes 30 [--rate R] [--url postgres://...|sqlite:///...]

Without --url it uses a scratch PostgreSQL database `oxsoak` (created, migrated, dropped unless
--keep); a sqlite:/// URL uses that file (deleted first). Autovacuum is whatever the server is
configured to do: the run prints the server's setting and counts vacuums per window. The exit
status is 1 when a check fails (see `checks()`); tests/test_soak.py runs the same driver.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TASK_PATH = "tests.tasks.noop"  # importable by the workers (tests.settings is the settings module)
MIB = 1024 * 1024
PRUNED_LINE = re.compile(r"pruned (\d+) finished tasks")  # ox.prune.Pruner's log line


@dataclass
class SoakConfig:
    minutes: float = 1.0
    window: float | None = None  # seconds per window; None: 5 s for short runs, minutes*2 s for long
    rate: float | None = None  # tasks/s from all producers; None: load x measured capacity
    load: float = 0.5
    # Burst capacity is measured on a fresh table, drained in the biggest claims there are, with
    # nothing else enqueuing: it overstates what a churning table sustains beside a producer on 2
    # cores (here: bursts of 5,700-13,000/s; 3,669/s fell behind within 2 minutes once the table
    # had bloated). So the rate is also capped, by default at 1,500/s: about half of the
    # drain_c1 benchmark (README: 3,174 tasks/s on PostgreSQL).
    max_rate: float = 1500.0
    concurrency: int = 2  # per worker process
    workers: int = 1
    producers: int = 1
    prune_successful: float = 5.0  # OPTIONS PRUNE {"SUCCESSFUL": seconds}
    prune_interval: float = 1.0  # OPTIONS PRUNE_INTERVAL
    # OPTIONS ARCHIVE_AFTER, seconds; None: ox's default (5 minutes: with SUCCESSFUL pruned after
    # 5 s nothing reaches the archive). Shorter than prune_successful: rows go through both.
    archive_after: float | None = None
    warmup_windows: int = 1  # windows before the table can be in its steady state; not compared
    drain_timeout: float = 120.0  # after the producers stop, everything must finish within this
    # Diagnostic, off by default: a plain VACUUM of ox_task after each window's sample, standing
    # in for an autovacuum the server does not run (it changes nothing in the server's config).
    vacuum_each_window: bool = False
    # tests.settings turns DEBUG on, and under DEBUG Django keeps each connection's last 9,000
    # statements with their parameters (connection.queries_log): a worker's claim and completion
    # statements carry hundreds of ids, so its RSS climbs by ~80 MiB over ~10 minutes before
    # the log is full. That is Django's debug cache, not the worker: by default the workers run
    # with DEBUG off (see run_worker); debug=True keeps it on, to measure exactly that.
    debug: bool = False

    def window_seconds(self) -> float:
        if self.window is not None:
            return self.window
        # 5 s windows for a short run (12 per minute: enough to take medians of thirds); a long
        # run gets 30 windows, so one window spans several autovacuum naptimes (60 s default).
        return max(5.0, self.minutes * 60 / 30)

    def ox_options(self) -> dict[str, object]:
        options: dict[str, object] = {
            "PRUNE": {"SUCCESSFUL": self.prune_successful},
            "PRUNE_INTERVAL": self.prune_interval,
        }
        if self.archive_after is not None:
            options["ARCHIVE_AFTER"] = self.archive_after
        return options


@dataclass
class Window:
    index: int
    seconds: float  # since the producers started
    enqueued: int  # in this window
    drained: int  # finished in this window (enqueued - backlog delta)
    rate: float  # drained per second
    pending: int  # READY + RUNNING at the window's end
    dead: int | None  # PostgreSQL n_dead_tup; SQLite freelist pages
    table_bytes: int  # heap (PostgreSQL) / ox_task's b-tree pages (SQLite)
    index_bytes: int  # every index of ox_task
    ready_index_bytes: int | None  # ox_task_ready_claim
    archive_bytes: int | None  # ox_task_archive with its indexes (None: no such table)
    file_bytes: int | None  # SQLite: page_count * page_size
    wal_bytes: int | None  # SQLite: the -wal file
    vacuums: int | None  # PostgreSQL: autovacuum_count + vacuum_count so far
    rss_kib: int  # sum over the worker processes
    cpu_ms_per_task: float | None  # worker CPU (user + system) per drained task


@dataclass
class SoakResult:
    vendor: str
    config: SoakConfig
    capacity: float | None  # tasks/s drained from a burst, before the soak
    rate: float  # target enqueue rate
    windows: list[Window] = field(default_factory=list)
    enqueued_total: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # rows left at the end
    pruned_logged: int = 0  # sum of the workers' "pruned N finished tasks" lines
    attempt_rows: int = 0  # ox_attempt rows left: a failed or lost attempt would leave one
    retried: int = 0  # tasks with attempts > 1
    drain_seconds: float | None = None  # producers stopped -> nothing READY or RUNNING
    worker_exit_codes: list[int | None] = field(default_factory=list)
    autovacuum: str | None = None  # the server's setting (PostgreSQL)

    @property
    def unaccounted(self) -> int:
        """Enqueued tasks neither present (in any status) nor deleted by the pruner. The pruner
        deletes SUCCESSFUL rows only (PRUNE has no other status), so a row it took had
        succeeded. 0 when nothing was lost."""
        return self.enqueued_total - sum(self.statuses.values()) - self.pruned_logged


# ---------------------------------------------------------------- sampling (this process's Django connection)


def vendor() -> str:
    from django.db import connection

    return connection.vendor


def pending_count() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        # Two counts, each matching a partial index (claim, lease): status IN (...) matches neither.
        cursor.execute("SELECT COUNT(*) FROM ox_task WHERE status = 'READY'")
        ready = cursor.fetchone()[0]
        cursor.execute("SELECT COUNT(*) FROM ox_task WHERE status = 'RUNNING'")
        return ready + cursor.fetchone()[0]


def table_stats() -> dict[str, int | None]:
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                """SELECT s.n_dead_tup, s.autovacuum_count + s.vacuum_count, pg_relation_size(s.relid),
                          pg_indexes_size(s.relid), pg_relation_size(to_regclass('ox_task_ready_claim')),
                          pg_total_relation_size(to_regclass('ox_task_archive'))
                   FROM pg_stat_user_tables s WHERE s.relid = to_regclass('ox_task')"""
            )
            dead, vacuums, table, indexes, ready, archive = cursor.fetchone()
            return dict(
                dead=dead,
                vacuums=vacuums,
                table=table,
                indexes=indexes,
                ready=ready,
                archive=archive,
                file=None,
                wal=None,
            )
        if connection.vendor == "mysql":
            return _innodb_stats(cursor)
        cursor.execute("PRAGMA page_count")
        pages = cursor.fetchone()[0]
        cursor.execute("PRAGMA page_size")
        page_size = cursor.fetchone()[0]
        cursor.execute("PRAGMA freelist_count")
        freelist = cursor.fetchone()[0]
        # dbstat (compiled into Python's SQLite here) sizes each b-tree; without it, file size only.
        sizes: dict[str, int] = {}
        try:
            cursor.execute(
                "SELECT name, SUM(pgsize) FROM dbstat WHERE name IN "
                "(SELECT name FROM sqlite_schema WHERE tbl_name = 'ox_task') GROUP BY name"
            )
            sizes = {name: int(size) for name, size in cursor.fetchall()}
            cursor.execute(
                "SELECT SUM(pgsize) FROM dbstat WHERE name IN "
                "(SELECT name FROM sqlite_schema WHERE tbl_name = 'ox_task_archive')"
            )
            archive = cursor.fetchone()[0]
        except Exception:  # noqa: BLE001  (no dbstat: report what PRAGMAs give)
            sizes, archive = {}, None
    wal = Path(str(connection.settings_dict["NAME"]) + "-wal")
    return dict(
        dead=freelist,
        vacuums=None,
        table=sizes.get("ox_task", 0),
        indexes=sum(v for k, v in sizes.items() if k != "ox_task"),
        ready=sizes.get("ox_task_ready_claim"),
        archive=None if archive is None else int(archive),
        file=pages * page_size,
        wal=wal.stat().st_size if wal.exists() else 0,
    )


def _innodb_stats(cursor: Any) -> dict[str, int | None]:
    """MariaDB: sizes from InnoDB's statistics (refreshed as the table changes, not exact);
    "dead" is the history list length, the undo records purge has yet to free (server-wide:
    what MVCC keeps of old row versions, as dead tuples are on PostgreSQL)."""
    cursor.execute(
        "SELECT table_name, data_length, index_length FROM information_schema.tables"
        " WHERE table_schema = DATABASE() AND table_name IN ('ox_task', 'ox_task_archive')"
    )
    sizes = {name: (int(data), int(index)) for name, data, index in cursor.fetchall()}
    cursor.execute(
        "SELECT SUM(stat_value) * @@innodb_page_size FROM mysql.innodb_index_stats WHERE database_name = DATABASE()"
        " AND table_name = 'ox_task' AND index_name = 'ox_task_ready_claim' AND stat_name = 'size'"
    )
    ready = cursor.fetchone()[0]
    cursor.execute("SELECT count FROM information_schema.innodb_metrics WHERE name = 'trx_rseg_history_len'")
    history = cursor.fetchone()
    table, indexes = sizes.get("ox_task", (0, 0))
    return dict(
        dead=None if history is None else int(history[0]),
        vacuums=None,
        table=table,
        indexes=indexes,
        ready=None if ready is None else int(ready),
        archive=sum(sizes.get("ox_task_archive", (0, 0))),
        file=None,
        wal=None,
    )


def vacuum() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ox_task")  # Django's autocommit: not inside a transaction block


def server_autovacuum() -> str | None:
    from django.db import connection

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        return cursor.fetchone()[0]


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    try:
        # Fields after the command (which may hold spaces, inside parentheses): utime, stime are
        # the 14th and 15th fields of the whole line.
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


# ---------------------------------------------------------------- processes


class Child:
    """A subprocess whose output goes to a log file; stopped by its pid only."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT)  # noqa: S603  (argv built here)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def terminate(self, timeout: float) -> int | None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._out.close()

    def text(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")


def read_count(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (OSError, ValueError):
        return 0  # not written yet (the producer replaces it atomically, so never half a number)


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def measure_capacity(workers: list[Child], out: Callable[[str], None]) -> tuple[float, int]:
    """Drain rate of backlogs enqueued at once, the workers idle and warm: the median of three
    bursts (2,000, 8,000 and 20,000 tasks). One burst alone is not a number to trust here: a
    small one is mostly the worker's ramp-up, a large one drains in the biggest claims there
    are, and on a shared 2-core machine any one of them may meet someone else's benchmark."""
    from ox import enqueue_many
    from tests.tasks import noop

    rates, total = [], 0
    for n in (2000, 8000, 20000):
        enqueue_many(noop, [((), {})] * n)
        total += n
        started = time.monotonic()
        if not wait_for(lambda: pending_count() == 0, timeout=120, interval=0.02):
            raise RuntimeError(f"a burst of {n} tasks did not drain within 120 s")
        seconds = time.monotonic() - started
        rates.append(n / seconds)
        out(f"capacity burst: {n} tasks drained in {seconds:.2f} s = {rates[-1]:,.0f} tasks/s")
        if any(not w.alive() for w in workers):
            raise RuntimeError("a worker exited during the capacity bursts")
    return statistics.median(rates), total


def run_soak(
    config: SoakConfig, url: str, env: dict[str, str], workdir: Path, out: Callable[[str], None] = print
) -> SoakResult:
    """Run the soak against `url` (already migrated, ox tables empty), sampling through this
    process's default Django connection, which must point at the same database."""
    env = {
        **env,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONUNBUFFERED": "1",
        "OX_LOG_LEVEL": "INFO",  # the pruner's "pruned N" lines are the accounting of deletions
        "OX_TEST_OPTIONS": json.dumps(config.ox_options()),
    }
    workdir.mkdir(parents=True, exist_ok=True)
    result = SoakResult(vendor=vendor(), config=config, capacity=None, rate=0.0, autovacuum=server_autovacuum())
    workers: list[Child] = []
    producers: list[Child] = []
    try:
        for i in range(config.workers):
            workers.append(
                Child(
                    [sys.executable, str(ROOT / "manage.py"), "runworker", "--concurrency", str(config.concurrency)]
                    if config.debug
                    else [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "worker",
                        "--concurrency",
                        str(config.concurrency),
                    ],
                    env,
                    workdir / f"worker-{i}.log",
                )
            )
        from ox.models import Worker

        pids = [w.pid for w in workers]
        if not wait_for(lambda: Worker.objects.filter(pid__in=pids).count() == len(pids), timeout=60, interval=0.1):
            raise RuntimeError("workers did not register within 60 s:\n" + "\n".join(w.text()[-2000:] for w in workers))

        burst = 0  # tasks enqueued by the capacity bursts: part of the final accounting
        if config.rate is None:
            result.capacity, burst = measure_capacity(workers, out)
            result.rate = min(config.load * result.capacity, config.max_rate)
        else:
            result.rate = config.rate

        seconds = config.minutes * 60
        per_producer = result.rate / config.producers
        counts = [workdir / f"producer-{i}.count" for i in range(config.producers)]
        for i, path in enumerate(counts):
            path.unlink(missing_ok=True)
            producers.append(
                Child(
                    [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "produce",
                        "--rate",
                        f"{per_producer:.3f}",
                        "--seconds",
                        f"{seconds:.3f}",
                        "--count-file",
                        str(path),
                    ],
                    env,
                    workdir / f"producer-{i}.log",
                )
            )
        window = config.window_seconds()
        out(
            f"soak on {result.vendor}: {config.minutes:g} min at {result.rate:,.0f} tasks/s "
            f"({config.producers} producer(s)), {config.workers} worker(s) x concurrency {config.concurrency}, "
            f"PRUNE SUCCESSFUL={config.prune_successful:g}s every {config.prune_interval:g}s, "
            f"{window:g} s windows"
            + (f", capacity {result.capacity:,.0f}/s" if result.capacity else "")
            + (f", server autovacuum={result.autovacuum}" if result.autovacuum else "")
            + (", VACUUM ox_task after each window" if config.vacuum_each_window else "")
            + (", workers with DEBUG on" if config.debug else ", workers with DEBUG off")
        )
        out(header(result.vendor))
        started = time.monotonic()
        last_enqueued, last_pending, last_cpu = 0, pending_count(), sum(cpu_seconds(w.pid) for w in workers)
        last_at = started
        # Whole windows inside the producing time only: the tail after the producers stop is
        # the final drain, not a window to compare.
        for index in range(1, max(1, int(seconds / window + 1e-9)) + 1):
            time.sleep(max(0.0, started + index * window - time.monotonic()))
            enqueued = sum(read_count(p) for p in counts)
            pending = pending_count()
            stats = table_stats()
            cpu = sum(cpu_seconds(w.pid) for w in workers)
            drained = (enqueued - last_enqueued) - (pending - last_pending)
            now = time.monotonic()  # the sample's own time: a slow sample must not skew the rate
            row = Window(
                index=index,
                seconds=now - started,
                enqueued=enqueued - last_enqueued,
                drained=drained,
                rate=drained / max(now - last_at, 1e-6),
                pending=pending,
                dead=stats["dead"],
                table_bytes=stats["table"] or 0,
                index_bytes=stats["indexes"] or 0,
                ready_index_bytes=stats["ready"],
                archive_bytes=stats["archive"],
                file_bytes=stats["file"],
                wal_bytes=stats["wal"],
                vacuums=stats["vacuums"],
                rss_kib=sum(rss_kib(w.pid) for w in workers),
                cpu_ms_per_task=(cpu - last_cpu) * 1000 / drained if drained > 0 else None,
            )
            result.windows.append(row)
            out(format_row(row))
            last_enqueued, last_pending, last_cpu, last_at = enqueued, pending, cpu, now
            if config.vacuum_each_window and result.vendor == "postgresql":
                vacuum()
            if any(not w.alive() for w in workers):
                raise RuntimeError("a worker exited during the soak:\n" + "\n".join(w.text()[-2000:] for w in workers))

        for p in producers:
            if p.proc.wait(timeout=60) != 0:
                raise RuntimeError(f"producer exited {p.proc.returncode}:\n{p.text()[-2000:]}")
        stopped = time.monotonic()
        if wait_for(lambda: pending_count() == 0, timeout=config.drain_timeout, interval=0.1):
            result.drain_seconds = time.monotonic() - stopped
        result.enqueued_total = burst + sum(read_count(p) for p in counts)
        # One more pruning round may be under way: let it finish, then stop the workers (SIGTERM:
        # a clean stop exits 0) before counting, so no deletion happens after the count.
        time.sleep(config.prune_interval + 0.5)
        result.worker_exit_codes = [w.terminate(timeout=60) for w in workers]
        from django.db.models import Count

        from ox.models import ArchivedTask, Attempt, Task

        # Rows finished more than ARCHIVE_AFTER ago are in the archive: count both tables.
        result.statuses = {}
        for table in (Task, ArchivedTask):
            for status, n in table.objects.values_list("status").annotate(n=Count("id")):
                result.statuses[status] = result.statuses.get(status, 0) + n
        result.attempt_rows = Attempt.objects.count()
        result.retried = sum(table.objects.filter(attempts__gt=1).count() for table in (Task, ArchivedTask))
        result.pruned_logged = sum(pruned_in(w.text()) for w in workers)
        out(summary(result))
        return result
    finally:
        for child in [*producers, *workers]:
            child.kill()


def pruned_in(log: str) -> int:
    return sum(int(n) for n in PRUNED_LINE.findall(log))


# ---------------------------------------------------------------- report


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


# ---------------------------------------------------------------- checks


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def thirds(values: list[float]) -> tuple[list[float], list[float]]:
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
    first, last = thirds(rates)
    a, b = statistics.median(first), statistics.median(last)
    ratio = b / a if a else 0.0
    out.append(
        Check(
            "throughput",
            abs(ratio - 1) <= THROUGHPUT_TOLERANCE and a >= 0.8 * r.rate,
            f"median drain rate first third {a:,.0f}/s, last third {b:,.0f}/s (ratio {ratio:.2f}, allowed "
            f"1 ± {THROUGHPUT_TOLERANCE}); target {r.rate:,.0f}/s; per window {[round(x) for x in rates]}",
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


# ---------------------------------------------------------------- command line


def produce(rate: float, seconds: float, count_file: Path, tick: float = 0.02) -> int:
    """Enqueue tests.tasks.noop at `rate` per second for `seconds`, on an absolute schedule (a
    stall is caught up afterwards, so every window gets its share); writes the running count."""
    import django

    django.setup()
    from ox import enqueue_many
    from tests.tasks import noop

    started = time.monotonic()
    sent, written_at = 0, 0.0
    while True:
        now = time.monotonic()
        elapsed = min(now - started, seconds)
        due = int(rate * elapsed) - sent
        if due == 1:
            noop.enqueue()
        elif due > 1:
            # At most a second's worth per statement: a long stall is caught up over a few ticks.
            due = min(due, max(2, int(rate)))
            enqueue_many(noop, [((), {})] * due)
        sent += max(due, 0)
        if now - written_at >= 0.2 or elapsed >= seconds:
            tmp = count_file.with_suffix(".tmp")
            tmp.write_text(str(sent))
            os.replace(tmp, count_file)  # atomic: the driver never reads half a number
            written_at = now
        if elapsed >= seconds and sent >= int(rate * seconds):
            break
        time.sleep(max(0.0, tick - (time.monotonic() - now)))
    print(f"enqueued {sent} in {time.monotonic() - started:.1f} s")
    return 0


def run_worker(args: list[str]) -> None:
    """`manage.py runworker ARGS`, the same command through the same entry point, with DEBUG
    off: Django reads settings.DEBUG at each cursor, so flipping it after setup is enough."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import execute_from_command_line

    settings.DEBUG = False
    execute_from_command_line([str(ROOT / "manage.py"), "runworker", *args])


def admin_url(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/postgres"))


def prepare_database(url: str) -> None:
    """A fresh, migrated database at `url`."""
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            p.unlink(missing_ok=True)
    else:
        import psycopg

        name = urlsplit(url).path.lstrip("/")
        with psycopg.connect(admin_url(url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    subprocess.run(  # noqa: S603  (our own interpreter and manage.py)
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
    )


def drop_database(url: str) -> None:
    if url.startswith("sqlite:///"):
        return
    import psycopg
    from django.db import connections

    connections.close_all()
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(admin_url(url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str]) -> int:
    if argv[:1] == ["produce"]:
        p = argparse.ArgumentParser(prog="soak.py produce")
        p.add_argument("--rate", type=float, required=True)
        p.add_argument("--seconds", type=float, required=True)
        p.add_argument("--count-file", type=Path, required=True)
        a = p.parse_args(argv[1:])
        return produce(a.rate, a.seconds, a.count_file)

    if argv[:1] == ["worker"]:
        run_worker(argv[1:])
        return 0

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=None, help="tasks/s (default: --load x measured capacity)")
    parser.add_argument("--load", type=float, default=0.5)
    parser.add_argument("--max-rate", type=float, default=1500.0, help="cap on --load x capacity")
    parser.add_argument("--window", type=float, default=None, help="seconds per window")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--prune-successful", type=float, default=5.0, help="OPTIONS PRUNE SUCCESSFUL, seconds")
    parser.add_argument("--prune-interval", type=float, default=1.0, help="OPTIONS PRUNE_INTERVAL, seconds")
    parser.add_argument("--archive-after", type=float, default=None, help="OPTIONS ARCHIVE_AFTER, seconds")
    parser.add_argument(
        "--vacuum", action="store_true", help="PostgreSQL: VACUUM ox_task after each window (diagnostic)"
    )
    parser.add_argument("--debug", action="store_true", help="workers with DEBUG on (as tests.settings has it)")
    parser.add_argument("--url", default=os.environ.get("OX_SOAK_URL", "postgres://postgres@127.0.0.1:5432/oxsoak"))
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--workdir", type=Path, default=ROOT / "var" / "soak", help="logs of the subprocesses")
    parser.add_argument("--json", type=Path, default=None, help="write the windows and checks here")
    a = parser.parse_args(argv)
    config = SoakConfig(
        minutes=a.minutes,
        window=a.window,
        rate=a.rate,
        load=a.load,
        max_rate=a.max_rate,
        concurrency=a.concurrency,
        workers=a.workers,
        producers=a.producers,
        prune_successful=a.prune_successful,
        prune_interval=a.prune_interval,
        archive_after=a.archive_after,
        vacuum_each_window=a.vacuum,
        debug=a.debug,
    )

    # SIGTERM (or SIGINT, which a background job may ignore) ends the run through its finally
    # blocks, so the workers and producers it started are stopped with it.
    def stop(signum: int, frame: object) -> None:
        raise SystemExit(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    prepare_database(a.url)
    os.environ["DATABASE_URL"] = a.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    try:
        result = run_soak(config, a.url, dict(os.environ), a.workdir, out=lambda s: print(s, flush=True))
    finally:
        if not a.keep:
            drop_database(a.url)
    failed = 0
    results = checks(result)
    for c in results:
        failed += not c.ok
        print(f"{'PASS' if c.ok else 'FAIL'} {c.name}: {c.detail}")
    if a.json:
        from dataclasses import asdict

        a.json.write_text(
            json.dumps({"result": asdict(result), "checks": [asdict(c) for c in results]}, indent=1, default=str)
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
