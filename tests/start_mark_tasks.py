"""Tasks for tests/test_start_marks.py: importable by worker subprocesses."""

import os
import signal

from asgiref.sync import sync_to_async
from django.tasks import task

from ox.models import Task


def _marked(task_id: str) -> bool:
    """Whether the task's row carries this attempt's start mark (last_attempted_at)."""
    return Task.objects.filter(pk=task_id).values_list("last_attempted_at", flat=True).get() is not None


@task(takes_context=True, max_attempts=2)
def marked_at_start(context) -> bool:
    """Fails its first attempt; the second returns whether its mark was there before it ran."""
    if context.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return _marked(context.task_result.id)


@task(takes_context=True, max_attempts=2)
async def amarked_at_start(context) -> bool:
    if context.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return await sync_to_async(_marked)(context.task_result.id)


@task
def kills_its_worker() -> None:
    """A task that kills the process running it at once, before any heartbeat."""
    os.kill(os.getpid(), signal.SIGKILL)
