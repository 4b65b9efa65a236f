"""Arm "procrastinate": procrastinate's Django contrib app (`procrastinate.contrib.django`),
configured as its Django docs say: the app in INSTALLED_APPS, its schema by `manage.py migrate`
(its migrations are Django migrations), every PROCRASTINATE_* setting at its default except
IMPORT_PATHS, which names the module holding the benchmark's tasks (bench is not an installed
app, so the contrib's autodiscovery of `<app>.tasks` would not find them).

procrastinate is not a Django Tasks backend: enqueues are `task.defer()` on procrastinate's own
tasks (bench.procrastinate_tasks), which the contrib's DjangoConnector runs on Django's
connection. The dummy Tasks backend keeps a stray `task.enqueue()` from running anything."""

from bench.settings_base import *  # noqa: F403
from bench.settings_base import INSTALLED_APPS, LOGGING

INSTALLED_APPS = [*INSTALLED_APPS, "procrastinate.contrib.django"]
TASKS = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend"}}
PROCRASTINATE_IMPORT_PATHS = ["bench.procrastinate_tasks"]
# Quiet, as every arm's workers are: procrastinate logs every job start and end at INFO.
LOGGING = {**LOGGING, "loggers": {**LOGGING["loggers"], "procrastinate": {"level": "WARNING"}}}
