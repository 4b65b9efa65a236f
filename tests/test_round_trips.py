"""What each named operation (ox.sql) costs per database, in statements sent: the figures of
docs/databases.md. On PostgreSQL and MariaDB each statement is a round trip; on SQLite none
is. Inside the test's transaction an operation's own transaction is a savepoint (two
statements, as BEGIN and COMMIT are outside one)."""

from datetime import timedelta

import pytest
from django.db import connection

import ox
from ox import clock, sql
from ox.models import Attempt, Status, Task
from tests import tasks

pytestmark = pytest.mark.django_db

# operation -> {vendor: statements}
COST = {
    "enqueue": {"postgresql": 1, "sqlite": 1, "mysql": 1},
    "claim": {"postgresql": 1, "sqlite": 5, "mysql": 6},
    "complete": {"postgresql": 1, "sqlite": 1, "mysql": 4},
    "complete_and_claim": {"postgresql": 1, "sqlite": 6, "mysql": 8},
    "renew": {"postgresql": 1, "sqlite": 1, "mysql": 4},
    "hand_back": {"postgresql": 1, "sqlite": 1, "mysql": 1},
    "fail": {"postgresql": 4, "sqlite": 4, "mysql": 5},
    "rescue_idle": {"postgresql": 4, "sqlite": 4, "mysql": 4},
    "earliest_ready": {"postgresql": 1, "sqlite": 1, "mysql": 1},
    # A chain's step: the completion and the join (its follower made READY) in one
    # transaction; on PostgreSQL the join is one statement (ox.db.postgresql.join).
    # (PostgreSQL: BEGIN, the completion, the join, COMMIT; the join alone was four.) On the
    # worker's hot path, completion, join and next claim are one statement on PostgreSQL.
    "complete_workflow": {"postgresql": 4, "sqlite": 6, "mysql": 8},
    "complete_and_claim_workflow": {"postgresql": 1, "sqlite": 9, "mysql": 12},
}


def _claim(n: int = 1) -> list[sql.Claimed]:
    now = clock.db_now(connection)
    return sql.claim(connection, "rt-worker", ["default"], (n, 0), now, now + timedelta(seconds=30))


def _done(c: sql.Claimed) -> sql.Completion:
    now = clock.db_now(connection)
    return sql.Completion(c.id, c.fence, "7", now, now, c.workflow_id is not None)


def run(op: str) -> object:
    now = clock.db_now(connection)
    lease = now + timedelta(seconds=30)
    if op == "enqueue":
        return tasks.echo.enqueue(1)
    if op == "claim":
        return _claim()
    if op in ("complete", "complete_workflow"):
        return sql.complete(connection, [_done(PRE["claimed"])])
    if op in ("complete_and_claim", "complete_and_claim_workflow"):
        return sql.complete_and_claim(connection, [_done(PRE["claimed"])], "rt-worker", ["default"], (1, 0), now, lease)
    if op == "renew":
        c = PRE["claimed"]
        return sql.renew(connection, [(c.id, c.fence, now)], lease)
    if op == "hand_back":
        c = PRE["claimed"]
        return sql.hand_back(connection, [(c.id, c.fence)], now)
    if op == "fail":
        c = PRE["claimed"]
        failure = sql.Failure(c.id, c.fence, 1, "rt-worker", now, now, "failed", "x.Error", "tb", None)
        return sql.fail(connection, failure)
    if op == "rescue_idle":
        return sql.rescue_and_mark(connection, now)
    if op == "earliest_ready":
        return sql.earliest_ready(connection, ["default"])
    raise AssertionError(op)


PRE: dict[str, sql.Claimed] = {}
WORKFLOW_OPS = ("complete_workflow", "complete_and_claim_workflow")


@pytest.mark.parametrize("op", sorted(COST))
def test_statements_per_operation(op, django_assert_num_queries):
    if op.endswith("_workflow"):
        ox.chain(tasks.echo.s(0), tasks.echo.s()).enqueue()
        tasks.echo.enqueue(1)
    else:
        tasks.echo.enqueue(0)
        tasks.echo.enqueue(1)
    clock.db_now(connection)  # the clock's reading is not part of any operation's cost
    if op in ("complete", "complete_and_claim", "renew", "hand_back", "fail", *WORKFLOW_OPS):
        (PRE["claimed"],) = _claim()
        assert (PRE["claimed"].workflow_id is not None) == op.endswith("_workflow")
    with django_assert_num_queries(COST[op][connection.vendor]):
        out = run(op)
    # Each did what it is for, so the count is of work done, not of an early return.
    if op == "claim":
        assert len(out) == 1
    elif op in ("complete", "complete_workflow"):
        assert out == {PRE["claimed"].key}
        assert Task.objects.get(pk=PRE["claimed"].id).status == Status.SUCCESSFUL
    elif op in ("complete_and_claim", "complete_and_claim_workflow"):
        written, claimed = out
        assert written == {PRE["claimed"].key} and len(claimed) == 1
    if op.endswith("_workflow"):  # the follower was made READY by the join
        follower = Task.objects.get(workflow_id=PRE["claimed"].workflow_id, status__in=[Status.READY, Status.RUNNING])
        assert follower.waiting == 0
    elif op == "renew":
        assert out == {PRE["claimed"].key: False}
    elif op == "hand_back":
        assert out == 1 and Task.objects.get(pk=PRE["claimed"].id).status == Status.READY
    elif op == "fail":
        assert out == "FAILED" and Attempt.objects.filter(task_id=PRE["claimed"].id).count() == 1
    elif op == "earliest_ready":
        assert out is not None
