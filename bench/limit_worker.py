"""One worker process of the "limit" arm: `python -m bench.limit_worker --concurrency C --ident ID`,
started by bench.fleet like every arm's workers. C bare loops (bench.limit_sql.Loop), each a
thread with its own persistent autocommit psycopg connection; no framework, no Django.

SIGTERM (bench.procs.stop) stops the loops between batches. BENCH_SQL_COUNT_FILE: the statements
the loops sent, written at exit in bench.launch's format (every one is its own autocommit
transaction, so there are no BEGIN / COMMIT to count).
"""

import argparse
import json
import os
import signal
import threading
import time
from types import FrameType

from bench.limit_sql import BATCH, Loop

# A bound on the process's life: the harness stops it long before (its longest drain waits 600 s).
MAX_LIFE_S = 3600.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.limit_worker")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--ident", required=True)
    parser.add_argument("--batch", type=int, default=BATCH)
    args = parser.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    deadline = time.monotonic() + MAX_LIFE_S
    loops = [
        Loop(os.environ["BENCH_DB_URL"], batch=args.batch, stop=stop, deadline=deadline)
        for _ in range(max(args.concurrency, 1))
    ]
    threads = [threading.Thread(target=loop.run, name=f"{args.ident}-{i}") for i, loop in enumerate(loops)]
    for thread in threads:
        thread.start()
    # The main thread waits in short steps so the signal handler runs promptly.
    while not stop.is_set() and time.monotonic() < deadline and any(t.is_alive() for t in threads):
        stop.wait(0.5)
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    path = os.environ.get("BENCH_SQL_COUNT_FILE")
    if path:
        with open(path, "w") as fh:
            json.dump({"executes": sum(loop.statements for loop in loops), "begins": 0, "commits": 0}, fh)


if __name__ == "__main__":
    main()
