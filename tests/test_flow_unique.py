"""Unique tasks (ox.flow.unique): the key, the states that hold it, duplicates answered or
refused, enforced by the database under concurrent producers."""

import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.tasks.exceptions import InvalidTask

from ox import enqueue_many, is_duplicate
from ox.flow.unique import DuplicateTask, Unique
from ox.models import Status, Task
from tests import flow_tasks as f
from tests.conftest import ROOT, database_url
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def rows(task) -> list[Task]:
    return list(Task.objects.filter(task_path=task.module_path).order_by("id"))


def test_same_arguments_answer_with_the_existing_task():
    a = f.unique_all.enqueue(1)
    b = f.unique_all.enqueue(1)
    c = f.unique_all.enqueue(2)
    assert b.id == a.id and is_duplicate(b) and not is_duplicate(a)
    assert c.id != a.id and not is_duplicate(c)
    assert len(rows(f.unique_all)) == 2
    assert b.status == "READY" and b.args == [1]


def test_key_from_named_arguments_only():
    a = f.unique_customer.enqueue(customer="acme", note="first")
    b = f.unique_customer.enqueue(customer="acme", note="second")
    assert b.id == a.id and is_duplicate(b)
    assert f.unique_customer.enqueue(customer="other").id != a.id


def test_a_missing_key_argument_is_a_clear_error_and_writes_nothing():
    with pytest.raises(InvalidTask, match="customer"):
        f.unique_customer.enqueue(note="no customer")
    # Positional or keyword: the same call, one task (bound to the function's signature).
    a = f.unique_customer.enqueue("acme")
    assert f.unique_customer.enqueue(customer="acme").id == a.id
    assert len(rows(f.unique_customer)) == 1


def test_on_duplicate_raise():
    first = f.unique_or_raise.enqueue(customer="x")
    with pytest.raises(DuplicateTask) as info:
        f.unique_or_raise.enqueue(customer="x")
    assert info.value.existing.id == first.id
    assert len(rows(f.unique_or_raise)) == 1


def test_per_call_key_overrides_the_arguments():
    a = f.unique_all.using(unique_key="nightly").enqueue(1)
    b = f.unique_all.using(unique_key="nightly").enqueue(2)
    assert b.id == a.id and is_duplicate(b)
    # The same task without the per-call key: its own key from the arguments.
    assert not is_duplicate(f.unique_all.enqueue(2))
    # A plain task made unique per call.
    c = f.rated.using(unique_key="once").enqueue("x")
    assert f.rated.using(unique_key="once").enqueue("y").id == c.id


def test_the_key_is_freed_when_the_task_finishes(start_worker):
    a = f.unique_all.enqueue(7)
    worker = start_worker("--batch")
    assert worker.wait(timeout=60) == 0
    assert Task.objects.get(pk=a.id).status == Status.SUCCESSFUL
    b = f.unique_all.enqueue(7)
    assert b.id != a.id and not is_duplicate(b)


def test_running_holds_the_key(start_worker, tmp_path):
    a = f.unique_sleep.enqueue("held", 3.0)
    start_worker()
    wait_until(lambda: Task.objects.get(pk=a.id).status == Status.RUNNING, timeout=30)
    b = f.unique_sleep.enqueue("held", 3.0)
    assert b.id == a.id and b.status in ("READY", "RUNNING")


def test_finished_states_hold_when_asked(start_worker):
    # unique_ever: SUCCESSFUL also holds, so a finished task keeps refusing duplicates.
    a = f.unique_ever.enqueue(n=1)
    assert start_worker("--batch").wait(timeout=60) == 0
    assert Task.objects.get(pk=a.id).status == Status.SUCCESSFUL
    b = f.unique_ever.enqueue(n=1)
    assert b.id == a.id and is_duplicate(b) and b.status == "SUCCESSFUL"


def test_a_failed_task_frees_the_key_and_its_retry_is_refused_while_another_holds_it(start_worker):
    from ox import retry

    a = f.unique_fails.enqueue(3)
    assert start_worker("--batch").wait(timeout=60) == 0
    assert Task.objects.get(pk=a.id).status == Status.FAILED
    b = f.unique_fails.enqueue(3)  # FAILED does not hold: a new task takes the key
    assert b.id != a.id
    changed = retry([a.id])
    assert changed.retried == 0 and changed.duplicates == 1
    assert Task.objects.get(pk=a.id).status == Status.FAILED
    Task.objects.filter(pk=b.id).update(status=Status.CANCELLED)
    assert retry([a.id]).retried == 1


def test_period_windows():
    a = f.unique_hourly.enqueue(n=1)
    row = Task.objects.get(pk=a.id)
    assert row.unique_until is not None and timedelta(0) < row.unique_until - row.enqueued_at <= timedelta(hours=1)
    assert f.unique_hourly.enqueue(n=1).id == a.id
    # Another window: the key differs, so the same arguments enqueue again.
    Task.objects.filter(pk=a.id).update(unique_key="0" * 64)
    assert f.unique_hourly.enqueue(n=1).id != a.id


def test_enqueue_many_dedupes_within_the_batch_and_against_the_table():
    existing = f.unique_all.enqueue(1)
    results = enqueue_many(f.unique_all, [((5,), {}), ((5,), {}), ((1,), {}), ((6,), {})])
    assert [is_duplicate(r) for r in results] == [False, True, True, False]
    assert results[1].id == results[0].id and results[2].id == existing.id
    assert sorted(r.args[0] for r in rows(f.unique_all)) == [1, 5, 6]


def test_enqueue_many_raise_writes_nothing_of_the_batch():
    f.unique_or_raise.enqueue(customer="b")
    with pytest.raises(DuplicateTask):
        enqueue_many(f.unique_or_raise, [((), {"customer": "a"}), ((), {"customer": "b"})])
    assert [r.kwargs for r in rows(f.unique_or_raise)] == [{"customer": "b"}]


def test_a_duplicate_inside_a_transaction_does_not_break_it():
    with transaction.atomic():
        a = f.unique_all.enqueue(11)
        b = f.unique_all.enqueue(11)
        assert b.id == a.id
        Task.objects.count()  # the transaction is still usable (PostgreSQL: not aborted)
    assert len(rows(f.unique_all)) == 1


def test_bad_unique_options_are_refused():
    for bad in ({"states": ["DONE"]}, {"period": -1}, {"period": float("nan")}, {"by": [True]}, {"nope": 1}, 3):
        with pytest.raises(InvalidTask):
            f.unique_all.using(unique=bad)
    with pytest.raises(InvalidTask):
        Unique(on_duplicate="ignore")
    with pytest.raises(InvalidTask):
        f.unique_all.using(unique_key="")
    # READY and RUNNING always hold, whatever states say.
    assert Unique(states=["SUCCESSFUL"]).states == ("READY", "RUNNING", "SUCCESSFUL")


def test_odd_argument_values_make_stable_keys():
    a = f.unique_customer.enqueue(customer="\U0001f600 ünï")
    assert f.unique_customer.enqueue(customer="\U0001f600 ünï").id == a.id
    big = f.unique_all.enqueue(10**30)
    assert f.unique_all.enqueue(10**30).id == big.id
    # Key order of a dict argument does not matter; the values do.
    x = f.unique_all.enqueue({"a": 1, "b": 2})
    assert f.unique_all.enqueue({"b": 2, "a": 1}).id == x.id
    with pytest.raises(InvalidTask):
        f.unique_all.enqueue("\ud800")  # a lone surrogate is refused, nothing written
    with pytest.raises(InvalidTask):
        f.unique_all.enqueue(float("nan"))


PRODUCER = textwrap.dedent(
    """
    import os, sys, time
    import django
    django.setup()
    from tests import flow_tasks as f
    from ox import is_duplicate
    start = float(sys.argv[1])
    while time.time() < start:
        time.sleep(0.001)
    out = []
    for i in range(int(sys.argv[2])):
        r = f.unique_customer.enqueue(customer="race-%d" % i)
        out.append("%s %d" % (r.id, is_duplicate(r)))
    print("\\n".join(out))
    """
)


def test_eight_processes_enqueue_the_same_keys_at_once():
    """8 producer processes enqueue the same 50 keys at the same instant: exactly one row
    per key, and every producer was answered with that row."""
    import os
    import time

    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    start = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PRODUCER, str(start), "50"], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    answers = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        answers.append([line.split() for line in out.strip().splitlines()])
    stored = {r.kwargs["customer"]: str(r.id) for r in rows(f.unique_customer)}
    assert len(stored) == 50 and Task.objects.filter(task_path=f.unique_customer.module_path).count() == 50
    fresh = 0
    for answer in answers:
        assert [task_id for task_id, _dup in answer] == [stored[f"race-{i}"] for i in range(50)]
        fresh += sum(1 for _id, dup in answer if dup == "0")
    assert fresh == 50  # each key was inserted by exactly one producer
    assert connection.vendor in ("sqlite", "postgresql", "mysql")


def test_a_duplicate_sends_no_task_enqueued_signal():
    from django.tasks.signals import task_enqueued

    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        a = f.unique_all.enqueue(21)
        f.unique_all.enqueue(21)
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [a.id]


def test_a_task_waiting_for_its_retry_keeps_its_key(start_worker):
    """RUNNING back to READY (a retry after a failed attempt) never leaves the unique index."""
    a = f.unique_fails_once.using(priority=0).enqueue(5)
    worker = start_worker(env={"OX_TEST_OPTIONS": '{"BACKOFF_BASE": 30, "BACKOFF_MAX": 30}'})
    wait_until(lambda: Task.objects.get(pk=a.id).attempts == 1 and Task.objects.get(pk=a.id).status == "READY")
    b = f.unique_fails_once.enqueue(5)
    assert b.id == a.id and is_duplicate(b)
    worker.signal(15)


def test_pruning_frees_a_held_key_and_the_archiver_keeps_held_rows(start_worker):
    from datetime import timedelta

    from django.db import connection

    from ox import clock
    from ox.archive import archive
    from ox.prune import prune

    a = f.unique_ever.enqueue(n=9)
    plain = f.unique_all.enqueue(9)
    assert start_worker("--batch").wait(timeout=60) == 0
    later = clock.db_now(connection) + timedelta(hours=1)
    moved = archive(connection, timedelta(0), later)
    # unique_all's finished row does not hold its key (READY and RUNNING only): archived.
    # unique_ever's SUCCESSFUL row holds its key: it stays in ox_task.
    assert moved.total == 1
    assert Task.objects.filter(pk=a.id).exists() and not Task.objects.filter(pk=plain.id).exists()
    assert f.unique_ever.enqueue(n=9).id == a.id
    prune(connection, {"SUCCESSFUL": timedelta(0)}, later)
    assert not Task.objects.filter(pk=a.id).exists()
    fresh = f.unique_ever.enqueue(n=9)
    assert fresh.id != a.id and not is_duplicate(fresh)


def test_aenqueue_of_a_duplicate():
    import asyncio
    import threading

    async def go():
        return await f.unique_all.aenqueue(31), await f.unique_all.aenqueue(31)

    # A loop of its own in a thread of its own: the browser tests' session leaves one running
    # in this thread, where async_to_sync refuses to start.
    out = []
    thread = threading.Thread(target=lambda: out.append(asyncio.run(go())))
    thread.start()
    thread.join(timeout=60)
    a, b = out[0]
    assert b.id == a.id and is_duplicate(b) and not is_duplicate(a)
    assert len(rows(f.unique_all)) == 1


def test_a_scheduled_task_holds_its_key():
    """READY with a run_after in the future is READY: a duplicate enqueued now (due now) is
    answered with the scheduled one, not let in beside it."""
    later = f.unique_all.using(run_after=timedelta(hours=1)).enqueue(41)
    now = f.unique_all.enqueue(41)
    assert now.id == later.id and is_duplicate(now)


def test_the_call_is_bound_to_the_signature_defaults_filled_in():
    a = f.unique_defaults.enqueue()
    assert f.unique_defaults.enqueue(1).id == a.id
    assert f.unique_defaults.enqueue(n=1, label="x").id == a.id
    assert f.unique_defaults.enqueue(2).id != a.id
    assert f.unique_defaults.enqueue(label="y").id != a.id
