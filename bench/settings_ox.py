"""Arm "ox": this repository's ox app, package defaults (empty OPTIONS). BENCH_QUEUES
(comma-separated, default "default") adds queues: the notify cell's idle worker listens on a
queue no task goes to."""

import os

from bench.settings_base import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "ox"]  # noqa: F405
QUEUES = os.environ.get("BENCH_QUEUES", "default").split(",")
TASKS = {"default": {"BACKEND": "ox.backend.OxBackend", "QUEUES": QUEUES, "OPTIONS": {}}}
