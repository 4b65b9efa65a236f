"""Periodic tasks: tick arithmetic, exactly-once firing under races (threads and real
workers), the missed-tick policy, and the dashboard's schedule_status()."""

import json
import signal
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.tasks import task_backends
from django.test import override_settings

from ox.connection import open_worker_connection
from ox.models import Task, Tick
from ox.periodic import KEEP_TICKS, LATE_AFTER, Ticker, schedule_status
from ox.schedules import Schedule, ScheduleError, parse_schedule
from tests.helpers import wait_until
from tests.settings import TASKS

NOW = datetime(2026, 3, 10, 12, 0, 30, tzinfo=UTC)


def every(seconds, **extra):
    return parse_schedule("beat", {"task": "tests.tasks.echo", "every": seconds, "args": ["hi"], **extra})


def cron(expression, **extra):
    return parse_schedule("nightly", {"task": "tests.tasks.echo", "cron": expression, "args": [1], **extra})


# ---------------------------------------------------------------- tick arithmetic


def test_every_ticks_are_aligned_to_the_epoch():
    s = every(60)
    assert s.latest_tick(NOW) == datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    assert s.next_tick(NOW) == datetime(2026, 3, 10, 12, 1, tzinfo=UTC)
    assert s.latest_tick(datetime(2026, 3, 10, 12, 1, tzinfo=UTC)) == datetime(2026, 3, 10, 12, 1, tzinfo=UTC)
    assert s.ticks_between(s.latest_tick(NOW) - timedelta(minutes=5), s.latest_tick(NOW)) == 4


def test_cron_ticks_in_utc_and_in_a_time_zone():
    s = cron("0 3 * * *")
    assert s.latest_tick(NOW) == datetime(2026, 3, 10, 3, 0, tzinfo=UTC)
    assert s.next_tick(NOW) == datetime(2026, 3, 11, 3, 0, tzinfo=UTC)
    assert s.ticks_between(datetime(2026, 3, 1, 3, 0, tzinfo=UTC), s.latest_tick(NOW)) == 8
    paris = cron("0 3 * * *", timezone="Europe/Paris")  # UTC+1 in March before the switch
    assert paris.latest_tick(NOW) == datetime(2026, 3, 10, 2, 0, tzinfo=UTC)


def test_cron_tick_in_a_dst_gap_never_lands_after_now():
    # 2026-03-29 02:30 does not exist in Paris; ticks must still be <= now and > now.
    s = cron("30 2 * * *", timezone="Europe/Paris")
    now = datetime(2026, 3, 29, 1, 5, tzinfo=UTC)  # 03:05 local, just after the jump
    assert s.latest_tick(now) <= now
    assert s.next_tick(now) > now


@pytest.mark.parametrize(
    ("spec", "check_id"),
    [
        ({"task": "tests.tasks.echo"}, "ox.E002"),
        ({"task": "tests.tasks.echo", "cron": "* * * * *", "every": 5}, "ox.E002"),
        ({"task": "tests.tasks.echo", "every": 0}, "ox.E002"),
        ({"task": "tests.tasks.echo", "every": 1.5}, "ox.E002"),
        ({"task": "tests.tasks.echo", "every": 5, "missed": "all"}, "ox.E002"),
        ({"task": "tests.tasks.echo", "every": 5, "timezone": "Mars/Olympus"}, "ox.E002"),
        ({"task": "tests.tasks.echo", "every": 5, "when": "now"}, "ox.E002"),
        ({"task": "tests.tasks.echo", "cron": "61 * * * *"}, "ox.E003"),
    ],
)
def test_bad_schedules_are_refused_with_their_check_id(spec, check_id):
    with pytest.raises(ScheduleError) as info:
        parse_schedule("s", spec)
    assert info.value.check_id == check_id


# ---------------------------------------------------------------- firing on a connection

# Firing runs on separate connections (threads, worker subprocesses): committed data.
db = pytest.mark.django_db(transaction=True)


def backend():
    return task_backends["default"]


@db
def test_a_tick_fires_once_and_enqueues_its_task():
    s = every(60)
    ticker = Ticker(backend(), [s])
    assert ticker.fire(connection, s, s.latest_tick(NOW), NOW) is True
    assert ticker.fire(connection, s, s.latest_tick(NOW), NOW) is False  # the loser enqueues nothing
    tick = Tick.objects.get()
    task = Task.objects.get()
    assert tick.task_id == task.id and tick.tick_at == s.latest_tick(NOW) and tick.missed == 0
    assert task.task_path == "tests.tasks.echo" and task.args == ["hi"] and task.queue == "default"


@db
def test_queue_and_priority_overrides_reach_the_task():
    s = every(60, queue="reports", priority=7)
    Ticker(backend(), [s]).fire(connection, s, s.latest_tick(NOW), NOW)
    task = Task.objects.get()
    assert (task.queue, task.priority) == ("reports", 7)


@db
def test_ticker_run_fires_each_due_tick_once():
    s = every(60)
    ticker = Ticker(backend(), [s])
    ticker.run(connection, NOW)  # no rows yet: 12:00 is not fired, the schedule starts at 12:01
    ticker.run(connection, NOW + timedelta(seconds=40))  # the next tick
    ticker.run(connection, NOW + timedelta(seconds=50))  # same tick: nothing new
    ticker.run(connection, NOW + timedelta(seconds=90))  # the one after
    assert list(Tick.objects.order_by("tick_at").values_list("tick_at", flat=True)) == [
        datetime(2026, 3, 10, 12, 1, tzinfo=UTC),
        datetime(2026, 3, 10, 12, 2, tzinfo=UTC),
    ]
    assert Task.objects.count() == 2


@db
def test_threads_racing_on_their_own_connections_fire_a_tick_once():
    s = every(60)
    due = s.latest_tick(NOW)
    barrier = threading.Barrier(6)
    results, errors = [], []

    def race():
        conn = open_worker_connection("default")
        try:
            barrier.wait(timeout=10)
            results.append(Ticker(backend(), [s]).fire(conn, s, due, NOW))
        except Exception as exc:
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=race) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert sorted(results) == [False] * 5 + [True]
    assert Tick.objects.count() == 1 and Task.objects.count() == 1


@db
def test_missed_ticks_latest_fires_once_late_and_older_ones_are_counted():
    s = every(60)
    Tick.objects.create(schedule="beat", tick_at=NOW - timedelta(minutes=10, seconds=30), fired_at=NOW)
    late_now = NOW + timedelta(minutes=3)  # found 3 minutes after the due tick
    Ticker(backend(), [s]).run(connection, late_now)
    newest = Tick.objects.order_by("-tick_at").first()
    assert newest.tick_at == s.latest_tick(late_now)
    assert newest.missed == 12  # 11:51 .. 12:02 were skipped; 12:03 ran
    assert Task.objects.filter(pk=newest.task_id).exists() and Task.objects.count() == 1


@db
def test_missed_policy_skip_records_a_late_tick_without_running_it():
    s = every(600, missed="skip")
    Tick.objects.create(schedule="beat", tick_at=datetime(2026, 3, 10, 11, 40, tzinfo=UTC), fired_at=NOW)
    late_now = datetime(2026, 3, 10, 12, 0, tzinfo=UTC) + LATE_AFTER + timedelta(seconds=1)
    Ticker(backend(), [s]).run(connection, late_now)
    newest = Tick.objects.order_by("-tick_at").first()
    assert newest.tick_at == datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    assert newest.task_id is None and newest.missed == 1  # 11:50 was missed too
    assert not Task.objects.exists()


@db
def test_a_new_schedule_starts_with_its_next_tick_not_a_stale_one():
    s = cron("0 3 * * *")
    ticker = Ticker(backend(), [s])
    ticker.run(connection, NOW)  # 03:00 was nine hours ago and the schedule has no rows yet
    assert not Tick.objects.exists()
    ticker.run(connection, datetime(2026, 3, 11, 3, 0, 5, tzinfo=UTC))
    assert Tick.objects.get().tick_at == datetime(2026, 3, 11, 3, 0, tzinfo=UTC)


@db
@pytest.mark.parametrize("spec", [{"every": 1}, {"every": 60}, {"cron": "* * * * *"}, {"cron": "0 * * * *"}])
def test_a_new_schedule_does_not_fire_a_recent_tick_when_added(spec):
    # Its latest tick is 0.5 s old: still not fired (docs/deployment.md "Periodic tasks").
    s = parse_schedule("new", {"task": "tests.tasks.echo", **spec})
    ticker = Ticker(backend(), [s])
    added = datetime(2026, 3, 10, 12, 0, 0, 500000, tzinfo=UTC)
    ticker.run(connection, added)
    assert not Tick.objects.exists() and not Task.objects.exists()
    following = s.next_tick(added)
    ticker.run(connection, following)
    assert Tick.objects.get().tick_at == following and Task.objects.count() == 1


@db
def test_an_unimportable_task_is_logged_and_does_not_stop_the_ticker(caplog):
    broken = parse_schedule("broken", {"task": "tests.tasks.nope", "every": 60})
    good = every(60)
    ticker = Ticker(backend(), [broken, good])
    ticker.run(connection, NOW - timedelta(seconds=29))  # first look: both start with their next tick
    ticker.run(connection, NOW + timedelta(seconds=30))
    assert "broken" in caplog.text and "not fired" in caplog.text
    assert list(Tick.objects.values_list("schedule", flat=True)) == ["beat"]


@db
def test_old_tick_rows_are_forgotten_beyond_the_kept_number():
    s = every(1)
    ticker = Ticker(backend(), [s])
    start = NOW.replace(microsecond=0)
    for i in range(KEEP_TICKS + 5):
        ticker.fire(connection, s, start + timedelta(seconds=i), start + timedelta(seconds=i))
    assert Tick.objects.count() == KEEP_TICKS
    assert Tick.objects.order_by("tick_at").first().tick_at == start + timedelta(seconds=5)


# ---------------------------------------------------------------- status for the dashboard

SCHEDULED = {
    "default": {
        **TASKS["default"],
        "OPTIONS": {
            "SCHEDULES": {
                "beat": {"task": "tests.tasks.echo", "every": 60, "args": ["hi"]},
                "nightly": {"task": "tests.tasks.echo", "cron": "0 3 * * *"},
            }
        },
    }
}


@db
@override_settings(TASKS=SCHEDULED)
def test_schedule_status_reports_last_and_next_run_and_flags_missed():
    Tick.objects.create(
        schedule="nightly", tick_at=datetime(2026, 3, 9, 3, 0, tzinfo=UTC), fired_at=NOW, task_id=uuid.uuid4(), missed=2
    )
    s = Schedule("beat", "tests.tasks.echo", every=timedelta(seconds=60), args=["hi"])
    Ticker(backend(), [s]).fire(connection, s, s.latest_tick(NOW), NOW)
    status = {st.name: st for st in schedule_status(now=NOW)}
    beat, nightly = status["beat"], status["nightly"]
    assert beat.last_tick_at == s.latest_tick(NOW) and beat.last_task_id == Task.objects.get().id
    assert beat.next_tick_at == datetime(2026, 3, 10, 12, 1, tzinfo=UTC) and beat.missed is False
    assert beat.description == "every 60s"
    # nightly last ran on the 9th; the 10th's 03:00 tick is overdue and unrecorded.
    assert nightly.last_run_at == NOW and nightly.missed_count == 2 and nightly.missed is True
    assert nightly.due_tick_at == datetime(2026, 3, 10, 3, 0, tzinfo=UTC)
    assert nightly.next_tick_at == datetime(2026, 3, 11, 3, 0, tzinfo=UTC)


# ---------------------------------------------------------------- real workers racing


@db
@pytest.mark.slow
def test_real_workers_racing_fire_each_tick_exactly_once(start_worker):
    options = {"SCHEDULES": {"beat": {"task": "tests.tasks.record", "every": 1, "args": ["beat"]}}}
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings_ops", "OX_TEST_OPTIONS": json.dumps(options)}
    workers = [start_worker("--concurrency", "2", env=env) for _ in range(3)]
    wait_until(lambda: Tick.objects.filter(schedule="beat").count() >= 5, timeout=60, interval=0.2)
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(timeout=30) == 0, w.output()
    ticks = list(Tick.objects.filter(schedule="beat").order_by("tick_at"))

    # Every second of the span either fired exactly once (tick_at is unique) or was counted as
    # missed by the tick after it. A tick counts the seconds since the newest tick it could
    # see when it fired. On a busy machine a worker can fire second N+1 while another's tick N
    # is not committed yet (that worker read the clock just before N+1, then waited for the
    # CPU), so N+1 also counts N: an exact total would race. What holds however slow the
    # machine: a tick counts at least the seconds really skipped before it, and at most those
    # since the tick one per other worker earlier (each worker has one tick in flight at most).
    def seconds(a, b):
        return int((b.tick_at - a.tick_at).total_seconds())

    for i in range(1, len(ticks)):
        skipped = seconds(ticks[i - 1], ticks[i]) - 1
        most = seconds(ticks[max(i - len(workers), 0)], ticks[i]) - 1
        assert skipped <= ticks[i].missed <= most, [(t.tick_at.isoformat(), t.missed) for t in ticks]
    task_ids = [t.task_id for t in ticks]
    assert None not in task_ids and len(set(task_ids)) == len(ticks)
    assert Task.objects.filter(task_path="tests.tasks.record").count() == len(ticks)
    assert set(Task.objects.filter(pk__in=task_ids).values_list("id", flat=True)) == set(task_ids)
    fired_by = {w.output().count("fired task") for w in workers}
    assert sum(w.output().count("fired task") for w in workers) == len(ticks), fired_by
