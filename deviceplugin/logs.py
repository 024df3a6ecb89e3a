"""Structured logging: `log.info("registered", resource="volcano.sh/gpu-memory", took_ms=12)`.

Records go through the standard `logging` module, so handlers and levels work as usual; the
fields travel in `record.fields` and are rendered as `key=value` text or one JSON object per line.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Literal

LogFormat = Literal["text", "json"]


class Log:
    """A logger taking keyword fields."""

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)

    def _log(self, level: int, message: str, fields: dict[str, Any]) -> None:
        if self._logger.isEnabledFor(level):
            self._logger.log(level, message, extra={"fields": fields}, stacklevel=3)

    def debug(self, message: str, **fields: Any) -> None:
        self._log(logging.DEBUG, message, fields)

    def info(self, message: str, **fields: Any) -> None:
        self._log(logging.INFO, message, fields)

    def warning(self, message: str, **fields: Any) -> None:
        self._log(logging.WARNING, message, fields)

    def error(self, message: str, **fields: Any) -> None:
        self._log(logging.ERROR, message, fields)


def get_log(name: str) -> Log:
    return Log(name)


def describe_exception(error: BaseException) -> str:
    """An unexpected exception as one line: its type, where it was raised and its message."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__name__}{where}: {error}"


def _timestamp(record: logging.LogRecord) -> str:
    millis = int(record.msecs)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{millis:03d}Z"


def _text_value(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if not text or any(c in text for c in ' "=\n') else text


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        parts = [_timestamp(record), record.levelname.lower(), record.name, _text_value(record.getMessage())]
        parts += [f"{key}={_text_value(value)}" for key, value in fields.items()]
        if record.exc_info:
            parts.append(_text_value(self.formatException(record.exc_info)))
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(log_format: LogFormat = "text", level: int = logging.INFO) -> None:
    """Send `deviceplugin` logs to stderr in the chosen format (replaces earlier handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger("deviceplugin")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
