"""tests.settings for worker and producer subprocesses that reach the test database through
PgBouncer (tests/test_pgbouncer.py): DATABASE_URL points at PgBouncer; OX_TEST_DIRECT_URL,
when set, adds the alias "direct" to the same database without it (for LISTEN_DATABASE)."""

import os

import dj_database_url

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

# Django's advice for transaction pooling (ox.W006): no WITH HOLD cursors across statements.
DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
if os.environ.get("OX_TEST_DIRECT_URL"):
    DATABASES["direct"] = dj_database_url.parse(os.environ["OX_TEST_DIRECT_URL"])
