"""Arm "celery": Celery 5 with Redis as broker and result backend, through Celery's documented
Django integration (bench.celery_app: `config_from_object("django.conf:settings", namespace="CELERY")`).
Django is here for the agent's ledger reads and the tasks' ledger writes, as for every arm; the
queue itself is in Redis, database BENCH_CELERY_REDIS_DB (5) of 127.0.0.1:6379, which the arm
flushes (that database only) before every run. The dummy Tasks backend keeps a stray
`task.enqueue()` from running anything.

Every CELERY_* setting at Celery's default except:
- the broker and the result backend (Redis; the result backend is where the harness reads
  completions: a task's SUCCESS record, written by the worker after the task returns);
- CELERY_TASK_ACKS_LATE = True: the message is acknowledged after the task returns, not when the
  worker receives it, so a worker that dies mid-task has not acknowledged it and it can be
  delivered again (at-least-once, what the other arms do). Celery's default (acks early) would
  drop such a task for good. task_reject_on_worker_lost stays unset (None: off; Celery's docs
  warn it can loop a message that kills its worker), which matters only when a pool process dies
  under a live main process: the kill cell kills the whole worker."""

import os

from bench.settings_base import *  # noqa: F403
from bench.settings_base import LOGGING

TASKS = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
REDIS_URL = f"redis://127.0.0.1:6379/{int(os.environ.get('BENCH_CELERY_REDIS_DB', '5'))}"
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_ACKS_LATE = True
# Celery 5 warns at every worker start unless this is set; True is its current default behaviour.
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
LOGGING = {**LOGGING, "loggers": {**LOGGING["loggers"], "celery": {"level": "WARNING"}}}
