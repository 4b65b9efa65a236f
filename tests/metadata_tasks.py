"""Tasks of tests/test_metadata.py; importable by worker subprocesses."""

import asyncio
import time

from django.tasks import task

from tests.testapp.models import Ledger


@task(takes_context=True)
def progress(context, steps: int, pause: float) -> dict:
    """Reports its progress after each step; returns the metadata it was enqueued with."""
    given = dict(context.metadata)
    for i in range(steps):
        time.sleep(pause)
        context.metadata["progress"] = (i + 1) / steps
        context.save_metadata()
    return given


@task(takes_context=True)
async def aprogress(context, steps: int) -> dict:
    given = dict(context.metadata)
    for i in range(steps):
        await asyncio.sleep(0.01)
        context.metadata["progress"] = (i + 1) / steps
        assert await context.asave_metadata()
    return given


@task(takes_context=True)
def stage_then_fail(context) -> None:
    context.metadata["stage"] = "uploading"  # never saved by the task itself
    raise ValueError("upload refused")


@task(takes_context=True)
def save_nan(context) -> None:
    context.metadata["ratio"] = float("nan")
    context.save_metadata()


@task(takes_context=True)
def stage_until_released(context, key: str) -> None:
    """Saves a stage, then waits (bounded) for the test to write a Ledger row `key`."""
    context.metadata["stage"] = "waiting"
    context.save_metadata()
    deadline = time.monotonic() + 30
    while not Ledger.objects.filter(key=key).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    context.metadata["stage"] = "done"
