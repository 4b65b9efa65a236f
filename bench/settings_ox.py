"""Arm "ox": this repository's ox app, package defaults (empty OPTIONS). BENCH_QUEUES
(comma-separated, default "default") adds queues: the notify cell's idle worker listens on a
queue no task goes to. BENCH_OX_LIMITS (JSON, queue -> limits) sets OPTIONS["LIMITS"]: only
the flow-control cells' workers get it (bench.flow), every other run keeps the defaults."""

import json
import os

from bench.settings_base import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "ox"]  # noqa: F405
QUEUES = os.environ.get("BENCH_QUEUES", "default").split(",")
_LIMITS = json.loads(os.environ.get("BENCH_OX_LIMITS") or "{}")
TASKS = {
    "default": {
        "BACKEND": "ox.backend.OxBackend",
        "QUEUES": QUEUES,
        "OPTIONS": {"LIMITS": _LIMITS} if _LIMITS else {},
    }
}
