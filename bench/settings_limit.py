"""Arm "limit": Django only for the harness's agent (its reads of the ledger and of the limit's
table go through Django's connection, as for every arm). No queue app: the limit is bare SQL
(bench.limit_sql), and its workers (bench.limit_worker) run without Django. The dummy backend
keeps a stray `task.enqueue()` from running anything in the agent."""

from bench.settings_base import *  # noqa: F403

TASKS = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
