"""The enqueue_bare_row cell (bench.plan_bare_row, bench.bare_row): ox's noop.enqueue() against
the same INSERT run on bare psycopg. Its place in the plan (ox only, every other arm saying why),
the job for real on the test database (PostgreSQL), and the capture's refusal of anything but
exactly one INSERT into ox_task."""

import json

import pytest
from django.db import connection

from bench.arms import ARM_NAMES
from bench.bare_row import RATIOS
from bench.ci import ci_plan
from bench.plan import build
from bench.plan_bare_row import CELL


def _table_exists(name: str = "bench_floor_task") -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return bool(cursor.fetchone()[0])


def test_the_plan_has_the_cell_for_ox_and_every_other_arm_says_why():
    for mode, n, rounds in (("quick", 1000, 3), ("full", 2000, 5)):
        plan = build(mode)
        names = [c.name for c in plan]
        assert names.count(CELL) == 1, mode
        assert names.index(CELL) == names.index("enqueue_seq") + 1, mode  # beside the enqueue it splits
        cell = plan[names.index(CELL)]
        assert (cell.job, cell.db, cell.arms, cell.reps) == ("enqueue_seq", "pg", ("ox",), 1)
        assert cell.params == {"n": n, "chunk": 100, "rounds": rounds, "bare_row": True}
        metrics = [(m.key, m.name, m.unit, m.higher_is_better, m.stat) for m in cell.metrics]
        assert metrics == [
            ("throughput_ox", "throughput_ox", "tasks/s", True, "median"),
            ("throughput_bare", "throughput_bare", "tasks/s", True, "median"),
            ("throughput_floor", "throughput_floor", "tasks/s", True, "median"),
            ("throughput_limit", "throughput_limit", "tasks/s", True, "median"),
            ("ratio_ox_bare", "ratio_ox_bare", "ox/bare", True, "median"),
            ("ratio_floor_limit", "ratio_floor_limit", "floor/limit", True, "median"),
            ("ratio_bare_limit", "ratio_bare_limit", "bare/limit", True, "median"),
            ("ratio_ox_floor", "ratio_ox_floor", "ox/floor", True, "median"),
            ("ratio_ox_limit", "ratio_ox_limit", "ox/limit", True, "median"),
        ]
        assert set(cell.cannot_run) == set(ARM_NAMES) - {"ox"}, mode
        for arm, why in cell.cannot_run.items():
            assert why.startswith("cannot run: ") and "ox's own row" in why, (arm, why)
        # The settings are in the text a reader sees.
        said_all = ("autocommit", "prepare=True", "chunks of 100", f"{rounds} rounds", "same INSERT", "uuid7")
        for said in (*said_all, "bench_floor_task", "Django's Tasks API", "rotated by one per chunk"):
            assert said in cell.about, (mode, said)
    assert CELL not in {c.name for c in ci_plan()}  # not in the CI subset


@pytest.mark.django_db(transaction=True)
def test_the_job_for_real_on_postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("enqueue_bare_row runs ox's prepared INSERT: PostgreSQL only (DATABASE_URL is not PostgreSQL)")
    from django.tasks import task_backends

    from bench import jobs
    from bench.arms.ox import OxArm
    from bench.floor import ALIAS
    from ox.models import Task

    assert not _table_exists()
    result = jobs.enqueue_seq(OxArm(), {"n": 25, "chunk": 10, "rounds": 2, "bare_row": True})
    json.dumps(result)  # the agent prints it as JSON
    info = result["info"]
    calls = info["calls_per_kind_and_round"]
    assert calls == 20  # whole chunks only
    kinds = ("ox", "bare", "floor", "limit")
    for key in [f"throughput_{kind}" for kind in kinds] + list(RATIOS):
        assert len(result[key]) == 2 and all(v > 0 for v in result[key]), key
    for key, (a, b) in RATIOS.items():
        assert result[key] == pytest.approx(
            [x / y for x, y in zip(result[f"throughput_{a}"], result[f"throughput_{b}"])]
        ), key
        assert set(info["spread"][f"{a}/{b}"]) >= {"min", "max"}, key
    # Each round: two kinds' calls and one warm-up of each in each table.
    assert info["rows"] == [2 * calls + 2] * 2 and info["limit_rows"] == [2 * calls + 2] * 2
    assert info["notes"] == []
    # The cell's table was made for it and is gone, as is the floor's backend.
    assert not _table_exists()
    with pytest.raises(Exception, match=ALIAS):
        task_backends[ALIAS]
    rows = Task.objects.filter(task_path="bench.tasks.noop", status="READY")
    assert rows.count() == 2 * calls + 2 and rows.values("id").distinct().count() == 2 * calls + 2
    captured = info["captured"]
    assert captured["statement"].startswith("INSERT INTO ox_task (") and "RETURNING" not in captured["statement"]
    assert captured["fresh_per_call"]["uuid7"] == 0 and len(captured["fresh_per_call"]["now"]) == 2
    assert info["prepared"] == {"ox": True, "bare": True}


@pytest.mark.django_db
def test_the_capture_wants_exactly_one_insert_into_ox_task():
    from bench.bare_row import capture
    from bench.tasks import noop

    with pytest.raises(RuntimeError, match="captured 2 among"):
        capture(lambda: [noop.enqueue(), noop.enqueue()][-1])
    with pytest.raises(RuntimeError, match="captured 0 among 0"):
        capture(lambda: None)


@pytest.mark.django_db(transaction=True)
def test_the_floor_backend_keeps_django_s_contract_and_leaves_nothing_behind():
    """The floor stands for what every django.tasks backend must do: a TaskResult back (READY,
    its arguments normalised to JSON), task_enqueued sent, one row written. Outside its block the
    alias is unknown again and the cell's table is gone, even when the block fails; a table a
    killed run left is dropped first; the limit arm's own limit_task is never touched."""
    if connection.vendor != "postgresql":
        pytest.skip("the floor writes the limit's PostgreSQL row (DATABASE_URL is not PostgreSQL)")
    from django.tasks import TaskResultStatus, task_backends
    from django.tasks.signals import task_enqueued
    from django.test import override_settings

    from bench import floor, limit_sql
    from bench.bare_row import bare_connection
    from bench.tasks import noop

    heard = []

    def receiver(sender, task_result, **kwargs):
        heard.append((sender, task_result))

    task_enqueued.connect(receiver)
    try:
        with bare_connection() as conn:
            # A limit arm's table in the same database, and a stale table a killed run left.
            limit_sql.create_schema(conn)
            conn.execute(limit_sql.INSERT, (limit_sql.PAYLOAD,))
            conn.execute(f"CREATE TABLE {floor.TABLE} (stale int)")
            with floor.floor_task(noop, conn) as on_floor:
                result = on_floor.enqueue((1, 2), key={"a": (3,)})
                assert floor.rows(conn) == 1
                assert floor.limit_calls(conn, 3) > 0 and floor.rows(conn) == 4
                floor.empty(conn)
                assert floor.rows(conn) == 0
            assert not _table_exists()
            assert conn.execute("SELECT count(*) FROM limit_task").fetchone()[0] == 1
            with pytest.raises(ZeroDivisionError), floor.floor_task(noop, conn):
                assert _table_exists()
                1 / 0  # noqa: B018
            assert not _table_exists()
            with pytest.raises(Exception, match=floor.ALIAS):
                task_backends[floor.ALIAS]
            # Settings changed inside the block forget the alias: the table still goes.
            with (
                floor.floor_task(noop, conn),
                override_settings(TASKS={"default": {"BACKEND": "ox.backend.OxBackend"}}),
            ):
                pass
            assert not _table_exists()
            conn.execute("DROP TABLE limit_task")
        # A connection lost inside the block: its error, not the cleanup's, comes out.
        with bare_connection() as conn:
            with pytest.raises(ValueError, match="the block's own"), floor.floor_task(noop, conn):
                conn.close()
                raise ValueError("the block's own")
    finally:
        task_enqueued.disconnect(receiver)
    # The lost connection could not drop the table; the next run's block drops it first.
    assert _table_exists()
    with bare_connection() as conn, floor.floor_task(noop, conn):
        pass
    assert not _table_exists()
    assert result.status == TaskResultStatus.READY and result.backend == floor.ALIAS
    assert result.args == [[1, 2]] and result.kwargs == {"key": {"a": [3]}}
    assert result.task.func is noop.func
    assert [(s, r.id) for s, r in heard[:1]] == [(floor.FloorBackend, result.id)] and len(heard) == 1
