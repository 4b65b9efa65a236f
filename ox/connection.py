"""The worker's own database connection: opened once, held for the worker's life whatever
CONN_MAX_AGE says, never shared with task bodies (which use Django's per-thread ones)."""

import copy

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper


def open_worker_connection(alias: str) -> BaseDatabaseWrapper:
    conn = connections.create_connection(alias)
    settings = copy.deepcopy(conn.settings_dict)
    # A pooled connection would go back to the pool between statements; the worker's
    # session state (LISTEN, its liveness advisory lock) must stay on one session.
    settings.get("OPTIONS", {}).pop("pool", None)
    settings["CONN_MAX_AGE"] = None
    conn.settings_dict = settings
    conn.ensure_connection()
    return conn
