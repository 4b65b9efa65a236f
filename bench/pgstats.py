"""Database-side figures of a drain on PostgreSQL, read by the agent while the workers run:
what explains where adding worker processes stops paying.

- counters: pg_stat_database of the arm's database (xact_commit, xact_rollback, tuples,
  blocks) and pg_stat_wal (wal_records, wal_fpi, wal_bytes: cluster-wide, so other
  databases' activity is in it; the other databases' xact_commit delta is kept to show how
  much there was). Taken before and after the measured window; the "after" snapshot is taken
  once the workers have exited, because a backend flushes its statistics at exit (otherwise
  up to a second late, PG 15).
- wait states: pg_stat_activity sampled every `every` seconds from a connection to the
  `postgres` database (so the sampler's own queries do not count in the arm's database), over
  the arm's client backends except the agent's: active on CPU, active waiting (by
  wait_event_type:wait_event), idle, idle in transaction.
- CPU: utime+stime from /proc of the arm's backends and of the server's auxiliary processes
  (walwriter, checkpointer, background writer, autovacuum), over the window. A backend that
  exits keeps its last reading (sampled every few samples, so a little is lost at the end).

Pure functions (`tally`, `summarize`) are separate from the sampling, so the tests can run
them without a server.
"""

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from bench import procs

DB_COUNTERS = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "blks_read", "blks_hit")
WAL_COUNTERS = ("wal_records", "wal_fpi", "wal_bytes")
AUX_TYPES = ("walwriter", "checkpointer", "background writer", "autovacuum worker", "autovacuum launcher")
ACTIVITY = """
SELECT pid, datname, backend_type, state, wait_event_type, wait_event
FROM pg_stat_activity WHERE pid <> pg_backend_pid()
"""


def server_url(db_url: str) -> str:
    """The same server's `postgres` database."""
    parts = urlsplit(db_url)
    return urlunsplit((parts.scheme, parts.netloc, "/postgres", parts.query, parts.fragment))


def state_of(state: str | None, wait_type: str | None, wait_event: str | None) -> str:
    """One backend's sample as a label: "cpu" (active, not waiting), "Lock:tuple" (active,
    waiting), "idle", "idle in transaction"."""
    if state == "active":
        return f"{wait_type}:{wait_event}" if wait_type else "cpu"
    return state or "unknown"


def tally(samples: list[list[str]]) -> dict[str, Any]:
    """Shares of backend states over samples (each sample: one label per backend)."""
    counts: Counter[str] = Counter(label for sample in samples for label in sample)
    total = sum(counts.values())
    active = sum(n for label, n in counts.items() if label == "cpu" or ":" in label)
    waits = {label: n for label, n in counts.items() if ":" in label}
    locks = sum(n for label, n in waits.items() if label.split(":")[0] in ("Lock", "LWLock"))
    io = sum(n for label, n in waits.items() if label.split(":")[0] == "IO")
    return {
        "samples": len(samples),
        "mean_backends": total / len(samples) if samples else None,
        "mean_active": active / len(samples) if samples else None,
        # Of the samples where a backend was active (running a statement): waiting on a lock.
        "lock_wait_share": locks / active if active else None,
        "io_wait_share": io / active if active else None,
        "shares": {label: n / total for label, n in counts.most_common(12)} if total else {},
    }


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after if k in before and after[k] is not None and before[k] is not None}


def per_task(counters: dict[str, float], tasks: int) -> dict[str, float]:
    return {f"{k}_per_task": v / tasks for k, v in counters.items()} if tasks else {}


class Sampler:
    """Samples pg_stat_activity and backend CPU in a thread between start() and stop()."""

    def __init__(self, db_url: str, datname: str, exclude: set[int], every: float = 0.05) -> None:
        self.url, self.datname, self.exclude, self.every = server_url(db_url), datname, exclude, every
        self.conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
        self.samples: list[list[str]] = []
        self.cpu: dict[int, list[float]] = {}  # pid -> [first reading, last reading]
        self.kind: dict[int, str] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pgstats", daemon=True)
        self.error: str | None = None
        self.proc_readable = True

    # ---- counters
    def counters(self) -> dict[str, float]:
        cols = ", ".join(DB_COUNTERS)
        row = self.conn.execute(f"SELECT {cols} FROM pg_stat_database WHERE datname = %s", [self.datname]).fetchone()
        out: dict[str, float] = dict(zip(DB_COUNTERS, map(float, row or ()), strict=False))
        other = self.conn.execute(
            "SELECT coalesce(sum(xact_commit), 0) FROM pg_stat_database WHERE datname IS DISTINCT FROM %s",
            [self.datname],
        ).fetchone()
        out["other_db_xact_commit"] = float(other[0]) if other else 0.0
        try:
            wal = self.conn.execute(f"SELECT {', '.join(WAL_COUNTERS)} FROM pg_stat_wal").fetchone()
            out.update(zip(WAL_COUNTERS, map(float, wal or ()), strict=False))
        except psycopg.Error:  # before PostgreSQL 14
            pass
        return out

    # ---- sampling
    def _cpu(self, pid: int) -> float | None:
        st = procs._stat(pid)
        if st is None:
            if not Path(f"/proc/{pid}").exists():
                return None
            self.proc_readable = False
            return None
        return st[1]

    def _sample(self, read_cpu: bool, first: bool = False) -> None:
        rows = self.conn.execute(ACTIVITY).fetchall()
        labels = []
        for pid, datname, backend_type, state, wait_type, wait_event in rows:
            ours = datname == self.datname and pid not in self.exclude
            if ours and backend_type == "client backend":
                labels.append(state_of(state, wait_type, wait_event))
            if read_cpu and (ours or (backend_type in AUX_TYPES and datname in (None, self.datname))):
                cpu = self._cpu(pid)
                if cpu is None:
                    continue
                kind = "backend" if backend_type == "client backend" else "aux"
                self.kind[pid] = kind
                # A process seen first after the start began after it: all its CPU is in the window.
                base = cpu if first else 0.0
                self.cpu.setdefault(pid, [base, cpu])[1] = cpu
        if not first:
            self.samples.append(labels)

    def _run(self) -> None:
        n = 0
        try:
            while not self.stopped.wait(self.every):
                n += 1
                self._sample(read_cpu=n % 5 == 0)
        except Exception as exc:  # the figures are extra; the drain goes on without them
            self.error = repr(exc)

    def start(self) -> None:
        self.before = self.counters()
        self._sample(read_cpu=True, first=True)
        self.thread.start()

    def stop_sampling(self) -> None:
        """End of the measured window: last CPU reading, sampling ends."""
        self.stopped.set()
        self.thread.join(timeout=10)
        if self.error is None:
            self._sample(read_cpu=True)

    def finish(self, tasks: int) -> dict[str, Any]:
        """After the workers exited: counter deltas and everything over `tasks`."""
        after = self.counters()
        self.conn.close()
        counters = delta(self.before, after)
        cpu = {k: sum(b - a for pid, (a, b) in self.cpu.items() if self.kind.get(pid) == k) for k in ("backend", "aux")}
        return {
            "counters": counters,
            "per_task": per_task({k: v for k, v in counters.items() if k != "other_db_xact_commit"}, tasks),
            "waits": tally(self.samples),
            "pg_cpu_s": cpu if self.proc_readable else None,
            "sampler_error": self.error,
            "note": "WAL counters are cluster-wide; other_db_xact_commit shows other databases' activity",
        }


def wait_for_flush(conn: Any) -> None:
    """Make this backend's pending statistics visible now (PG 15+), so a backlog fill's WAL
    is not reported inside the measured window."""
    with conn.cursor() as cursor:
        try:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute("SELECT 1")
        except Exception:  # noqa: BLE001 (older servers: nothing to do)
            time.sleep(1.1)
