"""JSON log lines for a log collector: one object per line, with ox's structured fields."""

import json
import logging
from datetime import UTC, datetime
from typing import Any

EXTRA_PREFIX = "ox_"  # ox loggers pass their fields as extra={"ox_task_id": ...}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for key, value in record.__dict__.items():
            if key.startswith(EXTRA_PREFIX):
                entry[key[len(EXTRA_PREFIX) :]] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)
