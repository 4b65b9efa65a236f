"""Run a management command (a worker) for the arm named by DJANGO_SETTINGS_MODULE, like a
project's manage.py. With BENCH_SQL_COUNT_FILE set, count what the process sends through
Django's database layer and write the counts there when it exits:

  executes  cursor execute/executemany/callproc calls (one statement each)
  begins    set_autocommit(False) (an atomic() block: psycopg sends BEGIN before its first statement)
  commits   connection commit() / rollback() calls

Raw BEGIN/COMMIT sent with cursor.execute (ox does this) count as executes. The counter is a
few attribute increments per statement; the same wrapper runs for every arm.

With BENCH_PROFILE_SQL=1 as well (a profiling run, not a measurement: the timer costs two
clock reads and a dict update per statement), each statement's calls and seconds (the
round trip, lock waits included) are summed per statement text (whitespace collapsed, the
first 100 characters) and written next to the counts, to <count file stem>.timing.json.
"""

import atexit
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

COUNTS = {"executes": 0, "begins": 0, "commits": 0}
TIMES: dict[str, list[float]] = {}  # statement text -> [calls, seconds]


def timing_file(count_file: str | Path) -> Path:
    path = Path(count_file)
    return path.with_name(path.name.removesuffix(".json") + ".timing.json")


def _dump() -> None:
    path = os.environ.get("BENCH_SQL_COUNT_FILE")
    if path:
        with open(path, "w") as fh:
            json.dump(COUNTS, fh)
        if TIMES:
            timing_file(path).write_text(json.dumps(TIMES))


def install_timer() -> None:
    """Sum each statement's round-trip time by its text (BENCH_PROFILE_SQL=1)."""
    from django.db.backends.utils import CursorWrapper

    def timed(original: Any) -> Any:
        def wrapper(self: Any, sql: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(self, sql, *args, **kwargs)
            finally:
                record = TIMES.setdefault(" ".join(str(sql).split())[:100], [0, 0.0])
                record[0] += 1
                record[1] += time.perf_counter() - started

        return wrapper

    for name in ("execute", "executemany"):
        setattr(CursorWrapper, name, timed(getattr(CursorWrapper, name)))


def install_counter() -> None:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import CursorWrapper

    def counted(original: Any, key: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            COUNTS[key] += 1
            return original(*args, **kwargs)

        return wrapper

    for name in ("execute", "executemany", "callproc"):
        setattr(CursorWrapper, name, counted(getattr(CursorWrapper, name), "executes"))
    for name in ("commit", "rollback"):
        setattr(BaseDatabaseWrapper, name, counted(getattr(BaseDatabaseWrapper, name), "commits"))
    original_set_autocommit = BaseDatabaseWrapper.set_autocommit

    def set_autocommit(self: Any, autocommit: bool, *args: Any, **kwargs: Any) -> Any:
        if not autocommit:
            COUNTS["begins"] += 1
        return original_set_autocommit(self, autocommit, *args, **kwargs)

    BaseDatabaseWrapper.set_autocommit = set_autocommit  # type: ignore[method-assign]
    # Workers may leave through os._exit (ox does, on purpose): write the counts first.
    real_exit = os._exit

    def exit_with_counts(code: int) -> None:
        _dump()
        real_exit(code)

    os._exit = exit_with_counts  # type: ignore[assignment]
    atexit.register(_dump)


def main() -> None:
    from django.core.management import execute_from_command_line

    if os.environ.get("BENCH_SQL_COUNT_FILE"):
        if os.environ.get("BENCH_PROFILE_SQL") == "1":
            install_timer()
        install_counter()
    execute_from_command_line(["launch", *sys.argv[1:]])


if __name__ == "__main__":
    main()
