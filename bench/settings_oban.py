"""Arm "oban" (PyPI oban, the Python port of Oban): Django only for the harness's agent (its reads
of the ledger and of oban_jobs go through Django's connection, as for every arm). No queue app:
oban is not a Django backend, and its workers (bench.oban_worker) run without Django. The dummy
backend keeps a stray `task.enqueue()` from running anything in the agent."""

from bench.settings_base import *  # noqa: F403

TASKS = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
