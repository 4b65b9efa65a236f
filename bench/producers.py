"""Concurrent producers, run inside an agent like bench.jobs:

- Crowd: P producer processes (bench.producer) started, released together at one agreed
  wall-clock instant for a round, their counts collected, stopped by pid. The notify cell
  (bench.scale.notify, ox only) and the enqueue_p* cells (every arm) share it.
- producers (the enqueue_p* cells' job): P processes each calling the arm's single enqueue (the
  call its enqueue_seq times, through the arm's `producer_hook`) back to back in autocommit for
  `seconds`, all from one instant; tasks/s = every counted enqueue / the window; afterwards the
  arm's table (Redis list, for celery) must hold exactly the counted enqueues plus the P warm-up
  ones, so that nothing was lost or counted twice.
"""

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import jobs, procs
from bench.arms.base import Arm
from bench.fleet import REPO, wait
from bench.producer import DEFAULT_HOOK

Params = dict[str, Any]
Result = dict[str, Any]


class Crowd:
    """Producer processes of one measurement. Each boots, enqueues once (its warm-up), and says
    it is ready; a round is a go-file naming the start instant and the window; each writes its
    count when its window is over. Every wait is bounded; only these processes are stopped."""

    def __init__(self, work: Path, env: dict[str, str], hook: str = DEFAULT_HOOK, idle_limit: float = 120.0) -> None:
        self.work = work
        self.env = env
        self.hook = hook
        self.idle_limit = idle_limit  # a producer left without a round this long exits by itself
        self.procs: list[procs.Proc] = []
        work.mkdir(parents=True, exist_ok=True)

    def alive(self) -> bool:
        return all(p.alive() for p in self.procs)

    def _tail(self) -> str:
        dead = [p for p in self.procs if not p.alive()]
        return procs.tail((dead or self.procs)[0].log)

    def _wait_files(self, paths: list[Path], limit: float) -> bool:
        return wait(lambda: all(path.exists() for path in paths) or not self.alive(), limit, 0.02) and self.alive()

    def start(self, count: int, boot_limit: float = 120.0) -> float:
        """Start `count` producers and wait until every one has made its warm-up enqueue; the
        seconds that took."""
        started = time.monotonic()
        for i in range(count):
            argv = [sys.executable, "-m", "bench.producer", str(self.work), str(i), str(self.idle_limit), self.hook]
            self.procs.append(procs.spawn(argv, self.env, self.work / f"producer-{i}.log", f"producer-{i}", REPO))
        if not self._wait_files([self.work / f"ready-{i}" for i in range(count)], boot_limit):
            raise RuntimeError("producers did not start: " + self._tail())
        return time.monotonic() - started

    def round(self, k: int, seconds: float, lead: float = 0.2) -> tuple[float, list[dict[str, Any]]]:
        """Release round k: every producer enqueues from now + `lead` for `seconds`. Returns the
        start instant (time.time()) and each producer's report, in producer order."""
        start_at = time.time() + lead
        tmp = self.work / f".go-{k}"
        tmp.write_text(json.dumps({"start_at": start_at, "seconds": seconds}))
        tmp.replace(self.work / f"go-{k}.json")
        outs = [self.work / f"result-{k}-{i}.json" for i in range(len(self.procs))]
        if not self._wait_files(outs, lead + seconds + 60):
            raise RuntimeError(f"round {k}: a producer did not report: " + self._tail())
        return start_at, [json.loads(path.read_text()) for path in outs]

    def release(self) -> None:
        """Tell the producers to exit once their round is over (they poll for this file)."""
        (self.work / "stop").touch()

    def stop(self, grace: float = 10.0) -> None:
        self.release()
        procs.stop(self.procs, grace=grace)


def _rows(arm: Arm) -> int:
    """Every row (message) the arm keeps for its tasks: its counts() over every status. After
    enqueues alone that is what they wrote (celery's: the queue list, no worker took any)."""
    return sum(arm.counts().values())


def producers(arm: Arm, p: Params) -> Result:
    """The enqueue_p* cells: P producer processes, each the arm's single enqueue in a loop
    (bench.producer with the arm's producer_hook: its own connection, opened by one uncounted
    warm-up enqueue and held for the window, each call its own autocommit transaction), all from
    one wall-clock instant `lead` seconds after the last producer is ready, for `seconds`.
    Throughput = the calls finished in the window, all producers, over the window as it closed (the
    start instant to the last producer's end: its last call may end after the window). Then the
    arm's table must hold exactly those calls plus the P warm-ups: a lost or doubled enqueue fails
    the repetition."""
    jobs._reset(arm)
    count, seconds = p["producers"], p["seconds"]
    env = {**os.environ, **{k: str(v) for k, v in p.get("worker_env", {}).items()}}
    crowd = Crowd(Path(p["log_dir"]) / "producers", env, arm.producer_hook)
    try:
        boot_s = crowd.start(count)
        warm = _rows(arm)
        start_at, results = crowd.round(0, seconds, lead=p.get("lead", 0.5))
    finally:
        crowd.stop()
    calls = sum(r["count"] for r in results)
    window = max(r["end"] for r in results) - start_at
    rows = _rows(arm)
    if warm != count or rows != calls + count:
        raise RuntimeError(
            f"{rows} rows after {calls} counted enqueues and {count} warm-ups ({warm} rows after the warm-ups):"
            " an enqueue lost or counted twice"
        )
    late = max(r["began"] - start_at for r in results)
    notes = []
    if late > 0.05 * seconds:  # a producer that began late had a shorter window than the others
        notes.append(f"a producer began {late * 1000:.0f} ms after the start instant ({seconds:.1f} s window)")
    info = {
        "producers": count,
        "seconds": seconds,
        "window_s": window,
        "calls": calls,
        "calls_each": [r["count"] for r in results],
        "latest_start_ms": late * 1000,
        "boot_s": boot_s,
        "rows": rows,
        "warm_ups": count,
        "path": results[0].get("path", ""),
        "hook": arm.producer_hook,
        "notes": notes,
    }
    return {"throughput": calls / window, "info": info}


JOBS = {"producers": producers}
