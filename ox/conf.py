"""Typed view of a backend's TASKS[alias]["OPTIONS"], with defaults and validation."""

from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from ox.flow.limits import QueueLimits

PRUNABLE = ("SUCCESSFUL", "FAILED", "CANCELLED")  # ox.models.FINISHED, without importing models
# What PRUNE lays its own values over: finished tasks kept this long after they finished (a
# failure longer, to be looked into), as every queue teams compare ox with does by default.
DEFAULT_PRUNE = {"SUCCESSFUL": "7d", "CANCELLED": "7d", "FAILED": "30d"}
# The longest retention (or ARCHIVE_AFTER): "now minus it" must be a date every database holds
# (MariaDB's DATETIME starts at year 1000); longer is None, kept for ever.
MAX_RETENTION = timedelta(days=36525)
# What sits between the worker and PostgreSQL. None: nothing (or a session-mode pooler, which
# pins a server session to the client for its life, so it is the same as none); "session"
# says so explicitly. "transaction": a server session is only the worker's for one
# transaction (PgBouncer pool_mode = transaction), so nothing may outlive a transaction.
POOLERS = (None, "session", "transaction")


@dataclass(frozen=True)
class OxOptions:
    database: str | None = None  # alias; None = whatever the router gives ox.Task
    max_attempts: int = 3
    backoff_base: float = 2.0  # seconds before the 2nd attempt; doubles each attempt
    backoff_max: float = 3600.0
    timeout: float | None = None  # seconds per attempt; None = no limit
    queue_timeouts: dict[str, float] = field(default_factory=dict)
    lease: float = 30.0  # a RUNNING task's lease; renewed every `heartbeat` seconds
    heartbeat: float = 3.0
    rescue_interval: float = 1.0
    # PostgreSQL: a worker whose liveness lock is free this long is dead (a live one that
    # reconnects within it keeps its tasks); also how long a reconnected rescuer waits
    # before judging anyone, so workers back from the same outage can renew first.
    liveness_grace: float = 1.0
    # A task lost with its worker this often is FAILED (it may be what kills them); losses of
    # claims that never started are not counted after the first attempt (ox.start_marks).
    max_lost: int = 5
    poll_interval: float = 1.0
    shutdown_grace: float = 30.0
    interrupt_grace: float = 10.0  # how long a timed-out thread may ignore its interrupt
    prefetch: int = 100  # at most this many tasks claimed beyond the free slots...
    prefetch_window: float | None = 0.05  # ...about this many seconds of work (None: always PREFETCH)
    completion_batch: int = 500
    completion_flush_ms: float = 5.0
    notify: bool = True  # PostgreSQL: NOTIFY idle workers at enqueue commit
    pooler: str | None = None  # one of POOLERS
    # A DATABASES alias reaching the same database directly (not through a transaction pooler),
    # for the LISTEN session only. None: LISTEN on the worker's database unless it is pooled.
    listen_database: str | None = None
    # Operations (ox.periodic, ox.prune, ox.health), validated by validate_operations().
    schedules: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> ox.schedules spec
    # finished status -> retention ("7d", seconds, or None: kept), laid over DEFAULT_PRUNE;
    # None: nothing is pruned.
    prune: dict[str, Any] | None = field(default_factory=dict)
    # Rows of ox_worker: a stopped worker's this long after it stopped, a vanished one's (never
    # stopped: SIGKILLed, its host gone) this long after its last heartbeat; None: kept.
    prune_workers: Any = "7d"
    prune_interval: float = 600.0  # seconds between a worker's pruning rounds
    prune_batch: int = 1000  # rows deleted per transaction
    # ox.archive: finished tasks move to ox_task_archive this long after they finished (a
    # duration: "5m", seconds; None: never, they stay in ox_task until pruned)...
    archive_after: Any = "5m"
    archive_batch: int = 5000  # ...this many rows per transaction
    # PostgreSQL: the vacuum duty (ox.vacuum), a thread of each worker on its own session.
    vacuum: bool = True
    vacuum_interval: float = 10.0  # seconds between looks at the tables' dead tuple counts
    vacuum_min_dead: int = 10000  # a table is vacuumed from this many dead tuples (and 5% of its live ones)
    # ox.flow: per-queue concurrency and rate limits, {"sms": {"concurrency": 4, "rate": "50/s",
    # "key_concurrency": 1, "key_rate": "10/s"}} (ox.flow.limits); the dashboard overrides them.
    limits: dict[str, Any] = field(default_factory=dict)
    worker_stale_after: float = 60.0  # a running worker silent this long is stale
    health_max_backlog: int = 10000  # due READY tasks
    health_max_ready_age: float = 300.0  # seconds the oldest due READY task has waited
    health_max_stale_workers: int = 0
    health_min_workers: int = 0  # alive workers required
    health_max_xact_age: float = 3600.0  # PostgreSQL: oldest open transaction holding back VACUUM

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "OxOptions":
        known = {f.name.upper(): f.name for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ImproperlyConfigured(f"Unknown ox OPTIONS: {', '.join(unknown)}")
        opts = cls(**{known[k]: v for k, v in raw.items()})
        opts.validate()
        return opts

    def validate(self) -> None:
        def positive(name: str, value: Any, allow_zero: bool = False) -> None:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or value < 0 or (value == 0 and not allow_zero):
                raise ImproperlyConfigured(f"ox OPTIONS {name.upper()} must be a positive number, got {value!r}")

        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ImproperlyConfigured(f"ox OPTIONS MAX_ATTEMPTS must be an integer >= 1, got {self.max_attempts!r}")
        for name in ("backoff_max", "lease", "heartbeat", "rescue_interval", "poll_interval", "liveness_grace"):
            positive(name, getattr(self, name))
        for name in ("backoff_base", "shutdown_grace", "interrupt_grace", "completion_flush_ms"):
            positive(name, getattr(self, name), allow_zero=True)
        if self.timeout is not None:
            positive("timeout", self.timeout)
        for queue, seconds in self.queue_timeouts.items():
            positive(f"queue_timeouts[{queue}]", seconds)
        if self.heartbeat >= self.lease:
            raise ImproperlyConfigured("ox OPTIONS HEARTBEAT must be shorter than LEASE")
        if not isinstance(self.max_lost, int) or self.max_lost < 1:
            raise ImproperlyConfigured(f"ox OPTIONS MAX_LOST must be an integer >= 1, got {self.max_lost!r}")
        if self.prefetch_window is not None:
            positive("prefetch_window", self.prefetch_window)
        if not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise ImproperlyConfigured(f"ox OPTIONS PREFETCH must be an integer >= 0, got {self.prefetch!r}")
        if not isinstance(self.completion_batch, int) or self.completion_batch < 1:
            raise ImproperlyConfigured("ox OPTIONS COMPLETION_BATCH must be an integer >= 1")
        self.validate_pooling()
        self.validate_operations()

    def validate_pooling(self) -> None:
        if self.pooler not in POOLERS:
            allowed = ", ".join(repr(p) for p in POOLERS)
            raise ImproperlyConfigured(f"ox OPTIONS POOLER must be one of {allowed}, got {self.pooler!r}")
        if self.listen_database is not None:
            if not isinstance(self.listen_database, str) or not self.listen_database:
                raise ImproperlyConfigured(
                    f"ox OPTIONS LISTEN_DATABASE must be a DATABASES alias, got {self.listen_database!r}"
                )
            if not self.notify:
                # A listener nobody would use: say so rather than open a session for nothing.
                raise ImproperlyConfigured("ox OPTIONS LISTEN_DATABASE is set but NOTIFY is off: drop one of them")
            if self.pooled and self.listen_database == self.database:
                raise ImproperlyConfigured(
                    "ox OPTIONS LISTEN_DATABASE is DATABASE, which POOLER says is behind a transaction pooler:"
                    " LISTEN needs a direct (or session-pooled) alias"
                )

    @property
    def pooled(self) -> bool:
        """Behind a transaction-mode pooler: the worker keeps no session state (no liveness
        lock, no server-side settings, no LISTEN on that database)."""
        return self.pooler == "transaction"

    def listen_alias(self, database: str) -> str | None:
        """The alias a worker LISTENs on, given its own database alias; None: poll only."""
        if not self.notify:
            return None
        if self.listen_database is not None:
            return self.listen_database
        return None if self.pooled else database

    def validate_operations(self) -> None:
        from ox.durations import parse_duration
        from ox.schedules import parse_schedules

        def count(name: str, minimum: int) -> None:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ImproperlyConfigured(f"ox OPTIONS {name.upper()} must be an integer >= {minimum}, got {value!r}")

        if not isinstance(self.vacuum, bool):
            raise ImproperlyConfigured(f"ox OPTIONS VACUUM must be True or False, got {self.vacuum!r}")
        count("vacuum_min_dead", 0)
        for name in (
            "prune_interval",
            "vacuum_interval",
            "worker_stale_after",
            "health_max_ready_age",
            "health_max_xact_age",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ImproperlyConfigured(f"ox OPTIONS {name.upper()} must be a positive number, got {value!r}")
        count("prune_batch", 1)
        count("archive_batch", 1)

        def retention(where: str, value: Any, none: str) -> timedelta:
            try:
                age = parse_duration(value)
            except (ValueError, OverflowError) as exc:  # OverflowError: inf, or past timedelta's range
                raise ImproperlyConfigured(f"ox OPTIONS {where}: {exc} (or None: {none})") from exc
            if age > MAX_RETENTION:
                raise ImproperlyConfigured(
                    f"ox OPTIONS {where}: {value!r} is longer than a century (36525d), the most a date"
                    f" cutoff holds: None for {none}"
                )
            return age

        if self.archive_after is not None:
            retention("ARCHIVE_AFTER", self.archive_after, "no archiving")
        count("health_max_backlog", 0)
        count("health_max_stale_workers", 0)
        count("health_min_workers", 0)
        if self.prune is not None and not isinstance(self.prune, dict):
            raise ImproperlyConfigured(
                f"ox OPTIONS PRUNE must be a dict of status -> retention (or None: prune nothing), got {self.prune!r}"
            )
        for status, age in (self.prune or {}).items():
            if status not in PRUNABLE:
                raise ImproperlyConfigured(
                    f"ox OPTIONS PRUNE: {status!r} is not a finished status ({', '.join(PRUNABLE)})"
                )
            if age is not None:  # None: kept
                retention(f"PRUNE[{status!r}]", age, "kept")
        if self.prune_workers is not None:
            workers = retention("PRUNE_WORKERS", self.prune_workers, "kept")
            if workers.total_seconds() < self.worker_stale_after:
                # A live worker's row is silent up to a heartbeat (or a slow one) between beats:
                # only a worker silent past WORKER_STALE_AFTER is taken for gone.
                raise ImproperlyConfigured(
                    f"ox OPTIONS PRUNE_WORKERS {self.prune_workers!r} is shorter than WORKER_STALE_AFTER"
                    f" ({self.worker_stale_after} s): live workers' rows would be pruned"
                )
        self.queue_limits()
        # Last: a ScheduleError carries its own check id (ox.E002/ox.E003).
        parse_schedules(self.schedules)

    def queue_limits(self) -> "dict[str, QueueLimits]":
        """LIMITS parsed: queue -> its limits (ImproperlyConfigured for a bad value)."""
        from ox.flow.limits import parse_limits

        if not isinstance(self.limits, dict):
            raise ImproperlyConfigured(f"ox OPTIONS LIMITS must be a dict of queue -> limits, got {self.limits!r}")
        out = {}
        for queue, raw in self.limits.items():
            if not isinstance(queue, str) or not queue or len(queue) > 64:
                raise ImproperlyConfigured(f"ox OPTIONS LIMITS: {queue!r} is not a queue name")
            try:
                out[queue] = parse_limits(raw, where=f"LIMITS[{queue!r}]")
            except ValueError as exc:
                raise ImproperlyConfigured(f"ox OPTIONS {exc}") from None
        return out

    def prune_rules(self) -> dict[str, timedelta]:
        """The retention in force: status -> age (DEFAULT_PRUNE with PRUNE laid over it; a
        status whose retention is None is not there)."""
        from ox.durations import parse_duration

        if self.prune is None:
            return {}
        merged = {**DEFAULT_PRUNE, **self.prune}
        return {status: parse_duration(r) for status in PRUNABLE if (r := merged.get(status)) is not None}

    def worker_retention(self) -> timedelta | None:
        from ox.durations import parse_duration

        return None if self.prune_workers is None else parse_duration(self.prune_workers)

    def archive_age(self) -> timedelta | None:
        """How long after finishing a task moves to the archive; None: archiving is off."""
        from ox.durations import parse_duration

        return None if self.archive_after is None else parse_duration(self.archive_after)

    def timeout_for(self, queue: str, task_timeout: float | None) -> float | None:
        if task_timeout is not None:
            return task_timeout
        return self.queue_timeouts.get(queue, self.timeout)
