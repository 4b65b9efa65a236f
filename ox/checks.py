"""System checks with stable ids: every misconfiguration that would otherwise fail late, in
a worker at its first tick or in production at its first write.

ox.E001  invalid OPTIONS value
ox.E002  invalid schedule definition (keys, every, args, timezone, missed policy)
ox.E003  invalid cron expression in a schedule
ox.E004  a schedule's task does not import, or is not a Task
ox.E005  a schedule's queue is not in the backend's QUEUES
ox.E006  one schedule name declared by two backends (their ticks would share rows)
ox.E007  OPTIONS DATABASE names no database in DATABASES
ox.W001  SQLite without WAL: web and worker processes would lock each other out
ox.W002  PREFETCH with MAX_ATTEMPTS 1: a dying worker fails the tasks it had not started
ox.W003  HEARTBEAT over a third of LEASE: one slow heartbeat loses every lease
ox.W004  OX_METRICS_TOKEN shorter than 16 characters
ox.E009  OPTIONS LISTEN_DATABASE names no database in DATABASES
ox.E010  OPTIONS POOLER or LISTEN_DATABASE on a database that is not PostgreSQL
ox.W005  POOLER "transaction" with server-side binding and a prepare_threshold: prepared statements
ox.W006  POOLER "transaction" without DISABLE_SERVER_SIDE_CURSORS: Django's .iterator() cursors
ox.E011  OPTIONS LIMITS names a queue that is not in the backend's QUEUES (the limit would never apply)
ox.W007  MariaDB/MySQL: ox's tables are not utf8mb4, or their collation pads or ignores case
         (a database check: `manage.py check --database default`, and at every migrate)
ox.W008  two backends on one database with different retention (PRUNE, PRUNE_WORKERS): the
         tables are shared, so each one's pruners apply its retention to the other's tasks too
"""

import os
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ox.conf import OxOptions
from ox.schedules import Schedule, ScheduleError, parse_schedule

BACKEND_PATH = "ox.backend.OxBackend"
MIN_TOKEN_LENGTH = 16

Messages = list[checks.CheckMessage]


def _ox_backends() -> Iterator[tuple[str, dict[str, Any]]]:
    for alias, params in getattr(settings, "TASKS", {}).items():
        if params.get("BACKEND") == BACKEND_PATH:
            yield alias, params


def _options(params: dict[str, Any]) -> OxOptions | None:
    try:
        return OxOptions.from_dict(params.get("OPTIONS", {}))
    except ImproperlyConfigured:
        return None


def _ox_databases() -> Iterator[tuple[str, OxOptions, str]]:
    """(backend alias, its options, the database alias it writes to) for each ox backend
    whose OPTIONS are valid (invalid ones are ox.E001's)."""
    from django.db import router

    from ox.models import Task

    for alias, params in _ox_backends():
        options = _options(params)
        if options is not None:
            yield alias, options, options.database or router.db_for_write(Task)


@checks.register(checks.Tags.compatibility)
def check_options(app_configs: Any = None, **kwargs: Any) -> Messages:
    errors: Messages = []
    for alias, params in _ox_backends():
        try:
            OxOptions.from_dict(params.get("OPTIONS", {}))
        except ScheduleError:
            continue  # reported per schedule, with its own id, by check_schedules
        except ImproperlyConfigured as exc:
            errors.append(checks.Error(f"TASKS[{alias!r}]: {exc}", id="ox.E001"))
    return errors


def _schedules(alias: str, params: dict[str, Any], errors: Messages) -> list[Schedule]:
    raw = params.get("OPTIONS", {}).get("SCHEDULES", {})
    if not isinstance(raw, dict):
        errors.append(checks.Error(f"TASKS[{alias!r}] OPTIONS SCHEDULES must be a dict", id="ox.E002"))
        return []
    found = []
    for name, spec in raw.items():
        try:
            found.append(parse_schedule(name, spec))
        except ScheduleError as exc:
            errors.append(checks.Error(f"TASKS[{alias!r}]: {exc}", id=exc.check_id))
    return found


@checks.register(checks.Tags.compatibility)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> Messages:
    from ox.periodic import resolve_task

    errors: Messages = []
    owners: dict[str, str] = {}
    for alias, params in _ox_backends():
        queues = set(params.get("QUEUES", []))
        for schedule in _schedules(alias, params, errors):
            where = f"TASKS[{alias!r}] SCHEDULES[{schedule.name!r}]"
            if schedule.name in owners:
                errors.append(checks.Error(f"{where}: also declared by TASKS[{owners[schedule.name]!r}]", id="ox.E006"))
            owners.setdefault(schedule.name, alias)
            try:
                task = resolve_task(schedule.task_path)
            except Exception as exc:  # noqa: BLE001  (any import-time failure is the finding)
                errors.append(checks.Error(f"{where}: task {schedule.task_path!r}: {exc}", id="ox.E004"))
                continue
            queue = schedule.queue or task.queue_name
            if queues and queue not in queues:
                errors.append(
                    checks.Error(
                        f"{where}: queue {queue!r} is not in the backend's QUEUES ({', '.join(sorted(queues))})",
                        id="ox.E005",
                    )
                )
    return errors


@checks.register(checks.Tags.compatibility)
def check_limits(app_configs: Any = None, **kwargs: Any) -> Messages:
    """LIMITS values are checked with the other OPTIONS (ox.E001); here what they name."""
    messages: Messages = []
    for alias, params in _ox_backends():
        options = _options(params)
        if options is None:
            continue
        queues = set(params.get("QUEUES", []))
        for queue in options.queue_limits():
            if queues and queue not in queues:
                messages.append(
                    checks.Error(
                        f"TASKS[{alias!r}] OPTIONS LIMITS[{queue!r}]: the queue is not in the backend's QUEUES"
                        f" ({', '.join(sorted(queues))}); the limit would never apply.",
                        id="ox.E011",
                    )
                )
    return messages


# Tagged "compatibility", not "database": it reads settings only, so a plain `manage.py check`
# runs it.
@checks.register(checks.Tags.compatibility)
def check_database_settings(app_configs: Any = None, **kwargs: Any) -> Messages:
    messages: Messages = []
    for alias, _opts, db in _ox_databases():
        if db not in settings.DATABASES:
            messages.append(checks.Error(f"TASKS[{alias!r}] OPTIONS DATABASE {db!r} is not in DATABASES", id="ox.E007"))
            continue
        if not settings.USE_TZ:
            messages.append(
                checks.Error(
                    f"TASKS[{alias!r}] needs USE_TZ = True: ox stores and compares aware UTC times"
                    " (run_after, leases) across processes and hosts.",
                    id="ox.E008",
                )
            )
        database = settings.DATABASES[db]
        init = str(database.get("OPTIONS", {}).get("init_command", "")).lower().replace(" ", "")
        if database.get("ENGINE") == "django.db.backends.sqlite3" and "journal_mode=wal" not in init:
            messages.append(
                checks.Warning(
                    f"DATABASES[{db!r}] (SQLite, used by TASKS[{alias!r}]) does not set WAL mode: a worker"
                    " process and the web process will block each other's reads and writes.",
                    hint='Add "init_command": "PRAGMA journal_mode=WAL;" to its OPTIONS.',
                    id="ox.W001",
                )
            )
    return messages


@checks.register(checks.Tags.compatibility)
def check_worker_policy(app_configs: Any = None, **kwargs: Any) -> Messages:
    messages: Messages = []
    for alias, params in _ox_backends():
        options = _options(params)
        if options is None:
            continue
        if options.prefetch > 0 and options.max_lost == 1:
            messages.append(
                checks.Warning(
                    f"TASKS[{alias!r}]: PREFETCH={options.prefetch} with MAX_LOST=1: a task is FAILED the first"
                    " time its worker dies, even one that was only prefetched and never started.",
                    hint="Set MAX_LOST to 2 or more, or PREFETCH to 0.",
                    id="ox.W002",
                )
            )
        if options.heartbeat > options.lease / 3:
            messages.append(
                checks.Warning(
                    f"TASKS[{alias!r}]: HEARTBEAT={options.heartbeat:g}s is over a third of LEASE={options.lease:g}s:"
                    " one slow heartbeat (a busy database, a GC pause) lets the leases expire and the rescuer"
                    " run the tasks twice.",
                    hint="Keep HEARTBEAT at most LEASE / 3.",
                    id="ox.W003",
                )
            )
    return messages


@checks.register(checks.Tags.compatibility)
def check_retention(app_configs: Any = None, **kwargs: Any) -> Messages:
    """ox_task and ox_worker carry no backend: on a database two backends share, the workers
    of each prune every row by their own rules, so the shortest retention of each status is
    the one in force, whatever the other backend (and its Health row) says."""
    messages: Messages = []
    seen: dict[str, tuple[str, Any]] = {}  # database -> (first backend, its retention)
    for alias, options, db in _ox_databases():
        retention = (options.prune_rules(), options.worker_retention())
        first = seen.setdefault(db, (alias, retention))
        if first[0] != alias and first[1] != retention:
            messages.append(
                checks.Warning(
                    f"TASKS[{first[0]!r}] and TASKS[{alias!r}] share database {db!r} but set different retention"
                    " (PRUNE, PRUNE_WORKERS): the tables are shared, so the workers of each prune the other's"
                    " tasks and worker rows too, and the shorter retention of each applies to both.",
                    hint="Give both backends the same PRUNE and PRUNE_WORKERS, or each a database of its own.",
                    id="ox.W008",
                )
            )
    return messages


def _is_postgres(database: dict[str, Any]) -> bool:
    engine = str(database.get("ENGINE", ""))
    return "postgresql" in engine or "postgis" in engine  # Django's backend, GeoDjango's, or a wrapper


def _pooling_messages(alias: str, options: OxOptions, db: str) -> Messages:
    messages: Messages = []
    where = f"TASKS[{alias!r}]"
    database = settings.DATABASES.get(db, {})
    if (options.pooler is not None or options.listen_database) and not _is_postgres(database):
        messages.append(
            checks.Error(
                f"{where} OPTIONS POOLER/LISTEN_DATABASE apply to PostgreSQL only; DATABASES[{db!r}] is"
                f" {database.get('ENGINE')!r}",
                id="ox.E010",
            )
        )
        return messages  # the rest is about PostgreSQL
    listen = options.listen_database
    if listen is not None and listen not in settings.DATABASES:
        messages.append(checks.Error(f"{where} OPTIONS LISTEN_DATABASE {listen!r} is not in DATABASES", id="ox.E009"))
    elif listen is not None and not _is_postgres(settings.DATABASES[listen]):
        engine = settings.DATABASES[listen].get("ENGINE")
        messages.append(
            checks.Error(f"{where} OPTIONS LISTEN_DATABASE {listen!r} is {engine!r}, not PostgreSQL", id="ox.E010")
        )
    elif listen is not None and options.pooled and listen == db:
        messages.append(
            checks.Error(
                f"{where} OPTIONS LISTEN_DATABASE {listen!r} is ox's own database, which POOLER says is behind"
                " a transaction pooler: LISTEN needs an alias that reaches PostgreSQL directly.",
                id="ox.E009",
            )
        )
    if not options.pooled:
        return messages
    db_options = database.get("OPTIONS", {})
    if db_options.get("server_side_binding") is True and db_options.get("prepare_threshold") is not None:
        messages.append(
            checks.Warning(
                f"DATABASES[{db!r}] (behind a transaction pooler, TASKS[{alias!r}] POOLER) sets server_side_binding"
                f" and prepare_threshold={db_options['prepare_threshold']!r}: psycopg prepares statements on a"
                " server session the pooler hands to other clients between transactions. PgBouncer before 1.21"
                " (or with max_prepared_statements = 0) then fails them with 'prepared statement ... does not"
                " exist' or '... already exists'. ox's worker connections prepare nothing; task bodies and the"
                " web use these OPTIONS.",
                hint="Drop prepare_threshold (Django's default, None, prepares nothing), or run PgBouncer >= 1.21"
                " with max_prepared_statements > 0.",
                id="ox.W005",
            )
        )
    if database.get("DISABLE_SERVER_SIDE_CURSORS") is not True:
        messages.append(
            checks.Warning(
                f"DATABASES[{db!r}] is behind a transaction pooler (TASKS[{alias!r}] POOLER) but does not set"
                " DISABLE_SERVER_SIDE_CURSORS: Django's QuerySet.iterator() (and forms' model choices) declare"
                " a WITH HOLD cursor outside a transaction and fetch from it in later statements, which the"
                " pooler may send to another server session.",
                hint='Set "DISABLE_SERVER_SIDE_CURSORS": True on that database (Django\'s advice for'
                " transaction pooling).",
                id="ox.W006",
            )
        )
    return messages


@checks.register(checks.Tags.compatibility)
def check_pooling(app_configs: Any = None, **kwargs: Any) -> Messages:
    messages: Messages = []
    for alias, options, db in _ox_databases():
        if db in settings.DATABASES:  # else ox.E007
            messages.extend(_pooling_messages(alias, options, db))
    return messages


@checks.register(checks.Tags.database)
def check_mysql_collation(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> Messages:
    from django.db import DatabaseError, connections

    from ox.db import driver

    messages: Messages = []
    seen = set()
    for _alias, _options, db in _ox_databases():
        if db in seen or db not in (databases or ()) or db not in settings.DATABASES:
            continue
        seen.add(db)
        conn = connections[db]
        # The driver says what is wrong (MariaDB/MySQL: ox.db.mysql.charset); the others have
        # nothing to say and send nothing. A database ox has no driver for is left alone here:
        # the worker and enqueue say so.
        try:
            found = driver(conn)
        except ImproperlyConfigured:
            continue
        try:
            problems = found.collation_problems(conn)
        except DatabaseError:
            continue  # not reachable: the database's own errors say more
        for problem in problems:
            messages.append(
                checks.Warning(
                    f"DATABASES[{db!r}]: {problem}.",
                    hint="ALTER DATABASE ... CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin before the first"
                    " migrate (MySQL 8: utf8mb4_0900_bin); existing tables: ALTER TABLE ... CONVERT TO"
                    " CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin (docs/databases.md).",
                    id="ox.W007",
                )
            )
    return messages


@checks.register(checks.Tags.security)
def check_metrics_token(app_configs: Any = None, **kwargs: Any) -> Messages:
    token = getattr(settings, "OX_METRICS_TOKEN", "") or os.environ.get("OX_METRICS_TOKEN", "")
    if token and len(token) < MIN_TOKEN_LENGTH:
        return [
            checks.Warning(
                f"OX_METRICS_TOKEN has {len(token)} characters: short enough to guess.",
                hint=f"Use at least {MIN_TOKEN_LENGTH}: python -c 'import secrets; print(secrets.token_urlsafe())'",
                id="ox.W004",
            )
        ]
    return []
