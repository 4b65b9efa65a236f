"""Tasks the browser tests enqueue; importable by worker subprocesses (tests.browser.tasks.*)."""

import os

from django.tasks import task

from tests.testapp.models import Ledger


@task(max_attempts=2)
def flaky(key: str, note: str) -> str:
    """Fails its first two runs (across retries: the ledger counts them), then succeeds."""
    runs = Ledger.objects.filter(key=key).count()
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=runs + 1)
    if runs < 2:
        raise RuntimeError(f"run {runs + 1} fails: {note}")
    return f"succeeded on run {runs + 1}"
