"""Arm "dj-queue" (PyPI dj-queue; import name dj_queue), configured as its README's installation
says: the app in INSTALLED_APPS, its database router, `DjQueueBackend` as the default Tasks backend
with `QUEUES: []` (any queue name) and `OPTIONS: {}`, every option at its default. The one thing a
cell varies, the worker's threads, reaches the worker as a TOML overlay on its command line
(`manage.py dj_queue --config FILE`, written by bench.arms.djqueue), dj-queue's own CLI override."""

from bench.settings_base import *  # noqa: F403
from bench.settings_base import INSTALLED_APPS, LOGGING

INSTALLED_APPS = [*INSTALLED_APPS, "dj_queue"]
DATABASE_ROUTERS = ["dj_queue.routers.DjQueueRouter"]
TASKS = {"default": {"BACKEND": "dj_queue.backend.DjQueueBackend", "QUEUES": [], "OPTIONS": {}}}
# Quiet, as every arm's workers are.
LOGGING = {**LOGGING, "loggers": {**LOGGING["loggers"], "dj_queue": {"level": "WARNING"}}}
