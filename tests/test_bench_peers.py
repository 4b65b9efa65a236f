"""The oban, dj-queue and celery arms' place in the benchmark (issue 14): which cells each runs,
that every other cell says why not, and the per-arm interpreter. Nothing here starts a worker or
needs the peers installed (they live in bench/.venv and bench/.venv-celery); `bench/run --arms
oban,dj-queue,celery` is the real run."""

import sys

from bench.arms import ARM_NAMES, python_for
from bench.plan import build
from bench.plan_peers import CELERY, DJQUEUE, OBAN, OBAN_POSTGRES_ONLY, PEERS, RUNS

FIRST = {"enqueue_seq", "drain_c1", "drain_c4", "dispatch", "kill"}
WORKLOADS = {f"{w}_c{c}" for w in ("cpu_bound", "io_bound", "io_bound_async", "mixed") for c in (1, 4)}
BACKLOGS = {f"backlog_{s}_{k}" for s in ("10k", "100k", "1m") for k in ("c1", "p4")}
SCALE = {"enqueue_p4", "enqueue_p16", "drain_p2", "drain_p8"}  # bench.plan_scale: every arm
# Each peer's cells in the full plan, written out so that a change to bench.plan_peers shows here.
EXPECTED = {
    OBAN: FIRST | {"enqueue_atomic", "bulk_enqueue", "drain_p4_conn600"} | WORKLOADS | BACKLOGS | SCALE,
    DJQUEUE: FIRST
    | {"enqueue_atomic", "bulk_enqueue", "drain_p4_conn0", "drain_p4_conn600", "drain_defaults"}
    | WORKLOADS
    | BACKLOGS
    | SCALE
    | {"sqlite_drain_c1", "sqlite_backlog_10k_c1", "sqlite_backlog_1m_c1"}
    | {"mariadb_enqueue_seq", "mariadb_drain_c1", "mariadb_dispatch", "mariadb_kill"},
    CELERY: FIRST | {"bulk_enqueue", "drain_p4_conn600", "drain_defaults"} | WORKLOADS | BACKLOGS | SCALE,
}


def test_peers_run_their_cells_and_say_why_for_every_other():
    assert set(PEERS) <= set(ARM_NAMES)
    for mode in ("quick", "full"):
        plan = build(mode)
        names = {c.name for c in plan}
        for peer in PEERS:
            ran = {c.name for c in plan if peer in c.arms}
            assert ran == EXPECTED[peer] & names, (mode, peer, ran ^ (EXPECTED[peer] & names))
            assert RUNS[peer] == EXPECTED[peer]
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
    full = {c.name: c for c in build("full")}
    # oban and celery: one drain_p4 measurement, the other two say why they would repeat it.
    for peer in (OBAN, CELERY):
        for name in ("drain_p4_conn0", "drain_p4_pool"):
            why = full[name].cannot_run[peer]
            assert why.startswith("cannot run: ") and "drain_p4_conn600" in why, (peer, name)
    # dj-queue's fork mode and Django's pool: measured broken, said so.
    assert full["drain_p4_pool"].cannot_run[DJQUEUE].startswith("cannot run: dj-queue's default fork mode")
    # dj-queue: an ox-against-itself cell says so on SQLite too, not "not validated".
    assert full["sqlite_limit_global"].cannot_run[DJQUEUE].startswith("cannot run: the cell compares ox")
    assert DJQUEUE in full["sqlite_drain_c1"].arms and DJQUEUE in full["mariadb_kill"].arms
    # Nothing is left "not run yet"; oban has no defaults for the defaults cell, and says so.
    for peer in PEERS:
        pending = {n for n, c in full.items() if c.cannot_run.get(peer, "").startswith("not run yet")}
        assert pending == set(), (peer, pending)
    assert full["drain_defaults"].cannot_run[OBAN].startswith("cannot run: an oban queue has no default limit")


def test_only_celery_has_its_own_interpreter():
    assert python_for("ox", sys.executable) == sys.executable
    assert python_for(OBAN, sys.executable) == sys.executable
    assert python_for(CELERY, sys.executable).endswith("bench/.venv-celery/bin/python")
