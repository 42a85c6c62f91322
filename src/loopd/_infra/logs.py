"""How a loopd process logs: one handler on the root logger, text or JSON lines, on stderr.

Owns: `configure_logging` (called once by the process's entry point: the CLI, from ``--log-level`` /
``LOOPD_LOG_LEVEL`` and ``--log-format`` / ``LOOPD_LOG_FORMAT``), the JSON line format, and `is_configured`, which
the HTTP runner reads to leave uvicorn's loggers to this configuration. Modules only ever do
``logging.getLogger(__name__)``; a library user who configures logging themselves never calls this.

Formats: ``text`` is ``<time> <LEVEL> <logger>: <message>`` (and the traceback, if any); ``json`` is one object per
line, ``{"time", "level", "logger", "message"}`` plus ``"exc_info"`` (the formatted traceback) when there is one,
and ``"stack_info"`` when asked for. Uvicorn's loggers (``uvicorn``, ``uvicorn.error``, ``uvicorn.access``)
lose their own handlers and propagate here, so a server's lines share the level and the format.
Must not do: import anything of loopd but the floor, or choose levels for a layer.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Final, Literal, TextIO

from loopd._infra.errors import LoopdError

__all__ = [
    "FORMATS",
    "LEVELS",
    "JsonFormatter",
    "LogFormat",
    "LogSettingsError",
    "configure_logging",
    "is_configured",
    "parse_level",
    "reset_logging",
]

LogFormat = Literal["text", "json"]
LEVELS: Final = ("debug", "info", "warning", "error", "critical")
FORMATS: Final[tuple[LogFormat, ...]] = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
UVICORN_LOGGERS: Final = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")

_log = logging.getLogger(__name__)


class LogSettingsError(LoopdError, ValueError):
    """A log level or format that does not exist."""


def parse_level(text: str) -> int:
    """The ``logging`` level named by ``text`` (any case); `LogSettingsError` for anything else."""
    name = text.strip().lower()
    if name not in LEVELS:
        raise LogSettingsError(f"unknown log level {text!r} (use one of: {', '.join(LEVELS)})")
    return int(logging.getLevelNamesMapping()[name.upper()])


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: time (UTC, ISO 8601 with milliseconds), level, logger, message."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False)


class _LoopdHandler(logging.StreamHandler[TextIO]):
    """The handler `configure_logging` installs (so a second call replaces it instead of adding another).

    Without a stream of its own it writes to whatever ``sys.stderr`` is at the time of each record (like
    ``logging.lastResort``), so a replaced or captured stderr never leaves it writing to a closed file.
    """

    def __init__(self, stream: TextIO | None) -> None:
        super().__init__(stream)
        self._fixed = stream

    @property
    def stream(self) -> TextIO:
        return self._fixed if self._fixed is not None else sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        self._fixed = value


def configure_logging(level: str = "warning", fmt: str = "text", *, stream: TextIO | None = None) -> None:
    """Log records at ``level`` and above to ``stream`` (default: stderr) in ``fmt``; replaces an earlier call's.

    Raises `LogSettingsError` for an unknown level or format, before changing anything.
    """
    number = parse_level(level)
    if fmt not in FORMATS:
        raise LogSettingsError(f"unknown log format {fmt!r} (use one of: {', '.join(FORMATS)})")
    handler = _LoopdHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    reset_logging()
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(number)
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
    _log.debug("logging at %s as %s", logging.getLevelName(number).lower(), fmt)


def reset_logging() -> None:
    """Undo `configure_logging`: its handler goes, the root logger is back at ``warning`` (for tests)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _LoopdHandler)]:
        root.removeHandler(old)
        old.close()
    root.setLevel(logging.WARNING)


def is_configured() -> bool:
    """Whether `configure_logging` has set up this process (then servers leave uvicorn's loggers alone)."""
    return any(isinstance(h, _LoopdHandler) for h in logging.getLogger().handlers)
