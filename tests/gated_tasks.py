"""Tasks that hold their worker slot until the test lets them go; importable by worker
subprocesses as tests.gated_tasks.*.

A test that needs a task to be still running when it looks (RUNNING rows, who holds what,
a page showing a drain half done) gates it instead of guessing how long a sleep must be on
a busy machine: the body records that it started, then waits until the gate file exists
(the test opens it with `Path.touch()`). Every wait is bounded by `limit`, so a test that
never opens its gate cannot hang a worker.
"""

import os
import time

from django.tasks import task

from tests.testapp.models import Ledger

LIMIT = 120.0  # seconds a gated body waits at most (a test's own timeouts are shorter)


@task
def hold(key: str, gate: str, limit: float = LIMIT) -> str:
    """Record a ledger row (the body has started), then return once `gate` exists."""
    Ledger.objects.create(key=key, pid=os.getpid())
    deadline = time.monotonic() + limit
    while not os.path.exists(gate):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"gate {gate} not opened within {limit} s")
        time.sleep(0.02)
    return key
