"""The project's settings plus a test app (the kill test's ledger) and test tasks' queues."""

from oxproject.settings import *  # noqa: F403
from oxproject.settings import INSTALLED_APPS, TASKS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]
TASKS = {
    "default": {
        **TASKS["default"],
        "QUEUES": ["default", "emails", "reports", "other"],
        "OPTIONS": {"BACKOFF_BASE": 0.05, "BACKOFF_MAX": 0.5},
    }
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
