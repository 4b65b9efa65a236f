"""Tasks of tests/test_attack_key_prefetch.py; importable by worker subprocesses."""

import asyncio
import os
import time

from django.tasks import task

from tests.flow_tasks import _span
from tests.testapp.models import Span


@task(queue_name="emails", limit_by="account")
async def per_account_async(key: str, seconds: float, account: str = "") -> str:
    """An async task of the key-limited queue, keyed like tests.flow_tasks.per_account."""
    span = await Span.objects.acreate(key=key, group=account, pid=os.getpid(), started=time.time())
    await asyncio.sleep(seconds)
    await Span.objects.filter(pk=span.pk).aupdate(ended=time.time())
    return key


@task(queue_name="emails", limit_by="account", timeout=0.5, max_attempts=1)
def per_account_timed(key: str, seconds: float, account: str = "") -> str:
    """A keyed task with a 0.5 s timeout (counted from its start)."""
    return _span(key, account, seconds)


@task(queue_name="other")
def other_queue(key: str, seconds: float) -> str:
    """A task of an unlimited queue ("other")."""
    return _span(key, "other", seconds)
