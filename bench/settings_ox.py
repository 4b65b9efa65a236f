"""Arm "ox": this repository's ox app, package defaults (empty OPTIONS)."""

from bench.settings_base import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "ox"]  # noqa: F405
TASKS = {"default": {"BACKEND": "ox.backend.OxBackend", "QUEUES": ["default"], "OPTIONS": {}}}
