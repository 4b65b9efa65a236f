"""One enqueue producer: `python -m bench.producer <dir> <index> [idle_limit] [hook]`, with the
arm's settings in DJANGO_SETTINGS_MODULE (the notify cell's producers and the enqueue_p* cells',
started by bench.producers.Crowd). It boots Django, builds the arm's enqueue from `hook`
("module:function" returning a Calls-like object; default `bench.producer:django_tasks`, a Django
Tasks backend's `noop.enqueue()`), enqueues once to open its connection (not counted), writes
`ready-<index>`, then serves rounds: it waits for `go-<round>.json` ({"start_at": epoch seconds,
"seconds": s}), sleeps until start_at, calls the enqueue sequentially until start_at + seconds,
and writes `result-<round>-<index>.json` ({"count", "start", "began", "end", "path"}). A `stop`
file ends it; so does waiting `idle_limit` seconds for a round that never comes. Every wait is
bounded."""

import json
import sys
import time
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Protocol

DEFAULT_HOOK = "bench.producer:django_tasks"


class EnqueueLoop(Protocol):
    """What a hook returns: the arm's single enqueue, once (the warm-up) or back to back."""

    path: str  # what one call is, for the results

    def one(self) -> None: ...

    def until(self, end_at: float) -> int: ...

    def close(self) -> None: ...


class Calls:
    """A synchronous enqueue called back to back until a wall-clock instant (time.time(), the
    clock every producer shares): each call returns once its enqueue is committed (or, for
    celery, published), so `until` counts finished enqueues only."""

    def __init__(self, enqueue: Callable[[], object], path: str, close: Callable[[], None] | None = None) -> None:
        self.enqueue = enqueue
        self.path = path
        self._close = close

    def one(self) -> None:
        self.enqueue()

    def until(self, end_at: float) -> int:
        count = 0
        while time.time() < end_at:
            self.enqueue()
            count += 1
        return count

    def close(self) -> None:
        if self._close is not None:
            self._close()


def django_tasks() -> Calls:
    """A Django Tasks backend's enqueue (ox, django-tasks-db, django-ox, dj-queue), as their
    enqueue_seq times it: `noop.enqueue()` in autocommit on Django's connection."""
    from bench.tasks import noop

    return Calls(noop.enqueue, "noop.enqueue()")


def load(hook: str) -> EnqueueLoop:
    module, name = hook.split(":")
    return getattr(import_module(module), name)()


def wait_for(path: Path, limit: float, stop: Path) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if path.exists():
            return True
        if stop.exists():
            return False
        time.sleep(0.005)
    return False


# How long a go-file may stay unreadable (caught mid-write) before the producer gives up on it.
GO_READ_LIMIT = 5.0


def read_go(path: Path, limit: float = GO_READ_LIMIT) -> dict:
    """A round's go-file, read again while it is caught mid-write; one that is still not a
    round's JSON after `limit` seconds is an error (raised: the harness sees the producer exit),
    not a wait without end."""
    deadline = time.monotonic() + limit
    while True:
        try:
            go = json.loads(path.read_text())
            if isinstance(go, dict) and all(isinstance(go.get(k), (int, float)) for k in ("start_at", "seconds")):
                return go
            problem = f"not a round: {go!r:.200}"
        except (OSError, ValueError) as exc:
            problem = str(exc)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path}: unreadable for {limit:.0f} s ({problem})")
        time.sleep(0.01)


def main() -> None:
    import django

    django.setup()

    work, index = Path(sys.argv[1]), int(sys.argv[2])
    idle_limit = float(sys.argv[3]) if len(sys.argv) > 3 else 120.0
    calls = load(sys.argv[4] if len(sys.argv) > 4 else DEFAULT_HOOK)
    stop = work / "stop"
    try:
        calls.one()  # connect, warm caches: one row the harness expects beside the counted ones
        (work / f"ready-{index}").touch()
        round_no = 0
        while wait_for(work / f"go-{round_no}.json", idle_limit, stop):
            go = read_go(work / f"go-{round_no}.json")
            start_at, end_at = go["start_at"], go["start_at"] + go["seconds"]
            time.sleep(max(start_at - time.time(), 0))
            began = time.time()
            count = calls.until(end_at)
            out = {"count": count, "start": start_at, "began": began, "end": time.time(), "path": calls.path}
            tmp = work / f".result-{round_no}-{index}"
            tmp.write_text(json.dumps(out))
            tmp.replace(work / f"result-{round_no}-{index}.json")
            round_no += 1
    finally:
        calls.close()


if __name__ == "__main__":
    main()
