"""Tasks of tests/test_workflows.py (chains and groups, ox.workflow); importable by worker
subprocesses. Each run of a body leaves a Ledger row, so a test counts runs, not statuses."""

import os

from django.tasks import task

from tests.testapp.models import Ledger


@task()
def add(x: int, y: int, key: str = "add") -> int:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    return x + y


@task()
def total(values: list, key: str = "total") -> int:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    return sum(v for v in values if v is not None)


@task()
def shout(text: str) -> str:
    return text.upper() + "!"


@task()
def echo_all(*args: object) -> list:
    return list(args)


@task()
def boom(key: str = "boom") -> None:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    raise RuntimeError("boom")


@task()
def on_failure(info: dict, key: str = "on_failure") -> dict:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    return info


@task()
async def async_add(x: int, y: int) -> int:
    return x + y


@task()
def member(n: int, pause: float = 0.0) -> int:
    """A group member: records its run, sleeps a little (so a worker is killed mid-member)."""
    Ledger.objects.create(key=f"m{n}", pid=os.getpid(), attempt=1)
    if pause:
        import time

        time.sleep(pause)
    return n


@task()
def count_members(values: list) -> int:
    Ledger.objects.create(key="callback", pid=os.getpid(), attempt=1)
    return len(values) * 1_000_000 + sum(values)


@task()
def flaky(*before: object, key: str, marker: str) -> str:
    """Fails until the file `marker` exists: a failure the operator fixes, then retries."""
    from pathlib import Path

    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    if not Path(marker).exists():
        raise RuntimeError("not yet")
    return key


@task()
def slow_step(*before: object, seconds: float = 1.0) -> str:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # short sleeps: a cancel's interrupt lands between them
        time.sleep(0.05)
    return "slow"
