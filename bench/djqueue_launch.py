"""`python -m bench.djqueue_launch dj_queue --config FILE`: bench.launch for dj-queue, whose
supervisor forks its worker and dispatcher processes (`mode = "fork"`, its default). Every process
of the tree counts its own statements (a forked child starts again from zero) and adds them to
the one count file at exit, under a file lock, so the harness reads the whole tree's sum as it
reads one process's for the other arms."""

import fcntl
import json
import os

from bench import launch


def _add_to_file() -> None:
    path = os.environ.get("BENCH_SQL_COUNT_FILE")
    if not path:
        return
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        try:
            total = json.loads(fh.read() or "{}")
        except ValueError:
            total = {}
        for key, n in launch.COUNTS.items():
            total[key] = total.get(key, 0) + n
            launch.COUNTS[key] = 0  # a second exit path (os._exit after atexit) adds nothing twice
        fh.seek(0)
        fh.truncate()
        json.dump(total, fh)


def _zero_in_child() -> None:
    for key in launch.COUNTS:
        launch.COUNTS[key] = 0


def main() -> None:
    launch._dump = _add_to_file  # install_counter registers this at exit and on os._exit
    os.register_at_fork(after_in_child=_zero_in_child)
    launch.main()


if __name__ == "__main__":
    main()
