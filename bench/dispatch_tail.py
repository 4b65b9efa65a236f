"""The dispatch cell with enough samples to read its tail: `bench/.venv/bin/python -m
bench.dispatch_tail [--n 600] [--gap 0.4] [--reps 3] [--arms ox,pgqueuer] [--out FILE]`.

The plan's dispatch cell takes 200 samples in one round per arm, so its p99 is the second
largest sample and one slow moment of the machine decides it (ox/pgqueuer p99 read 0.74x,
0.84x and 1.16x in three full runs). This runs the same job (bench.jobs.dispatch: an idle
worker, enqueue commit -> the task's first line) with `n` samples per round, `reps` rounds per
arm interleaved as the harness interleaves them, and a random pause of 0..`gap` s between
samples; the results file records those settings in the cell's text and is a --cells subset
run, so the dashboard never leads with it."""

import argparse
import dataclasses

from bench import harness
from bench.plan import Cell, build


def tail_cell(base: Cell, n: int, gap: float, reps: int) -> Cell:
    """The plan's dispatch cell with `n` samples a round, pauses of 0..`gap` s and `reps` rounds."""
    about = base.about.replace("random pause of 0..1 s", f"random pause of 0..{gap:g} s")
    about = f"{about} [{n} samples a round, {reps} rounds an arm: bench.dispatch_tail]"
    # A sample takes its pause and a few milliseconds: a second more each is margin enough.
    timeout = max(base.timeout, n * (gap + 1.0) + 120)
    return dataclasses.replace(
        base, about=about, params={**base.params, "n": n, "gap": gap}, reps=reps, timeout=timeout
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=600)
    parser.add_argument("--gap", type=float, default=0.4)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--arms", default="ox,pgqueuer")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.n < 100 or args.reps < 1 or not 0 < args.gap <= 5:
        parser.error("--n at least 100 (a p99 needs them), --reps at least 1, --gap in (0, 5]")
    full = build("full")

    def plan(mode: str) -> list[Cell]:
        return [tail_cell(c, args.n, args.gap, args.reps) for c in full if c.name == "dispatch"]

    harness.build = plan  # the harness builds its plan when it starts; this is the whole plan
    rest = ["--out", args.out] if args.out else []
    harness.main(["--cells", "dispatch", "--arms", args.arms, *rest])


if __name__ == "__main__":
    main()
