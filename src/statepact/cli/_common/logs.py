"""The log lines every ``statepact`` command prints: ``--log-level`` and ``--log-format``.

The package keeps its ``NullHandler`` (a library shows nothing unless its
application asks); a command is an application, so it puts one handler on the
root logger for the length of the command: INFO and above to stderr by default,
as text or as one JSON object per line (``time``, ``level``, ``logger``,
``message``, then the record's ``extra`` fields: ``queue``, ``tenant``,
``item_id``, ...; see docs/observability.md). A traceback is printed only at
``--log-level debug``; at the other levels an exception is named on the
record's line. SQLAlchemy's loggers stay at WARNING unless the application set
them, since SQLAlchemy logs every statement at INFO, and so do Alembic's below
``--log-level debug`` (its set-up chatter on every migration call). A command's
own failure (``statepact worker: error: ...``) is one more line in the same
format (:func:`error_line`), so a log shipper reading JSON sees JSON only.

This module must never print a password: every line passes through
``redact_dsn``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TextIO

from statepact.settings import redact_dsn

__all__ = [
    "DEFAULT_LEVEL",
    "FORMATS",
    "LEVELS",
    "JsonFormatter",
    "TextFormatter",
    "add_logging_arguments",
    "command_logging",
    "error_line",
]

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
FORMATS = ("text", "json")
DEFAULT_LEVEL = "info"

# What every LogRecord has; anything else on one came from ``extra``.
_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName"}
)
# Loggers that speak too much at INFO for an operator (SQLAlchemy echoes statements), and
# those quiet too unless at DEBUG.
_QUIET = ("sqlalchemy",)
_QUIET_UNLESS_DEBUG = ("alembic",)
# The format of the command running now (command_logging), for error_line.
_active = {"format": "text"}


def add_logging_arguments(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format``, once per parser.

    They default to ``SUPPRESS``, so a parser and its sub-parsers may each take
    them (``statepact db --log-level debug upgrade`` and ``statepact db upgrade
    --log-level debug`` alike) without a sub-parser's default overwriting what was
    given before it; ``statepact.cli.main`` fills in the defaults.
    """
    if any(action.dest == "log_level" for action in parser._actions):
        return
    parser.add_argument(
        "--log-level",
        choices=tuple(LEVELS),
        default=argparse.SUPPRESS,
        help="the least severe log lines printed on stderr (default: info); debug also "
        "prints tracebacks",
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=argparse.SUPPRESS,
        help="text lines (default) or one JSON object per line, for a log shipper",
    )


def _time(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")


def _exception(record: logging.LogRecord) -> BaseException | None:
    info = record.exc_info
    return info[1] if info and info[1] is not None else None


def _named(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: message``; the traceback only when ``tracebacks``."""

    def __init__(self, *, tracebacks: bool) -> None:
        super().__init__()
        self._tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_time(record)} {record.levelname} {record.name}: {record.getMessage()}"
        exc = _exception(record)
        if exc is not None:
            if self._tracebacks:
                line += "\n" + self.formatException(record.exc_info).rstrip()  # type: ignore[arg-type]
            elif type(exc).__name__ not in line:
                line += f" ({_named(exc)})"
        elif record.stack_info and self._tracebacks:
            line += "\n" + self.formatStack(record.stack_info)
        return redact_dsn(line)


def _plain(value: Any) -> Any:
    """A JSON value for an ``extra`` field: JSON types as they are, anything else its text."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return redact_dsn(value)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return redact_dsn(str(value))


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time``, ``level``, ``logger``, ``message``, the
    record's ``extra`` fields, ``exception`` (its type and message) when it carries
    one, and ``traceback`` only when ``tracebacks``."""

    def __init__(self, *, tracebacks: bool) -> None:
        super().__init__()
        self._tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        shown: dict[str, Any] = {
            "time": _time(record),
            "level": record.levelname,
            "logger": record.name,
            "message": redact_dsn(record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in shown and not key.startswith("_"):
                shown[key] = _plain(value)
        exc = _exception(record)
        if exc is not None:
            shown["exception"] = redact_dsn(_named(exc))
            if self._tracebacks:
                shown["traceback"] = redact_dsn(self.formatException(record.exc_info))  # type: ignore[arg-type]
        return json.dumps(shown, ensure_ascii=False)


@contextmanager
def command_logging(
    level: str = DEFAULT_LEVEL, fmt: str = "text", stream: TextIO | None = None
) -> Iterator[logging.Handler]:
    """Log lines at ``level`` and above to ``stream`` (stderr) in ``fmt`` while the
    command runs; the root logger and the quietened loggers are put back after."""
    if level not in LEVELS:
        raise ValueError(f"--log-level: must be one of {', '.join(LEVELS)}, got {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"--log-format: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    threshold = LEVELS[level]
    tracebacks = threshold <= logging.DEBUG
    handler = logging.StreamHandler(stream or sys.stderr)
    formatter = JsonFormatter if fmt == "json" else TextFormatter
    handler.setFormatter(formatter(tracebacks=tracebacks))
    root = logging.getLogger()
    saved = root.level, _active["format"]
    names = _QUIET if tracebacks else _QUIET + _QUIET_UNLESS_DEBUG
    quiet = [logger for logger in map(logging.getLogger, names) if logger.level == logging.NOTSET]
    root.addHandler(handler)
    root.setLevel(threshold)
    _active["format"] = fmt
    for logger in quiet:
        logger.setLevel(logging.WARNING)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        _active["format"] = saved[1]
        for logger in quiet:
            logger.setLevel(logging.NOTSET)


def error_line(line: str, trace: str | None = None) -> str:
    """A command's failure as the running command prints its log lines: ``trace`` (a
    traceback, at debug) then ``line`` as text, or one JSON object (``level`` ERROR,
    ``logger`` ``statepact.cli``, ``traceback``). ``line`` is the command's own, its
    URLs already redacted (``describe_error``); ``trace`` is redacted here."""
    shown_trace = None if trace is None else redact_dsn(trace).rstrip()
    if _active["format"] != "json":
        return line if shown_trace is None else f"{shown_trace}\n{line}"
    record = logging.LogRecord("statepact.cli", logging.ERROR, "", 0, line, None, None)
    shown = {"time": _time(record), "level": "ERROR", "logger": record.name, "message": line}
    if shown_trace is not None:
        shown["traceback"] = shown_trace
    return json.dumps(shown, ensure_ascii=False)
