"""OxTask: Django's Task with ox's per-task policy (Django 6.1 forwards @task kwargs here)."""

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from django.tasks import Task

from ox.flow.unique import KeyPlan, Unique, as_by, as_unique, check_limit_key
from ox.metadata import checked

# (exception, task_result) -> seconds | timedelta | None (None: give up, no more attempts)
Backoff = Callable[[BaseException, Any], float | int | timedelta | None]

_UNSET: Any = object()


@dataclass(frozen=True, slots=True, kw_only=True)
class OxTask(Task):
    max_attempts: int | None = None
    backoff: Backoff | None = None
    timeout: float | None = None
    # Flow control (ox.flow): uniqueness (True, a dict or ox.Unique), the arguments a task's
    # limit key comes from (a name or position, or a list of them), or the key itself.
    unique: Unique | None = None
    limit_by: tuple[str | int, ...] | None = None
    limit_key: str | None = None
    # How this task's unique key is made, worked out once (ox.flow.unique.KeyPlan): per call
    # it would cost more than the index it feeds.
    unique_plan: KeyPlan | None = field(default=None, init=False, repr=False, compare=False)
    # Metadata the next enqueue stores with the task (ox.metadata; using(metadata=...)).
    metadata: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "unique", as_unique(self.unique))
        object.__setattr__(self, "unique_plan", None if self.unique is None else KeyPlan(self.unique, self))
        object.__setattr__(self, "limit_by", as_by(self.limit_by, "limit_by="))
        if self.limit_key is not None:
            check_limit_key(self.limit_key)
        Task.__post_init__(self)

    def s(self, *args: Any, **kwargs: Any) -> Any:
        """This task called with these arguments, later: a step of a chain or a group
        (ox.chain, ox.group)."""
        from ox.workflow.canvas import Sig

        return Sig(self, args, kwargs)

    def using(
        self,
        *,
        unique: Any = _UNSET,
        unique_key: str | None = None,
        limit_key: str | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> "OxTask":
        """Django's using() (priority, queue_name, run_after, backend), and per call:
        unique= (as @task takes it), unique_key= (unique under this key, whatever the
        arguments), limit_key= (the key its queue's per-key limits count it under),
        metadata= (a JSON object stored with the task: ox.metadata)."""
        task = Task.using(self, **kwargs)
        changes: dict[str, Any] = {}
        if unique is not _UNSET:
            changes["unique"] = as_unique(unique)
        if unique_key is not None:
            base = changes.get("unique", self.unique) or Unique()
            changes["unique"] = replace(base, key=unique_key, by=None)
        if limit_key is not None:
            changes["limit_key"] = check_limit_key(limit_key)
        if metadata is not None:
            changes["metadata"] = checked(metadata)
        return replace(task, **changes) if changes else task
