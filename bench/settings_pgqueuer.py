"""Arm "pgqueuer": Django only for the harness's agent (its reads of the ledger and of pgqueuer's
tables go through Django's connection, as for every arm). No queue app: pgqueuer is not a Django
backend, and its workers (bench.pgq_worker) run without Django. The dummy backend keeps a stray
`task.enqueue()` from running anything in the agent."""

from bench.settings_base import *  # noqa: F403

TASKS = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
