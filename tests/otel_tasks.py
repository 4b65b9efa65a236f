"""Tasks of tests/test_tracing.py."""

import asyncio

from django.tasks import task


@task
def traced_ok() -> str:
    return "ok"


@task(max_attempts=1)
def traced_fails() -> None:
    raise LookupError("no such invoice")


@task
async def traced_async_child() -> str:
    from opentelemetry import trace

    await asyncio.sleep(0)
    with trace.get_tracer("tests").start_as_current_span("inside the task"):
        await asyncio.sleep(0)
    return "ok"
