"""A task the production entrypoint's worker can import: it runs with the project's own
settings, where neither the demo app (a project may drop it) nor tests.testapp (whose models
tests/tasks.py imports) is installed. Importable by worker subprocesses (tests.production_tasks.*)."""

from django.tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b
