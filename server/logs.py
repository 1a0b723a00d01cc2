"""Logs: one JSON object per line, with the event's fields at the top level, for collectors; or human-readable
lines for a person at a terminal (the default there)."""

from __future__ import annotations

import json
import logging
import sys
import time

from attnserve.progress import line_fields, progress_log


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
            **(getattr(record, "fields", None) or _progress_fields(record.name, message)),
        }
        if record.exc_info:
            line["error"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def _progress_fields(logger: str, message: str) -> dict[str, object]:
    """A progress line's data (an export's stages, a calibration's steps: attnserve/progress.py), read from its
    text: they come as text, an export's from the child process that runs it."""
    if logger != progress_log.name and not logger.startswith(progress_log.name + "."):
        return {}
    return {"event": "progress", **line_fields(message)}


class TextFormatter(logging.Formatter):
    """The message, then the event's plain fields as key=value; its name (the message says it) and its nested
    fields (lists, mappings: for JSON's readers) are left out."""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, "fields", {}).items()
                          if k != "event" and not isinstance(v, dict | list | tuple))
        return super().format(record) + (" " + fields if fields else "")


def resolve_format(fmt: str, stream=None) -> str:
    """json or text; auto: text when the stream (stderr) is a terminal, JSON otherwise."""
    if fmt != "auto":
        return fmt
    stream = stream or sys.stderr
    return "text" if hasattr(stream, "isatty") and stream.isatty() else "json"


def configure(level: str, fmt: str) -> None:
    """Replace the CLI's default handler; extra={"fields": {...}} carries an event's data.

    level applies to attnserve's own loggers; libraries (grpc, asyncio) log warnings and errors only.
    fmt: json, text or auto (resolve_format).
    """
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if resolve_format(fmt, handler.stream) == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("attnserve").setLevel(level)
    # A library's warnings.warn in the log's format too (logger py.warnings): Python writes them as bare lines.
    logging.captureWarnings(True)


class Throttle:
    """At most `limit` lines in any `period` seconds for one kind of event, so that clients who can cause it at
    will cannot fill the disk; allow() says whether this one is written and how many were held back before it."""

    def __init__(self, limit: int = 10, period: float = 60.0, clock=time.monotonic):
        self.limit, self.period, self._clock = limit, period, clock
        self._window_start, self._written, self._held_back = -float("inf"), 0, 0

    def allow(self) -> int | None:
        """None: leave this line out. Else the number of lines left out since the last one written."""
        now = self._clock()
        if now - self._window_start >= self.period:
            self._window_start, self._written = now, 0
        if self._written >= self.limit:
            self._held_back += 1
            return None
        self._written += 1
        held_back, self._held_back = self._held_back, 0
        return held_back
