"""Typed view of a backend's TASKS[alias]["OPTIONS"], with defaults and validation."""

from dataclasses import dataclass, field, fields
from typing import Any

from django.core.exceptions import ImproperlyConfigured


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
    rescue_interval: float = 2.0
    poll_interval: float = 1.0
    shutdown_grace: float = 30.0
    interrupt_grace: float = 10.0  # how long a timed-out thread may ignore its interrupt
    prefetch: int = 0  # tasks claimed beyond free slots (only worth it for short tasks)
    completion_batch: int = 100
    completion_flush_ms: float = 5.0
    notify: bool = True  # PostgreSQL: NOTIFY idle workers at enqueue commit

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
        for name in ("backoff_max", "lease", "heartbeat", "rescue_interval", "poll_interval"):
            positive(name, getattr(self, name))
        for name in ("backoff_base", "shutdown_grace", "interrupt_grace", "completion_flush_ms"):
            positive(name, getattr(self, name), allow_zero=True)
        if self.timeout is not None:
            positive("timeout", self.timeout)
        for queue, seconds in self.queue_timeouts.items():
            positive(f"queue_timeouts[{queue}]", seconds)
        if self.heartbeat >= self.lease:
            raise ImproperlyConfigured("ox OPTIONS HEARTBEAT must be shorter than LEASE")
        if not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise ImproperlyConfigured(f"ox OPTIONS PREFETCH must be an integer >= 0, got {self.prefetch!r}")
        if not isinstance(self.completion_batch, int) or self.completion_batch < 1:
            raise ImproperlyConfigured("ox OPTIONS COMPLETION_BATCH must be an integer >= 1")

    def timeout_for(self, queue: str, task_timeout: float | None) -> float | None:
        if task_timeout is not None:
            return task_timeout
        return self.queue_timeouts.get(queue, self.timeout)
