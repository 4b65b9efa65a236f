"""Settings every arm shares. Each arm's module adds its app and its TASKS entry, so each arm
runs in its own process with only its own queue app installed.

Environment (set by the harness, read by the agent and the worker processes alike):
  BENCH_DB_URL        the arm's database (dj-database-url syntax)
  BENCH_CONN_MAX_AGE  Django CONN_MAX_AGE (default 0, Django's own default)
  BENCH_POOL          "1": Django's psycopg pool (PostgreSQL only; CONN_MAX_AGE forced to 0)
"""

import os

import dj_database_url

DEBUG = False  # DEBUG=True keeps every query in memory: it would skew RSS and CPU
SECRET_KEY = "bench-only-not-secret"  # noqa: S105
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS: list[str] = ["django.contrib.contenttypes"]

# The same SQLite pragmas for every arm (they are oxproject's): WAL, IMMEDIATE, 30 s busy wait.
SQLITE_OPTIONS = {
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
}

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("BENCH_DB_URL", "postgres://postgres@127.0.0.1:5432/oxbench_ox"),
        conn_max_age=int(os.environ.get("BENCH_CONN_MAX_AGE", "0")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = dict(SQLITE_OPTIONS)
elif DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # oxproject's MariaDB settings, the same for every arm.
    DATABASES["default"]["OPTIONS"] = {"charset": "utf8mb4", "isolation_level": "read committed"}
elif os.environ.get("BENCH_POOL") == "1":
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # Django refuses a pool with a persistent connection
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = True

# Quiet workers: per-task INFO logging would cost every arm I/O the benchmark is not about.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {name: {"level": "WARNING"} for name in ("django.tasks", "ox", "django_ox", "django_tasks_db")},
}
