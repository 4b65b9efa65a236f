"""Arm "django-tasks-db" (PyPI django-tasks-db; import name django_tasks_db, app label
django_tasks_database), package defaults."""

from bench.settings_base import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "django_tasks_db"]  # noqa: F405
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"], "OPTIONS": {}}}
