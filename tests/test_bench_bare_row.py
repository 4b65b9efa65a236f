"""The enqueue_bare_row cell (bench.plan_bare_row, bench.bare_row): ox's noop.enqueue() against
the same INSERT run on bare psycopg. Its place in the plan (ox only, every other arm saying why),
the job for real on the test database (PostgreSQL), and the capture's refusal of anything but
exactly one INSERT into ox_task."""

import json

import pytest
from django.db import connection

from bench.arms import ARM_NAMES
from bench.ci import ci_plan
from bench.plan import build
from bench.plan_bare_row import CELL


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
            ("ratio_ox_bare", "ratio_ox_bare", "ox/bare", True, "median"),
        ]
        assert set(cell.cannot_run) == set(ARM_NAMES) - {"ox"}, mode
        for arm, why in cell.cannot_run.items():
            assert why.startswith("cannot run: ") and "ox's own row" in why, (arm, why)
        # The settings are in the text a reader sees.
        for said in ("autocommit", "prepare=True", "chunks of 100", f"{rounds} rounds", "same INSERT", "uuid7"):
            assert said in cell.about, (mode, said)
    assert CELL not in {c.name for c in ci_plan()}  # not in the CI subset


@pytest.mark.django_db(transaction=True)
def test_the_job_for_real_on_postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("enqueue_bare_row runs ox's prepared INSERT: PostgreSQL only (DATABASE_URL is not PostgreSQL)")
    from bench import jobs
    from bench.arms.ox import OxArm
    from ox.models import Task

    result = jobs.enqueue_seq(OxArm(), {"n": 25, "chunk": 10, "rounds": 2, "bare_row": True})
    json.dumps(result)  # the agent prints it as JSON
    info = result["info"]
    calls = info["calls_per_kind_and_round"]
    assert calls == 20  # whole chunks only
    for key in ("throughput_ox", "throughput_bare", "ratio_ox_bare"):
        assert len(result[key]) == 2 and all(v > 0 for v in result[key]), key
    assert result["ratio_ox_bare"] == pytest.approx(
        [o / b for o, b in zip(result["throughput_ox"], result["throughput_bare"])]
    )
    # Each round: both kinds' calls and one warm-up of each, every row a distinct READY noop.
    assert info["rows"] == [2 * calls + 2] * 2 and info["notes"] == []
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
