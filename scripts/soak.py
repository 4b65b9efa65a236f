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
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The soak's parts, importable once the checkout is on the path (run as `scripts/soak.py`).
from scripts.soak_checks import checks, format_row, header, summary  # noqa: E402
from scripts.soak_model import SoakConfig, SoakResult, Window  # noqa: E402
from scripts.soak_procs import Child, produce, read_count, run_worker, wait_for  # noqa: E402
from scripts.soak_sample import (  # noqa: E402
    cpu_seconds,
    pending_count,
    rss_kib,
    server_autovacuum,
    table_stats,
    vacuum,
    vendor,
)

TASK_PATH = "tests.tasks.noop"  # importable by the workers (tests.settings is the settings module)
PRUNED_LINE = re.compile(r"pruned (\d+) finished tasks")  # ox.prune.Pruner's log line


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


# ---------------------------------------------------------------- command line


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
