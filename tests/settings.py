"""The project's settings plus a test app (the kill test's ledger) and test tasks' queues."""

import json
import os

# DEBUG defaults to off (production-safe); the tests run the local setup, as ./run does: DEBUG's
# plain static storage (no collectstatic needed) and a local key. Set before the project's
# settings read it; worker subprocesses inherit it through the environment.
os.environ["DJANGO_DEBUG"] = "1"

from oxproject.settings import *  # noqa: E402, F403
from oxproject.settings import INSTALLED_APPS, TASKS  # noqa: E402

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]
TASKS = {
    "default": {
        **TASKS["default"],
        "QUEUES": ["default", "emails", "reports", "other"],
        # Worker subprocesses of a test get extra OPTIONS (short leases...) through the env.
        "OPTIONS": {"BACKOFF_BASE": 0.05, "BACKOFF_MAX": 0.5, **json.loads(os.environ.get("OX_TEST_OPTIONS", "{}"))},
    }
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Each pytest run gets its own test database, so concurrent runs (two legs, two developers)
# never drop each other's. Worker subprocesses are pointed at it by DATABASE_URL.
_suffix = os.environ.get("OX_TEST_DB_SUFFIX") or str(os.getpid())
_db = DATABASES["default"]  # noqa: F405
if _db["ENGINE"].endswith("sqlite3"):
    _db["TEST"] = {"NAME": str(VAR_DIR / f"test-{_suffix}.sqlite3")}  # noqa: F405
else:
    _db["TEST"] = {**_db.get("TEST", {}), "NAME": f"test_{_db['NAME']}_{_suffix}"}
