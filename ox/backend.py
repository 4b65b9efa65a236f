"""OxBackend: Django's task backend contract, kept in the database."""

import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.tasks import Task as DjangoTask
from django.tasks import TaskResult
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist

from ox.archive import attempts_of, find_row
from ox.conf import OxOptions
from ox.enqueue import aenqueue_one, database_for, enqueue_one
from ox.results import attempts_to_load, build_result
from ox.tasks import OxTask


class OxBackend(BaseTaskBackend):
    task_class = OxTask
    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True
    supports_metadata = True  # Django's proposal (new-features #141): ox.metadata

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # Django's own check_tasks builds every backend before any check runs: raising here
        # would crash `manage.py check` with a traceback instead of ox.E001-E003. The error
        # is kept and raised on first use (a worker, an enqueue), and ox.checks reports it.
        self._config: OxOptions | None = None
        self.config_error: ImproperlyConfigured | None = None
        try:
            self._config = OxOptions.from_dict(self.options)
        except ImproperlyConfigured as exc:
            self.config_error = exc

    @property
    def config(self) -> OxOptions:
        if self._config is None:
            assert self.config_error is not None
            raise ImproperlyConfigured(f"TASKS[{self.alias!r}]: {self.config_error}") from self.config_error
        return self._config

    def validate_task(self, task: DjangoTask) -> None:
        if isinstance(task.run_after, timedelta):
            # Django documents a timedelta run_after but its check expects a datetime; ox
            # resolves the delay at enqueue. replace() re-runs the base checks without it.
            if not self.supports_defer:
                raise InvalidTask("Backend does not support run_after.")
            if task.run_after < timedelta(0):
                raise InvalidTask("run_after must not be a negative timedelta.")
            replace(task, run_after=None)
        else:
            super().validate_task(task)
        self._validate_policy(task)

    @staticmethod
    def _validate_policy(task: DjangoTask) -> None:
        max_attempts = getattr(task, "max_attempts", None)
        if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
            raise InvalidTask(f"max_attempts must be an integer >= 1, got {max_attempts!r}.")
        timeout = getattr(task, "timeout", None)
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise InvalidTask(f"timeout must be a positive number of seconds, got {timeout!r}.")
        backoff = getattr(task, "backoff", None)
        if backoff is not None and not callable(backoff):
            raise InvalidTask("backoff must be a callable (exception, task_result) -> seconds | timedelta | None.")

    def enqueue(self, task: DjangoTask, args: Any, kwargs: Any) -> TaskResult:
        return enqueue_one(self, task, args, kwargs)

    async def aenqueue(self, task: DjangoTask, args: Any, kwargs: Any) -> TaskResult:
        return await aenqueue_one(self, task, args, kwargs)

    def get_result(self, result_id: str) -> TaskResult:
        try:
            pk = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        # ox_task, else the archive (ox.archive): a finished task reads the same from either.
        row = find_row(pk, database_for(self))
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        attempts = attempts_of(row) if attempts_to_load(row) else []
        return build_result(row, attempts, self.alias)

    async def aget_result(self, result_id: str) -> TaskResult:
        return await sync_to_async(self.get_result, thread_sensitive=True)(result_id)
