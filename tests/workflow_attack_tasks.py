"""Tasks of tests/test_attack_workflows.py (attacks on ox.workflow); importable by worker
subprocesses. Each run of a body leaves a Ledger row, so a test counts runs, not statuses."""

import os
import time

from django.tasks import task

from tests.testapp.models import Ledger


@task()
def add(x: int, y: int, key: str = "add") -> int:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    return x + y


@task()
def echo_all(*args: object, key: str = "echo") -> list:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    return list(args)


@task()
def big(size: int) -> str:
    return "x" * size


@task()
def describe(value: object, key: str = "describe") -> dict:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    return {"type": type(value).__name__, "len": len(value) if hasattr(value, "__len__") else None}


@task()
def odd(kind: str) -> object:
    """Values at JSON's edges: non-ASCII, escapes, big numbers, nesting."""
    return {
        "text": "é\u2028\"'\\]}, ,[ \U0001f600",
        "big": 2**62,
        "neg": -(2**62),
        "float": 1.5,
        "nested": [[[{"a": None}]]],
        "kind": kind,
    }


@task()
def same(value: object) -> object:
    return value


@task(max_attempts=1)
def failing_handler(info: dict, key: str = "handler") -> None:
    """An on-failure task that fails itself."""
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    raise RuntimeError("the handler fails too")


@task()
def handler(info: dict, key: str = "handler") -> dict:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    return info


@task()
def flaky(*before: object, key: str, marker: str) -> str:
    from pathlib import Path

    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    if not Path(marker).exists():
        raise RuntimeError("not yet")
    return key


@task()
def slow(*before: object, seconds: float = 1.0, key: str = "slow") -> str:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return "slow"


@task(max_attempts=3)
def fails_then(*before: object, key: str, times: int) -> list:
    """Fails its first `times` attempts (counted in the ledger), then returns its inputs."""
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    if Ledger.objects.filter(key=key).count() <= times:
        raise RuntimeError("not yet")
    return [key, *before]
