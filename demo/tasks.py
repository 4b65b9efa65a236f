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
