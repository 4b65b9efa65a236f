"""Tasks of the flow-control tests (tests/test_flow_*.py); importable by worker subprocesses."""

import os
import time

from django.tasks import task

from tests.testapp.models import Span


def _span(key: str, group: str, seconds: float) -> str:
    span = Span.objects.create(key=key, group=group, pid=os.getpid(), started=time.time())
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # short sleeps: a cancel or a timeout interrupts it
        time.sleep(min(0.01, max(end - time.monotonic(), 0)))
    Span.objects.filter(pk=span.pk).update(ended=time.time())
    return key


@task(queue_name="emails")
def limited(key: str, seconds: float) -> str:
    """Runs in the queue the tests limit ("emails")."""
    return _span(key, "", seconds)


@task(queue_name="emails", limit_by="account")
def per_account(key: str, seconds: float, account: str = "") -> str:
    return _span(key, account, seconds)


@task(queue_name="reports")
def rated(key: str) -> str:
    return _span(key, "", 0)


@task(queue_name="reports", limit_by=["account"])
def rated_per_account(key: str, account: str) -> str:
    return _span(key, account, 0)


@task(unique=True)
def unique_all(n: int) -> int:
    return n


@task(unique={"by": ["customer"]})
def unique_customer(customer: str, note: str = "") -> str:
    return customer


@task(unique={"by": ["customer"], "on_duplicate": "raise"})
def unique_or_raise(customer: str) -> str:
    return customer


@task(unique={"by": ["n"], "states": ["SUCCESSFUL"]})
def unique_ever(n: int) -> int:
    return n


@task(unique={"by": ["n"], "period": 3600})
def unique_hourly(n: int) -> int:
    return n


@task(unique=True, max_attempts=1)
def unique_fails(n: int) -> None:
    raise ValueError(f"fails {n}")


@task(unique=True)
def unique_sleep(key: str, seconds: float) -> str:
    return _span(key, "", seconds)


@task(unique=True, max_attempts=2, takes_context=True)
def unique_fails_once(context, n: int) -> int:
    if context.attempt == 1:
        raise ValueError("first attempt fails")
    return n


@task(unique=True)
def unique_defaults(n: int = 1, *, label: str = "x") -> int:
    return n


@task(queue_name="emails")
async def limited_async(key: str, seconds: float) -> str:
    """An async task of the limited queue: its slots are shared with the sync ones."""
    import asyncio

    span = await Span.objects.acreate(key=key, group="async", pid=os.getpid(), started=time.time())
    await asyncio.sleep(seconds)
    await Span.objects.filter(pk=span.pk).aupdate(ended=time.time())
    return key
