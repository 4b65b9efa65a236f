"""Structured log events of the `ox` loggers: the message ends with key=value pairs for
people, and the same fields travel as `extra={"ox_<key>": value}` for log collectors
(the starter project's logging.JsonFormatter reads them)."""

import logging
from typing import Any


def task_fields(claimed: Any) -> dict[str, Any]:
    return {"task_id": claimed.id, "task": claimed.task_path, "queue": claimed.queue, "attempt": claimed.attempts}


def event(logger: logging.Logger, level: int, message: str, *, exc_info: bool = False, **fields: Any) -> None:
    if not logger.isEnabledFor(level):
        return
    text = " ".join([message, *(f"{k}={v}" for k, v in fields.items())])
    try:
        logger.log(level, "%s", text, extra={f"ox_{k}": v for k, v in fields.items()}, exc_info=exc_info)
    except Exception:  # noqa: BLE001, S110  (a task closed stderr, say: the worker carries on unlogged)
        pass
