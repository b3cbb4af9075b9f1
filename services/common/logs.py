"""How every Chorus process writes its log: text lines for people, or JSON lines for log
collectors (``CHORUS_LOG_FORMAT=json``; ``chorus up --log-format json`` sets it for every
service it starts).

A JSON line is one object: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, then
the record's extra fields as they were given (the gateway's access line carries ``request_id``
and ``request``), and ``exception`` with the formatted traceback when there is one.

The format is read from the environment rather than a service's settings class: it applies to
every process alike (the simulated engine included) and must be known before anything logs."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# the attributes every LogRecord has; anything else on a record came from ``extra=``
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in line:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def log_format(value: str | None = None) -> str:
    """The log format asked for (``value``, else ``CHORUS_LOG_FORMAT``, else text)."""
    chosen = (value or os.environ.get("CHORUS_LOG_FORMAT") or "text").strip().lower()
    if chosen not in FORMATS:
        raise ValueError(
            f"log format must be one of {', '.join(FORMATS)}, got {chosen!r} (CHORUS_LOG_FORMAT / --log-format)"
        )
    return chosen


def setup_logging(level: str, fmt: str | None = None) -> None:
    """Configure the root logger once per process (a second call changes nothing)."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format(fmt) == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per engine request / health poll
