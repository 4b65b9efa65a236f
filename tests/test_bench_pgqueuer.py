"""The pgqueuer arm's place in the benchmark (issue 14): which cells it runs, that every other
cell says why not, that the harness reports those reasons in the results and the printed notes,
and the worker's pure helpers (its settings, its workload entrypoints: the same bodies as
bench.tasks). Nothing here starts a worker or needs pgqueuer installed (it lives in bench/.venv
only); `bench/run --arms pgqueuer` is the real run."""

import argparse
import asyncio
import inspect
import threading
import time

from bench import pgq_workloads, report
from bench.arms.pgqueuer import ARM
from bench.harness import Harness
from bench.pgq_worker import _in_thread, decode, encode, limit_argv, limits, manager_id, parse_args
from bench.plan import WORKLOADS, build
from bench.plan_pgqueuer import PGQUEUER, POSTGRES_ONLY, RUNS
from tests.helpers import in_fresh_thread

OWN = {"drain_defaults", "kill_pgq_recovery"}
# Every cell pgqueuer runs, by mode, spelled out (RUNS is derived: this pins it).
QUICK = {
    "enqueue_seq",
    "enqueue_atomic",
    "bulk_enqueue",
    "drain_c1",
    "drain_c4",
    "dispatch",
    "backlog_10k_c1",
    "backlog_100k_c1",
    "kill",
    "enqueue_p4",
    "enqueue_p16",
} | OWN
FULL = (
    QUICK
    | {"drain_p4_conn600", "backlog_1m_c1", "backlog_10k_p4", "backlog_100k_p4", "backlog_1m_p4"}
    | {"drain_p2", "drain_p8"}
    | {f"{w}_c{c}" for w in ("cpu_bound", "io_bound", "io_bound_async", "mixed") for c in (1, 4)}
)


def test_pgqueuer_runs_its_cells_and_says_why_for_every_other():
    for mode, expected in (("quick", QUICK), ("full", FULL)):
        plan = build(mode)
        runs = {c.name for c in plan if PGQUEUER in c.arms}
        assert runs == expected
        assert runs == (RUNS | OWN) & {c.name for c in plan}
        for cell in plan:
            if PGQUEUER in cell.arms:
                assert PGQUEUER not in cell.cannot_run
                continue
            why = cell.cannot_run[PGQUEUER]
            # Nothing left "not run yet": every cell pgqueuer does not run, it cannot.
            assert why.startswith("cannot run: "), (cell.name, why)
            if cell.db != "pg":
                assert why == POSTGRES_ONLY
        by_name = {c.name: c for c in plan}
        assert by_name["drain_defaults"].arms[:2] == ("ox", PGQUEUER)  # each at its defaults, side by side
        assert by_name["drain_defaults"].params["concurrency"] == 0  # pgqueuer's: limits() == {}
        assert by_name["kill_pgq_recovery"].params["stall"] > 30  # past heartbeat_timeout's default
        # The Django arms' cells are as before: pgqueuer joins, nobody leaves (procrastinate joins
        # after it: tests/test_bench_procrastinate.py).
        assert by_name["drain_c1"].arms[:4] == ("ox", "django-tasks-db", "django-ox", PGQUEUER)
        assert not by_name["drain_c1"].cannot_run
        assert PGQUEUER in by_name["bulk_enqueue"].arms and PGQUEUER in by_name["enqueue_atomic"].arms
        assert "cannot run: " in by_name["procs_p1"].cannot_run[PGQUEUER]
        if mode == "full":
            assert "metadata" in by_name["progress_metadata"].cannot_run[PGQUEUER]


def test_every_job_pgqueuer_runs_has_its_implementation():
    """The shared jobs that read a Django model (bulk's row count) or need the arm's fill_fast /
    first_n (backlog) are pgqueuer's own; every job of a cell it runs resolves."""
    from bench import jobs, producers, scale

    shared = {**jobs.JOBS, **scale.JOBS, **producers.JOBS}  # bench.agent's registry
    for cell in build("full"):
        if PGQUEUER in cell.arms:
            assert cell.job in ARM.job_overrides or cell.job in shared, cell.name
    for job in ("enqueue_atomic", "bulk", "backlog", "drain"):
        assert ARM.job_overrides[job].startswith("bench.pgq_jobs:")
    for method in ("fill_fast", "first_n"):  # no longer the base's or a NotImplementedError stub
        assert "NotImplementedError" not in inspect.getsource(getattr(type(ARM), method))


def fake_harness(tmp_path, cells, arms):
    args = argparse.Namespace(
        quick=True, arms=arms, pg_url="postgres://nobody@127.0.0.1:1", cells=cells, out=str(tmp_path / "r.json")
    )
    harness = Harness(args)
    harness.doc = {
        "schema": 1,
        "run_id": "test",
        "started_at": "2026-01-01T00:00:00+00:00",
        "git_sha": "0" * 40,
        "mode": "quick",
        "arms": harness.arms,
        "environment": {},
        "options": {},
        "cells": [],
        "runs": [],
    }
    return harness


def test_harness_records_and_prints_why_a_cell_did_not_run(tmp_path, monkeypatch, capsys):
    harness = fake_harness(tmp_path, "drain_c1,bulk_enqueue,mariadb_drain_c1,procs_p1,drain_defaults", "ox,pgqueuer")
    speed = {"ox": 5400.0, PGQUEUER: 2700.0}
    ran = []

    def agent(arm, job, params, db, timeout, label):
        ran.append(label)
        return {"ok": True, "result": {"throughput": speed[arm], "info": {}}}

    monkeypatch.setattr(harness, "agent", agent)
    for index, cell in enumerate(harness.plan):
        harness.run_cell(index, cell)
    doc = harness.doc
    assert report.validate(doc) == []
    # pgqueuer ran only where it can; ox's runs are the same as without it.
    assert sorted(ran) == sorted(
        [
            "drain_c1-0-ox",
            "drain_c1-0-pgqueuer",
            "bulk_enqueue-0-ox",
            "bulk_enqueue-0-pgqueuer",
            "mariadb_drain_c1-0-ox",
            "procs_p1-0-ox",
            "drain_defaults-0-ox",
            "drain_defaults-0-pgqueuer",
        ]
    )
    by = {(c["name"], c["metric"]): c for c in doc["cells"]}
    drain = by[("drain_c1", "throughput")]
    assert drain["ratios"] == {PGQUEUER: 2.0} and "cannot_run" not in drain
    bulk = by[("bulk_enqueue", "throughput")]
    assert set(bulk["arms"]) == {"ox", PGQUEUER} and "cannot_run" not in bulk
    procs_cell = by[("procs_p1", "throughput")]
    assert set(procs_cell["arms"]) == {"ox"} and procs_cell["cannot_run"][PGQUEUER].startswith("cannot run: ")
    assert by[("mariadb_drain_c1", "throughput")]["cannot_run"] == {PGQUEUER: POSTGRES_ONLY}
    assert set(by[("drain_defaults", "throughput")]["arms"]) == {"ox", PGQUEUER}

    printed = capsys.readouterr().out
    assert f"{PGQUEUER}: {POSTGRES_ONLY}" in printed
    notes = report.notes(doc)
    assert f"{PGQUEUER} {POSTGRES_ONLY} [mariadb_drain_c1]" in notes
    assert any(n.startswith(f"{PGQUEUER} cannot run: ") and n.endswith("[procs_p1]") for n in notes)
    assert not any("[bulk_enqueue]" in n for n in notes)
    table = report.table(doc)
    procs_row = next(line for line in table.splitlines() if line.startswith("procs_p1"))
    assert procs_row.split()[-2:] == ["n/a", "-"]  # pgqueuer's column, then the ox/pgqueuer ratio
    bulk_row = next(line for line in table.splitlines() if line.startswith("bulk_enqueue"))
    assert bulk_row.split()[-1] == "2.00x+"  # both ran: ox / pgqueuer


def test_a_cell_no_selected_arm_runs_still_says_why(tmp_path, monkeypatch):
    harness = fake_harness(tmp_path, "mariadb_drain_c1", "pgqueuer")
    monkeypatch.setattr(harness, "agent", lambda *a: (_ for _ in ()).throw(AssertionError("no agent")))
    harness.run_cell(0, harness.plan[0])
    assert report.validate(harness.doc) == []
    cells = harness.doc["cells"]
    assert cells and all(c["arms"] == {} and c["cannot_run"] == {PGQUEUER: POSTGRES_ONLY} for c in cells)


def test_worker_helpers():
    assert encode([], {}) is None and decode(None) == ([], {})
    assert decode(encode([7], {"sleep_ms": 10})) == ([7], {"sleep_ms": 10})
    assert manager_id("bench-abc") == manager_id("bench-abc") != manager_id("bench-abd")


def test_concurrency_maps_to_pgqueuer_settings():
    """The harness's "C at a time in one process" as pgqueuer settings (bench.pgq_worker.limits):
    pgqueuer's per-process cap where it allows it (max_concurrent_tasks >= 2 x batch_size), the
    entrypoint limit for C = 1 in a fleet of one, and pgqueuer's defaults for drain_defaults."""
    assert limits(0, 1) == {}
    assert limits(1, 1) == {"concurrency_limit": 1, "batch_size": 1}
    assert limits(4, 1) == {"max_concurrent_tasks": 4, "batch_size": 2}
    assert limits(1, 2) == {"max_concurrent_tasks": 2, "batch_size": 1}  # the kill cell's workers
    for processes in (1, 2, 4):
        for c in range(1, 17):
            got = limits(c, processes)
            if "max_concurrent_tasks" in got:
                # what QueueManager.run() insists on, else it raises at boot
                assert got["max_concurrent_tasks"] >= 2 * got["batch_size"] >= 2
                assert got["max_concurrent_tasks"] == max(c, 2) and "concurrency_limit" not in got
            else:
                assert (c, processes) == (1, 1)
            # a batch no larger than the jobs in flight, so the completion log's buffer fills
            # (its max_size is batch_size) instead of every completion waiting for its 0.1 s timer
            assert got["batch_size"] <= max(c // 2, 1)


def test_worker_argv_carries_the_settings_to_the_worker():
    old = ARM.processes
    try:
        for processes, concurrency in ((1, 0), (1, 1), (1, 4), (2, 1)):
            ARM.processes = processes
            argv = ARM.worker_argv(concurrency, "bench-x", None)
            assert argv[:2] == ["--ident", "bench-x"]
            args = parse_args(argv)
            parsed = {
                key: value
                for key, value in (
                    ("concurrency_limit", args.concurrency_limit or None),
                    ("batch_size", args.batch_size),
                    ("max_concurrent_tasks", args.max_concurrent_tasks),
                )
                if value is not None
            }
            assert parsed == limits(concurrency, processes)
    finally:
        ARM.processes = old
    assert limit_argv({}) == []


def test_drain_defaults_runs_ox_without_a_concurrency_flag():
    """Concurrency 0 is each arm at its own defaults: ox's runworker gets no --concurrency (its
    default, 1 thread), while a cell's concurrency C is passed as it is."""
    from bench.arms.ox import ARM as OX

    assert "--concurrency" not in OX.worker_argv(0, "bench-x", None)
    assert OX.worker_argv(4, "bench-x", None)[:3] == ["runworker", "--concurrency", "4"]


def test_workload_bodies_are_bench_tasks_bodies(monkeypatch):
    """pgqueuer's workload entrypoints (bench.pgq_workloads, no Django) do per task exactly what
    bench.tasks' tasks do: the same hashing function, and the same calls in the same order."""
    from bench import tasks

    assert inspect.getsource(pgq_workloads.sha_rounds) == inspect.getsource(tasks.sha_rounds)
    assert set(pgq_workloads.WORKLOADS) == set(WORKLOADS)
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(tasks, "sha_rounds", lambda n: calls.append(("sha", n)))
    monkeypatch.setattr(pgq_workloads, "sha_rounds", lambda n: calls.append(("sha", n)))
    monkeypatch.setattr(time, "sleep", lambda s: calls.append(("sleep", s)))

    async def fake_sleep(s: float) -> None:
        calls.append(("async_sleep", s))

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    for name in WORKLOADS:
        calls.clear()
        body = tasks.WORKLOADS[name].func
        result = body()
        if inspect.iscoroutine(result):
            in_fresh_thread(lambda result=result: asyncio.run(result))
        django_calls = list(calls)
        calls.clear()
        ours = pgq_workloads.BLOCKING.get(name) or pgq_workloads.io_bound_async
        result = ours()
        if inspect.iscoroutine(result):
            in_fresh_thread(lambda result=result: asyncio.run(result))
        assert calls == django_calls and calls, name


def test_blocking_workloads_run_in_a_thread_as_pgqueuer_asks():
    seen: list[int] = []
    entry = _in_thread(lambda: seen.append(threading.get_ident()))
    assert inspect.iscoroutinefunction(entry)  # pgqueuer's executor refuses a plain def

    async def main() -> int:
        await entry(None)
        return threading.get_ident()  # the event loop's thread

    loop_thread = in_fresh_thread(lambda: asyncio.run(main()))
    assert seen and seen[0] != loop_thread


def test_a_workload_cell_asks_its_workers_for_its_entrypoint():
    old = ARM.processes, ARM.workload
    try:
        ARM.processes, ARM.workload = 1, None
        assert "--workload" not in ARM.worker_argv(1, "bench-x", None)  # other cells: as before
        for name in WORKLOADS:
            ARM.workload = name
            argv = ARM.worker_argv(4, "bench-x", None)
            assert parse_args(argv).workload == name
            assert parse_args(argv).max_concurrent_tasks == 4  # the concurrency is the cell's, as for noop
    finally:
        ARM.processes, ARM.workload = old
