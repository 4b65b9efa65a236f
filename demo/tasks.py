"""Tasks the first-run demo enqueues: some succeed, one fails and retries, one is delayed."""

import hashlib
import time

from django.tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="reports")
def checksum(text: str, rounds: int = 1000) -> str:
    digest = text.encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


@task(queue_name="emails", takes_context=True, max_attempts=3, backoff=lambda exc, result: 2)
def flaky_email(context, to: str) -> str:
    # Fails its first two attempts, then succeeds: shows retries with backoff.
    if context.attempt < 3:
        raise ConnectionError(f"SMTP server for {to} did not answer (attempt {context.attempt})")
    return f"sent to {to}"


@task(max_attempts=2, backoff=lambda exc, result: 1)
def always_fails(reason: str) -> None:
    raise RuntimeError(reason)


@task
def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def _load(rows: int) -> list[int]:
    time.sleep(0.5)
    return list(range(rows))


@task(queue_name="reports", takes_context=True, max_attempts=3)
def export_report(context, rows: int = 40, pause: float = 0.25) -> int:
    """A long task: a durable step (ox.step: a retry does not load again), then a live
    progress bar on the dashboard while it writes (context.metadata)."""
    import ox

    loaded = ox.step("load", _load, rows)
    for done, _row in enumerate(loaded, start=1):
        time.sleep(pause)
        context.metadata["stage"] = "writing"
        context.metadata["progress"] = done / len(loaded)
        context.save_metadata()
    context.metadata["stage"] = "done"
    return len(loaded)


@task
def fetch_album(album: str) -> list[str]:
    """A workflow's first step (ox.chain): what the next steps work on."""
    time.sleep(0.3)
    return [f"{album}/photo-{n}.jpg" for n in range(1, 5)]


@task
def resize(photos: list[str], n: int, width: int = 640) -> str:
    """A group member (ox.group): one photo of the album, in parallel with the others."""
    time.sleep(0.2 + 0.1 * n)
    return f"{photos[n]}@{width}w"


@task
def publish(resized: list[str]) -> str:
    """The group's callback: once, with every member's result, after all succeeded."""
    return f"published {len(resized)} photos"


def album_workflow(album: str) -> object:
    """fetch_album -> 4 resize in parallel -> publish: the demo's chain with a group in it."""
    import ox

    return ox.chain(fetch_album.s(album), ox.group([resize.s(n) for n in range(4)]), publish.s()).enqueue(
        name=f"album {album}"
    )


@task
def trickle(tick: int = 0) -> int:
    """Run every few seconds while ./run shows the demo (settings: OX_DEMO), so the overview's
    chart moves: a few small tasks, now and then a report with a progress bar."""
    import random

    n = random.randint(1, 4)  # noqa: S311 (not crypto)
    for i in range(n):
        add.enqueue(i, tick)
    if random.random() < 0.1:  # noqa: S311
        export_report.enqueue(20, 0.2)
    if random.random() < 0.1:  # noqa: S311
        album_workflow(f"trickle-{tick}")
    return n
