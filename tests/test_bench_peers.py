"""The oban, dj-queue and celery arms' place in the benchmark (issue 14): which cells they run,
that every other cell says why not, and the per-arm interpreter. Nothing here starts a worker or
needs the peers installed (they live in bench/.venv and bench/.venv-celery); `bench/run --arms
oban,dj-queue,celery` is the real run."""

import sys

from bench.arms import ARM_NAMES, python_for
from bench.plan import build
from bench.plan_peers import CELERY, DJQUEUE, OBAN, OBAN_POSTGRES_ONLY, PEERS, RUNS


def test_peers_run_their_cells_and_say_why_for_every_other():
    assert set(PEERS) <= set(ARM_NAMES)
    for mode in ("quick", "full"):
        plan = build(mode)
        for peer in PEERS:
            assert {c.name for c in plan if peer in c.arms} == RUNS, (mode, peer)
            for cell in plan:
                if peer in cell.arms:
                    assert peer not in cell.cannot_run
                    continue
                why = cell.cannot_run[peer]
                assert why.startswith(("cannot run: ", "not run yet: ")), (cell.name, peer, why)
                if cell.db != "pg" and peer == OBAN:
                    assert why == OBAN_POSTGRES_ONLY
        by_name = {c.name: c for c in plan}
        assert by_name["drain_c1"].arms[-3:] == (OBAN, DJQUEUE, CELERY)
        assert by_name["enqueue_atomic"].cannot_run[CELERY].startswith("cannot run: ")
        assert by_name["kill_pgq_recovery"].cannot_run[OBAN] == "cannot run: a pgqueuer-only cell"


def test_only_celery_has_its_own_interpreter():
    assert python_for("ox", sys.executable) == sys.executable
    assert python_for(OBAN, sys.executable) == sys.executable
    assert python_for(CELERY, sys.executable).endswith("bench/.venv-celery/bin/python")
