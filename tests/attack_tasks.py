"""Tasks for tests/test_attack.py (an adversarial review of the worker's promises);
importable by worker subprocesses (tests.attack_tasks.*)."""

import asyncio
import os
from datetime import timedelta

from django.tasks import task
from django.tasks.signals import task_finished

from tests.testapp.models import Ledger


@task
async def async_nap(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


@task
def huge_string(length: int) -> str:
    # A value each database column would take on its own terms, but jsonb strings stop at
    # 268,435,455 bytes (PostgreSQL raises program_limit_exceeded, an OperationalError).
    return "x" * length


# An exception class whose dotted path is longer than ox_attempt.exception_class_path
# (varchar 255): what a generated class (a mock, an ORM's DoesNotExist of a long model) gives.
LongNamedError = type("LongNamedError" + "X" * 300, (Exception,), {})


@task(max_attempts=1)
def raises_long_named() -> None:
    raise LongNamedError("a perfectly ordinary failure")


def _an_hour(exc, result):
    return timedelta(hours=1)


@task(max_attempts=2, backoff=_an_hour)
def fails_and_retries_in_an_hour() -> None:
    raise RuntimeError("try again later")


@task(max_attempts=1)
def takes_one(a: int) -> int:
    return a


def _finished(sender, task_result, **kwargs) -> None:
    # Django's backends send task_finished for every task that finishes, failed ones too.
    if task_result.task.module_path.startswith("tests.attack_tasks."):
        Ledger.objects.create(key=f"finished:{task_result.id}:{task_result.status}", pid=os.getpid())


task_finished.connect(_finished, dispatch_uid="tests.attack_tasks.finished")


def _leave(exc, result):
    raise SystemExit("a policy that calls sys.exit()")


@task(max_attempts=3, backoff=_leave)
def backoff_exits() -> None:
    raise RuntimeError("fails, then the backoff exits")


@task
def upsets_a_receiver() -> str:
    return "fine"


def _exits_for_one_task(sender, task_result, **kwargs) -> None:
    # A receiver that calls sys.exit() (or meets a KeyboardInterrupt) for one task.
    if task_result.task.module_path == "tests.attack_tasks.upsets_a_receiver":
        raise SystemExit("a receiver that exits")


task_finished.connect(_exits_for_one_task, dispatch_uid="tests.attack_tasks.exits_for_one_task")


@task(timeout=0.3, max_attempts=1)
async def async_ignores_its_timeout(seconds: float) -> str:
    # The async twin of tests.tasks.ignores_interrupt: swallows the cancellation.
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        try:
            await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            continue
    return "finished anyway"
