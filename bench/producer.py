"""One enqueue producer of the notify cell: `python -m bench.producer <dir> <index>`, with the
arm's settings in DJANGO_SETTINGS_MODULE. It boots Django, enqueues one task to open its
connection (not counted), writes `ready-<index>`, then serves rounds: it waits for
`go-<round>.json` ({"start_at": epoch seconds, "seconds": s}), sleeps until start_at, calls
`noop.enqueue()` sequentially in autocommit until start_at + seconds, and writes
`result-<round>-<index>.json` ({"count", "start", "end"}). A `stop` file ends it; so does
waiting `idle_limit` seconds for a round that never comes. Every wait is bounded."""

import json
import sys
import time
from pathlib import Path


def wait_for(path: Path, limit: float, stop: Path) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if path.exists():
            return True
        if stop.exists():
            return False
        time.sleep(0.005)
    return False


def main() -> None:
    import django

    django.setup()
    from bench.tasks import noop

    work, index = Path(sys.argv[1]), int(sys.argv[2])
    idle_limit = float(sys.argv[3]) if len(sys.argv) > 3 else 120.0
    stop = work / "stop"
    noop.enqueue()  # connect, warm caches
    (work / f"ready-{index}").touch()
    round_no = 0
    while wait_for(work / f"go-{round_no}.json", idle_limit, stop):
        try:
            go = json.loads((work / f"go-{round_no}.json").read_text())
        except ValueError:  # caught mid-write: look again
            time.sleep(0.01)
            continue
        start_at, end_at = go["start_at"], go["start_at"] + go["seconds"]
        time.sleep(max(start_at - time.time(), 0))
        count = 0
        while time.time() < end_at:
            noop.enqueue()
            count += 1
        out = {"count": count, "start": start_at, "end": time.time()}
        tmp = work / f".result-{round_no}-{index}"
        tmp.write_text(json.dumps(out))
        tmp.replace(work / f"result-{round_no}-{index}.json")
        round_no += 1


if __name__ == "__main__":
    main()
