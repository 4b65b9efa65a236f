"""The environment a run was measured in (no Django needed)."""

import hashlib
import os
import platform
import sqlite3
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parent.parent
PACKAGES = (
    "Django",
    "django-ox",
    "django-tasks-db",
    "pgqueuer",
    "asyncpg",  # pgqueuer's workers' driver
    "uvloop",  # their event loop, as `pgq run` picks it
    "procrastinate",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "asgiref",
)
PG_SETTINGS = (
    "max_connections",
    "shared_buffers",
    "work_mem",
    "synchronous_commit",
    "fsync",
    "wal_level",
    "max_wal_size",
    "checkpoint_timeout",
    "autovacuum",
    "jit",
    "shared_preload_libraries",
)


def _git(*args: str) -> str:
    try:
        return subprocess.run(  # noqa: S603
            ["git", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,  # noqa: S607
        ).stdout.rstrip("\n")  # keep leading spaces: `status --porcelain` columns start there
    except (OSError, subprocess.TimeoutExpired):
        return ""


def ox_tree_sha1() -> str:
    """A hash of ox/'s Python source as measured: the tree may be ahead of the commit."""
    digest = hashlib.sha1()  # noqa: S324  (a fingerprint, not security)
    for path in sorted((REPO / "ox").rglob("*.py")):
        digest.update(str(path.relative_to(REPO)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def git_info() -> dict[str, Any]:
    return {
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": [line[3:] for line in _git("status", "--porcelain", "--", "ox").splitlines()],
        "ox_tree_sha1": ox_tree_sha1(),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def load_average() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def postgres(conninfo: str) -> dict[str, Any]:
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
        version = conn.execute("SELECT version()").fetchone()[0]
        settings = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in PG_SETTINGS}
    return {"version": version, "settings": settings}


def collect(pg_conninfo: str) -> dict[str, Any]:
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    packages = {}
    for name in PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "memory_mb": mem_kb // 1024,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "django": packages["Django"],
        "packages": packages,
        "postgresql": postgres(pg_conninfo),
        "sqlite": sqlite3.sqlite_version,
        "load_average_start": load_average(),
    }
