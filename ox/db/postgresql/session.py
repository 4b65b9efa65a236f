"""PostgreSQL: what a worker's own connection is given (ox.connection). Both ends of it get
TCP keepalives, so a network partition that closes nothing (a cable pulled, a host frozen, a
firewall dropping packets) ends the session within seconds instead of hours:

- the worker's side (libpq `keepalives*` and `tcp_user_timeout`) notices that the server is
  gone, so the worker stops waiting on a dead socket and reconnects;
- the server's side (the per-session settings `tcp_keepalives_*` and `tcp_user_timeout`)
  ends the dead backend, and with it the worker's liveness advisory lock, its LISTEN, and any
  transaction or row lock it held.

Defaults: first probe after 5 s of silence, then every 2 s, give up after 3 unanswered
(`tcp_user_timeout` = 5 + 2 x 3 = 11 s, which also bounds unacknowledged writes). The
database's own OPTIONS win, key by key (`"keepalives_idle": 30`, ... in DATABASES, or
`?keepalives_idle=30` in DATABASE_URL); the server side follows the same values.
`"keepalives": 0` turns all of it off.

Behind a transaction-mode pooler (ox OPTIONS POOLER = "transaction") the server's side is not
set: a session-level setting would stay on the pooler's server connection after the worker's
transaction, and so apply to whichever client gets that server connection next. The worker's
side still applies, to its TCP connection to the pooler; the pooler's own keepalive settings
cover the rest.
"""

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db.backends.base.base import BaseDatabaseWrapper

from ox.db.postgresql.prepared import GENERIC

NEVER = 2**62  # executions before psycopg prepares a statement on its own
KEEPALIVE_DEFAULTS = {"keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3}
# libpq connection parameter -> the server's per-session setting of the same meaning.
SERVER_SETTINGS = {
    "keepalives_idle": "tcp_keepalives_idle",  # seconds
    "keepalives_interval": "tcp_keepalives_interval",  # seconds
    "keepalives_count": "tcp_keepalives_count",
    "tcp_user_timeout": "tcp_user_timeout",  # milliseconds
}


def keepalive_settings(options: dict[str, Any]) -> dict[str, int] | None:
    """The keepalive values for a PostgreSQL worker connection, given the database's OPTIONS:
    theirs where set, ox's defaults otherwise. None when OPTIONS turn keepalives off."""

    def number(key: str, value: Any) -> int:
        try:
            parsed = int(str(value).strip())
        except ValueError:
            parsed = -1
        if parsed < 0:
            raise ImproperlyConfigured(f"DATABASES OPTIONS {key!r} must be a whole number >= 0, got {value!r}")
        return parsed

    if "keepalives" in options and number("keepalives", options["keepalives"]) == 0:
        return None
    values = {key: number(key, options.get(key, default)) for key, default in KEEPALIVE_DEFAULTS.items()}
    silent = values["keepalives_idle"] + values["keepalives_interval"] * values["keepalives_count"]
    values["tcp_user_timeout"] = number("tcp_user_timeout", options.get("tcp_user_timeout", silent * 1000))
    return values


def worker_options(options: dict[str, Any], pooled: bool) -> dict[str, str] | None:
    """Set the worker's side in `options` (libpq's); the server's side, to be set at connect
    (None behind a transaction pooler: nothing may stay on a session the pooler shares)."""
    if pooled:
        # A prepared statement lives in the server session it was prepared on, which a
        # transaction pooler hands to others between transactions (PgBouncer < 1.21 does
        # not track them). Django's default already prepares nothing (and its client-side
        # binding cursors never do); the worker's own connection makes sure of it.
        options["prepare_threshold"] = None
    keepalives = keepalive_settings(options)
    server: dict[str, str] = {}
    if keepalives is not None:
        options.update({"keepalives": 1, **keepalives})
        server = {SERVER_SETTINGS[key]: str(value) for key, value in keepalives.items()}
    if pooled:
        return None
    # No JIT for the worker's statements: the claim's plan is a walk whose estimated cost
    # grows with the backlog and the number of queues, past the JIT thresholds, and compiling
    # it costs hundreds of milliseconds where running it costs one. (Behind a transaction
    # pooler: ALTER ROLE ... SET jit = off, docs/deployment.md.)
    server["jit"] = "off"
    # The worker's claims are prepared and run with generic plans (ox.db.postgresql.prepared).
    # psycopg prepares nothing else here on its own (a threshold never reached, rather than
    # None, which would refuse the claims' explicit prepare too): with server_side_binding on,
    # its automatic preparing would otherwise give every statement repeated five times the
    # session's generic plans.
    options["prepare_threshold"] = NEVER
    server[GENERIC[0]] = GENERIC[1]
    return server


def start_session(conn: BaseDatabaseWrapper, server: dict[str, str]) -> None:
    """Set the server's side (and jit off) on the new session, in one round trip."""
    pairs = list(server.items())
    raw = conn.connection
    with raw.cursor() as cursor:
        cursor.execute(
            "SELECT " + ", ".join("set_config(%s, %s, false)" for _ in pairs), [part for pair in pairs for part in pair]
        )
    if not raw.autocommit:  # AUTOCOMMIT off: make the settings outlive this transaction
        raw.commit()
