"""Attacks on three changes: the refill of a freed slot while its kind's last claim came back
full (ox.claims.Claims.full), the join riding on the claim's statement on PostgreSQL
(ox.db.postgresql.join.IN_CLAIM), and the inputs a PostgreSQL claim reads itself
(Claimed.inputs), with the gate's claim beside it reading them apart.

Real worker subprocesses where the promise is the worker's (no claim storm, a backlog drains
without polls, callbacks run once, odd results reach the next step intact); threads on worker
connections where it is the statement's (no deadlock, each task claimed once).

Found by this review and fixed (older than the three changes): a queue with a concurrency limit
whose parked tasks were given back behind a long one (ox.leases) left its last task READY until
the worker's poll, the worker having marked itself waiting after its last, short claim; a give-
back now sets Worker.gave_back, so the next freed slot claims
(test_a_concurrency_limited_queue_beside_an_unlimited_one_drains_and_goes_quiet)."""

import json
import os
import random
import re
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.tasks import task

import ox
from ox import clock, sql
from ox.models import Edge, Status, Task
from tests import tasks
from tests.helpers import wait_until
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

PG = connection.vendor == "postgresql"
TERMINAL = [Status.SUCCESSFUL, Status.FAILED, Status.CANCELLED]


# ---------------------------------------------------------------- tasks (importable by workers)
@task()
def const(value: object) -> object:
    return value


@task()
def ident(value: object) -> object:
    return value


@task(queue_name="reports")
def const_r(value: object) -> object:
    return value


@task(queue_name="reports")
def ident_r(value: object) -> object:
    return value


@task(max_attempts=1)
def boom_once() -> None:
    raise RuntimeError("boom")


@task(queue_name="reports", max_attempts=1)
def boom_r() -> None:
    raise RuntimeError("boom")


@task(max_attempts=3)
def fail_first(value: object, key: str) -> object:
    """Fails its first attempt, then returns its input: a retried workflow step."""
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    if Ledger.objects.filter(key=key).count() == 1:
        raise RuntimeError("first attempt")
    return value


@task(queue_name="reports", max_attempts=3)
def fail_first_r(value: object, key: str) -> object:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    if Ledger.objects.filter(key=key).count() == 1:
        raise RuntimeError("first attempt")
    return value


@task()
def mem(g: int, n: int, pause: float = 0.0) -> int:
    Ledger.objects.create(key=f"g{g}m{n}", pid=os.getpid(), attempt=1)
    if pause:
        time.sleep(pause)
    return n


@task()
def cb(values: object, key: str) -> object:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    return values


@task(max_attempts=1)
def fixable(key: str, marker: str) -> str:
    Ledger.objects.create(key=key, pid=os.getpid(), attempt=1)
    if not Path(marker).exists():
        raise RuntimeError("not yet")
    return key


# ---------------------------------------------------------------- helpers
def _options(**values: object) -> dict[str, str]:
    return {"OX_TEST_OPTIONS": json.dumps({k.upper(): v for k, v in values.items()})}


def _claims(worker) -> int:
    found = re.findall(r"worker stopped .*?claims=(\d+)", worker.output())
    assert found, worker.output()[-3000:]
    return int(found[-1])


def _stop(*workers) -> None:
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(60) == 0, w.output()[-3000:]


def _settled(ids, timeout: float = 60.0) -> None:
    wait_until(
        lambda: not Task.objects.filter(pk__in=list(ids)).exclude(status__in=TERMINAL).exists(),
        timeout=timeout,
        interval=0.1,
    )


def _value(result):
    return Task.objects.get(pk=result.id).return_value


def _status(result):
    return Task.objects.get(pk=result.id).status


# ================================================================ 1. refill: no claim storm
def test_an_idle_worker_that_saw_both_kinds_does_not_claim_in_a_loop(start_worker):
    """Both kinds' last claims came back full while the backlog lasted; once empty, a worker of
    4 + 4 slots sits 5 s without claiming in a loop (the poll is 60 s: a handful of claims for
    the drain, none while it waits)."""
    ox.enqueue_many(tasks.sleep_for, [((0.05,), {})] * 16)
    ox.enqueue_many(tasks.async_sleep, [((0.05,), {})] * 16)
    worker = start_worker("--concurrency", "4", "--async-concurrency", "4", env=_options(poll_interval=60, prefetch=0))
    wait_until(lambda: Task.objects.filter(status=Status.SUCCESSFUL).count() == 32, timeout=30, interval=0.1)
    time.sleep(5)
    _stop(worker)
    claims = _claims(worker)
    # At most a claim per finished task (each freed slot of a full kind), plus a few.
    assert claims <= 32 + 10, claims


def test_a_backlog_of_one_kind_beside_a_short_claim_of_the_other_drains_without_polls(start_worker):
    """A sync backlog, and async tasks once seen but none left: the worker marks itself idle after
    a short async claim; the sync backlog must still drain slot by slot (poll 60 s)."""
    ox.enqueue_many(tasks.async_sleep, [((0.01,), {})] * 2)
    ox.enqueue_many(tasks.sleep_for, [((0.2,), {})] * 20)
    worker = start_worker("--concurrency", "2", "--async-concurrency", "4", env=_options(poll_interval=60, prefetch=0))
    t0 = time.monotonic()
    wait_until(lambda: Task.objects.filter(status=Status.SUCCESSFUL).count() == 22, timeout=30, interval=0.1)
    took = time.monotonic() - t0
    time.sleep(2)
    _stop(worker)
    assert took < 20, took
    # About two claims per start: the one that fills the freed sync slot (it came back full, so
    # the worker claims again at once) and one that finds no async task. Bounded, not a loop.
    assert _claims(worker) <= 2 * 22 + 10, _claims(worker)


def test_a_rate_limited_queue_beside_an_empty_unlimited_one_claims_about_once_or_twice_per_start(start_worker):
    """rate_held is False while the unlimited queue is open: every finished task of the full kind
    claims again. That must stay a bounded number per start, never a loop."""
    from tests import flow_tasks as f
    from tests.testapp.models import Span

    ox.enqueue_many(f.rated, [((f"s{i}",), {}) for i in range(400)])
    env = _options(limits={"reports": {"rate": "10/s"}}, heartbeat=0.5, rescue_interval=0.5, poll_interval=60)
    worker = start_worker("--concurrency", "1", "--queues", "reports,default", env=env)
    wait_until(lambda: Span.objects.exists(), timeout=30)
    time.sleep(4)
    _stop(worker)
    starts = Span.objects.count()
    claims = _claims(worker)
    assert 20 <= starts <= 60, starts
    assert claims <= 3 * starts + 20, (claims, starts)


def test_a_concurrency_limited_queue_beside_an_unlimited_one_drains_and_goes_quiet(start_worker):
    """Limit 1 on "emails", 4 threads: the worker is held back by the limit (not idle); its own
    task's end frees the slot. The backlog drains without the 60 s poll, and then nothing loops.

    FAILS (PostgreSQL and SQLite, also before 7cc0dca): the worker claims one task to run and three parked
    for the queue's slot (ox.flow.keeper); leases._give_back_parked hands the parked ones back
    once the running one is past the prefetch window. Mid-backlog every claim came back full
    (Claims.full) so each finish claims again; the last claim comes back short (2 of 4), the
    worker marks itself idle, and the parked task it then gives back is READY with nobody told:
    the hand-back sets neither gave_back nor more_waiting, sends no NOTIFY for a running worker,
    full[0] is False and slot_freed does nothing while marked. 19 of 20 run; the last waits for
    the 60 s poll."""
    from tests import flow_tasks as f

    ox.enqueue_many(f.limited, [((f"t{i}", 0.1), {}) for i in range(20)])
    env = _options(limits={"emails": {"concurrency": 1}}, heartbeat=0.5, rescue_interval=0.5, poll_interval=60)
    worker = start_worker("--concurrency", "4", "--async-concurrency", "2", "--queues", "emails,default", env=env)
    wait_until(lambda: Task.objects.filter(status=Status.SUCCESSFUL).count() == 20, timeout=30, interval=0.1)
    time.sleep(4)
    _stop(worker)
    assert _claims(worker) <= 3 * 20 + 20, _claims(worker)


def test_prefetched_tasks_given_back_by_two_workers_do_not_make_a_claim_loop(start_worker):
    """Two workers with prefetch on, tasks long enough that prefetched ones are not "short": the
    claim/hand-back cycle must stay bounded (claims per task a small number)."""
    ox.enqueue_many(tasks.sleep_for, [((0.15,), {})] * 40)
    env = _options(poll_interval=60)
    workers = [start_worker("--concurrency", "2", env=env) for _ in range(2)]
    wait_until(lambda: Task.objects.filter(status=Status.SUCCESSFUL).count() == 40, timeout=60, interval=0.1)
    time.sleep(3)
    _stop(*workers)
    total = sum(_claims(w) for w in workers)
    assert total <= 3 * 40 + 20, total


# ================================================================ 2. the join on the claim
def _complete_and_claim_threads(n_threads: int, seed: int) -> dict[str, list]:
    """Threads on worker connections of their own drain what is READY in "default": each round
    completes a random part of what it holds (as workflow successes) and claims 1-6 more in the
    same call. Returns per thread the ids it claimed, and any errors."""
    from ox.connection import open_worker_connection

    claimed_by: dict[str, list] = {}
    errors: list[BaseException] = []
    stop = threading.Event()

    def run(name: str, rng: random.Random) -> None:
        conn = open_worker_connection(connection.alias)
        held: list[sql.Claimed] = []
        mine: list = []
        try:
            quiet = 0
            for _round in range(2000):
                if stop.is_set():
                    break
                rng.shuffle(held)
                k = len(held) if rng.random() < 0.5 else rng.randint(0, len(held))
                done, held = held[:k], held[k:]
                now = clock.db_now(conn)
                comps = [
                    sql.Completion(c.id, c.fence, json.dumps(str(c.id)), now, now, c.workflow_id is not None)
                    for c in done
                ]
                written, got = sql.complete_and_claim(
                    conn, comps, name, ["default"], (rng.randint(1, 6), 0), now, now + timedelta(seconds=120)
                )
                assert written == {c.key for c in done}, (written, [c.key for c in done])
                held += got
                mine += [c.id for c in got]
                if not held and not got:
                    quiet += 1
                    with conn.cursor() as cursor:
                        cursor.execute("SELECT count(*) FROM ox_task WHERE status <> 'SUCCESSFUL'")
                        if cursor.fetchone()[0] == 0 or quiet > 200:
                            break
                    time.sleep(0.002)
                else:
                    quiet = 0
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            stop.set()
        finally:
            claimed_by[name] = mine
            conn.close()

    threads = [
        threading.Thread(target=run, args=(f"t{i}", random.Random(seed * 100 + i)), daemon=True)
        for i in range(n_threads)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread is stuck (a lock wait that never ends?)"
    return {"claimed": claimed_by, "errors": errors}


@pytest.mark.parametrize("seed", range(3))
def test_workers_ending_members_of_the_same_groups_at_once_claim_each_task_once_without_deadlock(seed):
    """Four connections end members of the same groups in batches of random size, riding on their
    claims, with a group after a group (every member of the second is a follower of every member
    of the first, and the final callback follows the second group), chains, and a group whose
    callback is also the follower of a lone task: no deadlock reaches the caller (a CI run once
    met an InnoDB deadlock here: ox.sql.again_on_deadlock runs the victim again), every task claimed exactly once,
    every edge closed with its parent's result, nothing left PENDING."""
    from tests import workflow_tasks as wt

    runs = []
    for i in range(6):
        runs.append(ox.group([wt.add.s(j, i) for j in range(8)]).then(wt.total.s()).enqueue())
        runs.append(
            ox.chain(
                ox.group([wt.add.s(j, i) for j in range(5)]),
                ox.group([wt.total.s() for _ in range(4)]),
                wt.total.s(),
            ).enqueue()
        )
        runs.append(ox.chain(wt.add.s(i, 1), wt.total.s(), wt.total.s(), wt.total.s()).enqueue())
        runs.append(
            ox.chain(ox.group([wt.add.s(1, 1), ox.chain(wt.add.s(2, 2), wt.total.s())]), wt.total.s()).enqueue()
        )
    out = _complete_and_claim_threads(4, seed)
    assert not out["errors"], out["errors"]
    if connection.vendor != "sqlite":  # one writer at a time there: a thread may well take it all
        assert sum(1 for ids in out["claimed"].values() if ids) >= 2, "no race: one connection took everything"
    every = [i for ids in out["claimed"].values() for i in ids]
    assert len(every) == len(set(every)), "a task was claimed twice"
    assert set(every) == set(Task.objects.values_list("pk", flat=True))
    assert set(Task.objects.values_list("status", flat=True)) == {Status.SUCCESSFUL}
    assert not Edge.objects.filter(done=False).exists()
    # Each edge carries its parent's result (the parent's id, as each thread wrote it).
    for parent, result in Edge.objects.values_list("parent_id", "result"):
        assert json.loads(result) == str(parent)
    assert not Task.objects.filter(waiting__gt=0).exists()


@pytest.mark.skipif(not PG, reason="the join in the claim's statement is PostgreSQL's")
def test_a_join_that_readies_nothing_on_a_claim_does_not_notify_even_for_a_cancelled_follower(listener):
    """Stop policy: a member fails for good, the callback is CANCELLED; the other member's success
    then rides on a claim with a worker marked idle: the callback is counted (not READY), and no
    NOTIFY is sent."""
    from ox.models import Worker
    from tests import workflow_tasks as wt

    now = clock.db_now(connection)
    Worker.objects.create(id="idle-atk", host="h", pid=1, started_at=now, heartbeat_at=now, idle_since=now)
    run = ox.group([wt.add.s(1, 1), wt.add.s(2, 2)]).then(wt.total.s()).enqueue()
    now = clock.db_now(connection)
    m1, m2 = sql.claim(connection, "atk", ["default"], (10, 0), now, now + timedelta(seconds=60))
    failure = sql.Failure(m2.id, m2.fence, 1, "atk", now, now, "failed", "x.E", "tb", None, workflow=True)
    assert sql.fail(connection, failure) == "FAILED"
    assert _status(run.last) == Status.CANCELLED
    assert listener(0.3) == []  # the conftest fixture: a LISTEN session of its own
    now = clock.db_now(connection)
    done = [sql.Completion(m1.id, m1.fence, "2", now, now, True)]
    written, claimed = sql.complete_and_claim(
        connection, done, "atk", ["default"], (5, 0), now, now + timedelta(seconds=60)
    )
    assert written == {m1.key} and claimed == []
    assert listener(0.5) == []
    row = Task.objects.get(pk=run.last.id)
    assert (row.status, row.waiting) == (Status.CANCELLED, 0)
    assert list(Edge.objects.filter(parent_id=m1.id).values_list("done", "result")) == [(True, "2")]


def test_a_retry_of_a_cancelled_follower_racing_its_parents_end_on_a_claim_is_not_left_pending():
    """ox.retry of a CANCELLED follower whose other parent still runs makes it PENDING again
    (waiting 1). That parent's success then rides on a claim: the follower becomes READY and is
    claimed by the next claim, its inputs [result of A, None for the failed one]."""
    from tests import workflow_tasks as wt

    now = clock.db_now(connection)
    run = ox.group([wt.add.s(1, 1), wt.add.s(2, 2)]).then(wt.total.s()).enqueue()
    now = clock.db_now(connection)
    a, x = sql.claim(connection, "atk", ["default"], (10, 0), now, now + timedelta(seconds=60))
    failure = sql.Failure(x.id, x.fence, 1, "atk", now, now, "failed", "x.E", "tb", None, workflow=True)
    sql.fail(connection, failure)
    assert _status(run.last) == Status.CANCELLED
    ox.retry([run.last.id])
    row = Task.objects.get(pk=run.last.id)
    assert (row.status, row.waiting) == (Status.PENDING, 1)
    now = clock.db_now(connection)
    done = [sql.Completion(a.id, a.fence, '"A"', now, now, True)]
    written, claimed = sql.complete_and_claim(
        connection, done, "atk", ["default"], (5, 0), now, now + timedelta(seconds=60)
    )
    assert written == {a.key} and claimed == []
    assert _status(run.last) == Status.READY
    now = clock.db_now(connection)
    (nxt,) = sql.claim(connection, "atk", ["default"], (5, 0), now, now + timedelta(seconds=60))
    assert str(nxt.id) == run.last.id
    if PG:
        assert nxt.inputs == [(True, '"A"'), (True, None)]


# ---------------------------------------------------------------- real workers, races and kills
@pytest.mark.parametrize("workers_n", [3])
def test_groups_and_chains_under_several_workers_with_a_kill_run_each_callback_once(start_worker, workers_n):
    """20 groups of 4 members (0.3 s each) and 10 chains of 4, under 3 workers of 2 threads; one
    worker SIGKILLed mid-run. Everything ends SUCCESSFUL, nothing PENDING/READY/RUNNING, each
    callback ran once (its ledger), each group's callback got its members' results in order."""
    runs = [ox.group([mem.s(g, n, 0.3) for n in range(4)]).then(cb.s(key=f"cb{g}")).enqueue() for g in range(20)]
    chains = [
        ox.chain(mem.s(100 + c, 0), cb.s(key=f"c{c}a"), cb.s(key=f"c{c}b"), cb.s(key=f"c{c}c")).enqueue()
        for c in range(10)
    ]
    env = _options(lease=3, heartbeat=0.5, rescue_interval=0.5, liveness_grace=0.5)
    workers = [start_worker("--concurrency", "2", env=env) for _ in range(workers_n)]
    wait_until(lambda: Ledger.objects.filter(key__startswith="g").count() >= 12, timeout=30, interval=0.05)
    workers[0].signal(signal.SIGKILL)
    workers[0].wait(10)
    ids = [r.id for run in runs + chains for r in run.results]
    _settled(ids, timeout=120)
    statuses = dict(Task.objects.filter(pk__in=ids).values_list("pk", "status"))
    assert set(statuses.values()) == {Status.SUCCESSFUL}, statuses
    for g, run in enumerate(runs):
        assert _value(run.last) == [0, 1, 2, 3]
        callback = Task.objects.get(pk=run.last.id)
        assert Ledger.objects.filter(key=f"cb{g}").count() == callback.attempts == 1
    for c, run in enumerate(chains):
        assert _value(run.last) == 0
        for step in "abc":
            assert Ledger.objects.filter(key=f"c{c}{step}").count() == 1
    assert not Edge.objects.filter(done=False).exists()
    _stop(*workers[1:])


def test_retry_workflow_after_a_partial_failure_drains_with_two_workers(start_worker, tmp_path):
    """A group [ok, fixable] then a callback then a chain step, stop policy: the fixable member
    fails, the rest is CANCELLED; fixed and retried, two workers run the failed part, the callback
    once with both results in position order, the step after it with the callback's result."""
    marker = tmp_path / "fixed"
    run = ox.chain(
        ox.group([const.s("ok"), fixable.s(key="fx", marker=str(marker))]),
        cb.s(key="cbr"),
        ident.s(),
    ).enqueue()
    env = _options(poll_interval=0.5)
    workers = [start_worker("--concurrency", "2", env=env) for _ in range(2)]
    _settled([r.id for r in run.results], timeout=30)
    assert _status(run.results[1]) == Status.FAILED
    assert _status(run.results[2]) == Status.CANCELLED
    marker.touch()
    assert ox.retry_workflow(run.id) == 3
    _settled([r.id for r in run.results], timeout=30)
    assert [_status(r) for r in run.results] == [Status.SUCCESSFUL] * 4
    assert _value(run.results[2]) == ["ok", "fx"]
    assert _value(run.last) == ["ok", "fx"]
    assert Ledger.objects.filter(key="cbr").count() == 1
    _stop(*workers)


# ================================================================ 3. inputs read by the claim
ODD = [
    "x" * 1_000_000,
    "héllo ✓ 🐂 \u2028 \u00a0 中文",
    {"a": [1, {"b": '}{,"\\'}], "c": None, "": [[], {}]},
    None,
    "NULL",
    "",
    '{"not": "json object"}',
    "a\\b\"c'd,{e}",
    [None, "null", "NULL", 0],
    10**20,
    -0.5,
    True,
]


def _odd_case(head, step, boom, retried, tmp: str) -> tuple[list, list, object, object, object]:
    chains = [ox.chain(head.s(v), step.s()).enqueue() for v in ODD]
    gathered = ox.group([head.s(v) for v in ODD]).then(step.s()).enqueue()
    cont = ox.group([head.s("first"), boom.s(), head.s(None), head.s("last")]).then(step.s()).enqueue(policy="continue")
    again = ox.chain(head.s(ODD[2]), retried.s(key=f"retried-{tmp}")).enqueue()
    return chains, ODD, gathered, cont, again


def _check_odd(chains, values, gathered, cont, again) -> None:
    for run, v in zip(chains, values, strict=True):
        assert _status(run.last) == Status.SUCCESSFUL
        got = _value(run.last)
        assert got == v, (repr(got)[:200], repr(v)[:200])
    assert _value(gathered.last) == values
    assert _value(cont.last) == ["first", None, None, "last"]
    assert _value(again.last) == ODD[2]
    assert Task.objects.get(pk=again.last.id).attempts == 2


def test_odd_results_reach_the_next_step_intact_through_the_ordinary_claim(start_worker):
    case = _odd_case(const, ident, boom_once, fail_first, "plain")
    worker = start_worker("--concurrency", "4", env=_options(poll_interval=0.5))
    _settled([r.id for run in [*case[0], case[2], case[3], case[4]] for r in run.results], timeout=60)
    _check_odd(*case)
    _stop(worker)


@pytest.mark.parametrize("limit", [{"concurrency": 3}, {"rate": "500/s"}, {"key_concurrency": 1}])
def test_odd_results_reach_the_next_step_intact_through_the_gate(start_worker, limit):
    """Queues with limits are claimed by the gate, whose claim does not read inputs: the
    separate read must still give each step its parents' results."""
    case = _odd_case(const_r, ident_r, boom_r, fail_first_r, "gate")
    env = _options(limits={"reports": limit}, poll_interval=0.5, heartbeat=0.5, rescue_interval=0.5)
    worker = start_worker("--concurrency", "4", "--queues", "reports", env=env)
    _settled([r.id for run in [*case[0], case[2], case[3], case[4]] for r in run.results], timeout=90)
    _check_odd(*case)
    _stop(worker)


def test_odd_results_across_a_gated_and_an_unlimited_queue_in_one_workflow(start_worker):
    """A chain alternating between a limited queue (the gate) and an unlimited one (the ordinary
    claim, with its inputs): each step gets the one before's result."""
    runs = [ox.chain(const.s(v), ident_r.s(), ident.s(), ident_r.s()).enqueue() for v in ODD]
    env = _options(limits={"reports": {"concurrency": 2}}, poll_interval=0.5, heartbeat=0.5, rescue_interval=0.5)
    workers = [start_worker("--concurrency", "3", "--queues", "reports,default", env=env) for _ in range(2)]
    _settled([r.id for run in runs for r in run.results], timeout=90)
    for run, v in zip(runs, ODD, strict=True):
        assert [_value(r) == v for r in run.results] == [True] * 4
    _stop(*workers)


def test_odd_results_written_by_a_riding_completion_are_read_back_by_the_claim():
    """Without a worker: every odd result, written by a riding completion, read back by the
    claim (PostgreSQL: Claimed.inputs; elsewhere join.inputs), equals the JSON text written."""
    from ox.workflow import join

    runs = [ox.chain(const.s(0), ident.s()).enqueue() for _ in ODD]
    now = clock.db_now(connection)
    heads = sql.claim(connection, "atk", ["default"], (len(ODD), 0), now, now + timedelta(seconds=60))
    by_id = {str(c.id): c for c in heads}
    texts = [json.dumps(v) for v in ODD]
    done = [
        sql.Completion(by_id[run.results[0].id].id, by_id[run.results[0].id].fence, text, now, now, True)
        for run, text in zip(runs, texts, strict=True)
    ]
    # limits (1, 0) on a queue with nothing READY: the riding path (IN_CLAIM on PostgreSQL).
    written, _ = sql.complete_and_claim(connection, done, "atk", ["other"], (1, 0), now, now + timedelta(seconds=60))
    assert len(written) == len(ODD)
    now = clock.db_now(connection)
    steps = sql.claim(connection, "atk", ["default"], (len(ODD), 0), now, now + timedelta(seconds=60))
    assert len(steps) == len(ODD)
    expected = {run.results[1].id: text for run, text in zip(runs, texts, strict=True)}
    read = join.inputs(connection, [c.id for c in steps])
    for c in steps:
        assert read[c.id] == [(False, expected[str(c.id)])]
        if PG:
            assert c.inputs == [(False, expected[str(c.id)])]
