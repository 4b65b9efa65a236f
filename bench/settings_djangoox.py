"""Arm "django-ox" (PyPI django-ox; import name django_ox, app label django_ox: no clash with
our app "ox"), package defaults (LOCK_TIMEOUT 300 s)."""

from bench.settings_base import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "django_ox"]  # noqa: F405
TASKS = {"default": {"BACKEND": "django_ox.backend.OxBackend", "QUEUES": ["default"], "OPTIONS": {}}}
