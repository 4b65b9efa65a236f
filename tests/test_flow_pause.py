"""Pausing and resuming queues, run-time limit overrides, and `manage.py ox_queue`."""

import io
import signal
import time

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from ox import enqueue_many
from ox.flow import queues
from ox.flow.waiting import queue_flows, why_waiting
from ox.models import QueueState, Status, Task, Worker
from tests import flow_tasks as f
from tests.helpers import wait_until
from tests.test_durability import options
from tests.test_flow_limits import drained, most_at_once
from tests.testapp.models import Span

pytestmark = pytest.mark.django_db(transaction=True)


def test_pause_stops_claims_at_once_running_tasks_finish_and_resume_restarts(start_worker):
    enqueue_many(f.limited, [((f"p{i}", 0.05), {}) for i in range(400)])
    worker = start_worker("--queues", "emails", "--concurrency", "2", env=options(heartbeat=0.5))
    wait_until(lambda: Span.objects.count() >= 5, timeout=30)
    queues.pause("emails")
    paused_at = time.time()
    time.sleep(2.0)
    started_late = Span.objects.filter(started__gt=paused_at + 1.0).count()
    assert started_late == 0
    # What was running when the pause came finished (no task is left RUNNING).
    wait_until(lambda: not Task.objects.filter(status=Status.RUNNING).exists(), timeout=10)
    assert Span.objects.filter(ended__isnull=True).count() == 0
    waiting = Task.objects.filter(status=Status.READY).count()
    assert waiting > 0
    flow = next(x for x in queue_flows(["emails"]) if x.name == "emails")
    assert flow.view.paused and flow.waiting_on_limit == min(waiting, 10_000)
    assert why_waiting(Task.objects.filter(status=Status.READY).first()) == "queue 'emails' is paused"

    # The pause is in the database: a worker started now does not claim either.
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    again = start_worker("--queues", "emails", "--concurrency", "2", env=options(heartbeat=0.5))
    # Up: its boot (seconds on a busy machine) is neither taken for a pause that holds nor
    # timed in the resume below.
    wait_until(lambda: Worker.objects.filter(pid=again.pid).exists(), timeout=30)
    time.sleep(1.0)
    assert Task.objects.filter(status=Status.READY).count() == waiting

    queues.resume("emails")
    resumed_at = time.time()
    wait_until(lambda: Span.objects.filter(started__gt=resumed_at).exists(), timeout=10)
    first = Span.objects.filter(started__gt=resumed_at).order_by("started").first()
    # PostgreSQL: the resume's NOTIFY wakes the worker at once; SQLite: its next poll (1 s).
    assert first.started - resumed_at < (0.5 if connection.vendor == "postgresql" else 1.5)
    drained(timeout=120)
    again.signal(signal.SIGTERM)


def test_a_limit_set_at_run_time_reaches_running_workers(start_worker):
    """emails has no limit in the settings; an override of concurrency 1 is in force within a
    second on workers already running, and lifting it goes back to parallel."""
    workers = [start_worker("--queues", "emails", "--concurrency", "4", env=options(heartbeat=0.5)) for _ in range(2)]
    wait_until(lambda: len(workers) == 2 and QueueState.objects.count() >= 0, timeout=5)
    queues.set_limits("emails", {"concurrency": 1}, by="test")
    assert QueueState.objects.get(name="emails").limited
    time.sleep(1.5)
    enqueue_many(f.limited, [((f"o{i}", 0.1), {}) for i in range(12)])
    drained(timeout=60)
    assert most_at_once(list(Span.objects.all())) == 1
    Span.objects.all().delete()
    queues.set_limits("emails", {}, by="test")
    time.sleep(1.5)
    enqueue_many(f.limited, [((f"q{i}", 0.2), {}) for i in range(16)])
    drained(timeout=60)
    assert most_at_once(list(Span.objects.all())) >= 3


def test_overrides_are_validated_and_none_lifts_a_setting():
    with pytest.raises(ValueError, match="concurrency"):
        queues.set_limits("emails", {"concurrency": 0})
    with pytest.raises(ValueError, match="rate"):
        queues.set_limits("emails", {"rate": "fast"})
    with pytest.raises(ValueError, match="unknown"):
        queues.set_limits("emails", {"speed": 1})
    assert not QueueState.objects.filter(name="emails").exists()  # nothing written
    state = queues.set_limits("emails", {"rate": "10/m", "concurrency": None})
    # Rates are stored exactly (JSON), not as the text they were given in.
    assert state.overrides == {"rate": {"count": 10, "period": 60.0, "burst": 1}, "concurrency": None}
    assert state.limited
    flow = next(x for x in queue_flows(["emails"]) if x.name == "emails")
    assert str(flow.limits.rate) == "10/m" and flow.limits.concurrency is None


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("ox_queue", *args, stdout=out)
    return out.getvalue()


def test_ox_queue_command():
    assert "emails: paused" in run("pause", "emails")
    assert QueueState.objects.get(name="emails").paused
    assert "emails: paused;" in run("status", "emails")
    assert "emails: resumed" in run("resume", "emails")
    assert not QueueState.objects.get(name="emails").paused
    out = run("limits", "emails", "concurrency=2", "rate=5/s")
    assert "2 at a time" in out and "5/s" in out
    assert QueueState.objects.get(name="emails").overrides == {
        "concurrency": 2,
        "rate": {"count": 5, "period": 1.0, "burst": 1},
    }
    run("limits", "emails", "--reset")
    assert QueueState.objects.get(name="emails").overrides == {}
    assert '"queue": "emails"' in run("status", "--json")
    for bad in (
        ("pause",),
        ("pause", "nosuchqueue"),
        ("limits", "emails", "concurrency=two"),
        ("limits", "emails", "concurrency"),
        ("limits", "emails", "rate=fast"),
        ("limits", "emails"),
    ):
        with pytest.raises(CommandError):
            run(*bad)
