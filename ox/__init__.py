"""ox: a durable task queue for Django's Tasks API, kept in the database the app already runs."""

from typing import Any

__all__ = ["DuplicateTask", "Unique", "cancel", "enqueue_many", "is_duplicate", "retry"]


def __getattr__(name: str) -> Any:
    # The public operations live in modules that import models; load them lazily so that
    # `import ox` works before the app registry is ready (settings, AppConfig).
    if name in {"cancel", "retry"}:
        from ox import operations

        return getattr(operations, name)
    if name in {"Unique", "DuplicateTask", "is_duplicate"}:
        from ox.flow import unique

        return getattr(unique, name)
    if name == "enqueue_many":
        from ox.enqueue import enqueue_many

        return enqueue_many
    raise AttributeError(name)
