"""A worker refills a freed slot at once while its backlog lasts, not at its next poll.

Found by the bench cell progress_metadata (1,000 one-second async tasks, 100 at once): the
worker's claim for async tasks got all it asked, its claim for sync tasks (none enqueued) came
back short, so it marked itself waiting for enqueues; a finished async task then was no reason
to claim (a waiting worker is woken by enqueues), and 100 free slots waited for the poll, a
second each round (74 tasks/s where 100 were possible). Now each kind remembers whether its last
claim got all it asked (ox.claims.Claims.full): a slot of that kind freeing claims at once.
Every database; real worker processes; the poll is 60 s, so a drain that waits for it fails."""

import json

import pytest

import ox
from ox.models import Status, Task
from tests import tasks
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _options(**values: object) -> dict[str, str]:
    return {"OX_TEST_OPTIONS": json.dumps({k.upper(): v for k, v in values.items()})}


def _drained(n: int) -> bool:
    return Task.objects.filter(status=Status.SUCCESSFUL).count() >= n


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_backlog_of_one_kind_drains_without_waiting_for_the_poll(start_worker, kind):
    task = tasks.async_sleep if kind == "async" else tasks.sleep_for
    # Five rounds of three slots: about 1.5 s of task time, five polls' worth of waiting if a
    # freed slot waited for the poll. Enqueued before the worker starts: its first claim finds
    # them on every database (SQLite has no wake-up on enqueue).
    ox.enqueue_many(task, [((0.3,), {})] * 15)
    worker = start_worker("--concurrency", "3", "--async-concurrency", "3", env=_options(poll_interval=60, prefetch=0))
    wait_until(lambda: _drained(15), timeout=30, interval=0.1)
    worker.signal(15)
    assert worker.wait(30) == 0
