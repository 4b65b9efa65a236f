"""Tasks of tests/test_attack_slots.py; importable by worker subprocesses."""

from django.tasks import task

from tests.flow_tasks import _span


@task(queue_name="default")
def long_default(key: str, seconds: float) -> str:
    """A task of an unlimited queue, to keep a worker's threads busy."""
    return _span(key, "default", seconds)


@task(queue_name="reports")
def slow_report(key: str, seconds: float) -> str:
    """A task of the `reports` queue (the tests give it a rate: gated)."""
    return _span(key, "reports", seconds)
