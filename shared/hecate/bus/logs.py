"""Structured logs: one JSON object per line on stderr, with service and instance."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str, instance: str) -> None:
        super().__init__()
        self.service = service
        self.instance = instance

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "level": record.levelname.lower(),
            "service": self.service,
            "id": self.instance,
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc.update(fields)
        if record.exc_info and record.levelno >= logging.ERROR:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def setup(service: str, instance: str, level: str = "INFO") -> logging.Logger:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service, instance))
    root = logging.getLogger("hecate")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    return logging.getLogger(f"hecate.{service}")


def event(log: logging.Logger, name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``name`` with structured ``fields``."""
    log.log(level, name, extra={"fields": fields})
