"""ox: a durable task queue for Django's Tasks API, kept in the database the app already runs."""

from typing import Any

__version__ = "0.4.0"  # ox/CHANGELOG.md says what each version changed

__all__ = [
    "DuplicateTask",
    "Unique",
    "astep",
    "cancel",
    "chain",
    "enqueue_many",
    "group",
    "is_duplicate",
    "retry",
    "retry_workflow",
    "sig",
    "step",
]


def __getattr__(name: str) -> Any:
    # The public operations live in modules that import models; load them lazily so that
    # `import ox` works before the app registry is ready (settings, AppConfig).
    if name in {"cancel", "retry"}:
        from ox import operations

        return getattr(operations, name)
    if name in {"Unique", "DuplicateTask", "is_duplicate"}:
        from ox.flow import unique

        return getattr(unique, name)
    if name in {"step", "astep"}:
        from ox import steps

        return getattr(steps, name)
    if name in {"chain", "group", "sig"}:
        from ox.workflow import canvas

        return getattr(canvas, name)
    if name == "retry_workflow":
        from ox.workflow.retry import retry_failed_part

        return retry_failed_part
    if name == "enqueue_many":
        from ox.enqueue import enqueue_many

        return enqueue_many
    raise AttributeError(name)
