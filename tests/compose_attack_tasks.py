"""Tasks of tests/test_attack_compose.py (metadata, steps, tracing under attack); importable
by worker subprocesses."""

import asyncio
import os
import time

from django.db import transaction
from django.tasks import task

import ox
from tests.testapp.models import Ledger


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@task(takes_context=True)
def deep_metadata_at_end(context, depth: int) -> str:
    """Saves a progress, then leaves metadata no database can take (nested too deep)."""
    context.metadata["progress"] = 0.5
    context.save_metadata()
    context.metadata["deep"] = nested(depth)
    return "ok"


@task(takes_context=True, max_attempts=2)
def remembers_attempt_one(context) -> dict:
    """Attempt 1 saves a note and fails; attempt 2 returns the metadata it starts with."""
    if context.attempt == 1:
        context.metadata["first"] = {"attempt": 1, "pid": os.getpid()}
        context.save_metadata()
        raise ValueError("attempt one fails after saving")
    seen = dict(context.metadata)
    seen.pop("otel", None)
    return seen


def _ledger(key: str, attempt: int) -> str:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=attempt)
    return f"ran in attempt {attempt}"


@task(takes_context=True, max_attempts=2)
def step_in_rolled_back_atomic(context, key: str) -> str:
    """The step's record is part of the caller's transaction: rolled back in attempt 1, the
    step runs again in attempt 2."""
    try:
        with transaction.atomic():
            value = ox.step("inside", _ledger, key, context.attempt)
            if context.attempt == 1:
                raise LookupError("roll the step back")
    except LookupError:
        raise ValueError("attempt one rolled its step back") from None
    return value


@task(takes_context=True)
async def async_save_and_step(context, key: str) -> str:
    """An async task that saves its metadata and records a step (both written from threads
    of the event loop's executor)."""
    context.metadata["stage"] = "saving"
    assert await context.asave_metadata()
    value = await ox.astep(f"step-{key}", lambda: key)
    context.metadata["stage"] = "done"
    assert await context.asave_metadata()
    return value


@task(takes_context=True)
def progress_then_note(context, key: str, steps: int, pause: float) -> None:
    """Saves a progress after each step (throttled); the last progress it reached is noted in
    the ledger as `key:<i>`, however it ends."""
    i = 0
    try:
        for i in range(1, steps + 1):
            time.sleep(pause)
            context.metadata["progress"] = i / steps
            context.save_metadata()
    finally:
        Ledger.objects.create(key=f"{key}:{i}", pid=os.getpid(), attempt=context.attempt)


@task(takes_context=True)
async def aprogress_then_note(context, key: str, steps: int) -> None:
    for i in range(1, steps + 1):
        await asyncio.sleep(0.01)
        context.metadata["progress"] = i / steps
        context.metadata[key] = i
        await context.asave_metadata()


@task(max_attempts=2)
def fails_once_traced() -> str:
    if not Ledger.objects.filter(key="fails-once-traced").exists():
        Ledger.objects.create(key="fails-once-traced", pid=os.getpid(), attempt=1)
        raise ValueError("first attempt fails")
    return "second"


@task
def plain_ok() -> str:
    return "ok"
