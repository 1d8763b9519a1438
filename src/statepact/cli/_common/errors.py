"""A command's failure as one line on stderr: :class:`CommandError` (a failure a person
fixes), :func:`describe_error` (any other, with what to do), and :func:`run_command`,
which runs a command's body on its own event loop and turns what it raised into that
line and exit code 1 (130 for Ctrl-C); the traceback too at ``--log-level debug``.

It must never print a DSN or a password in clear.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, TextIO

from statepact.cli._common.logs import error_line
from statepact.errors import PreflightError, SchemaVersionError, StatepactError
from statepact.settings import redact_dsn

__all__ = ["EXTRAS", "CommandError", "describe_error", "missing_module", "run_command"]


class CommandError(Exception):
    """A failure a person fixes: printed as one line, without a traceback."""


#: The extra that installs each driver a command may import, by top-level module.
EXTRAS = {
    "redis": "redis",
    "sqlalchemy": "postgres",
    "asyncpg": "postgres",
    "alembic": "postgres",
    "psycopg": "postgres-sync",
}


def missing_module(exc: ModuleNotFoundError) -> str | None:
    """What to install for a driver statepact uses that is not installed, or ``None``."""
    module = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return None
    return f"{module} is not installed: pip install 'statepact[{extra}]'"


def describe_error(exc: BaseException) -> str:
    """One line saying what went wrong and what to do, never a DSN or a password."""
    if isinstance(exc, CommandError):
        return str(exc)
    if isinstance(exc, PreflightError):
        return f"{exc} (`statepact doctor` runs every check)"
    if isinstance(exc, SchemaVersionError):
        return str(exc)  # each says what to run (statepact db upgrade, alembic upgrade head)
    if isinstance(exc, StatepactError):
        return f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ModuleNotFoundError):
        install = missing_module(exc)
        if install is not None:
            return install
    if isinstance(exc, OSError | ConnectionError | TimeoutError):
        return f"cannot reach the server: {type(exc).__name__}: {exc}"
    return redact_dsn(
        f"unexpected {type(exc).__name__}: {exc} (run again with --log-level debug for the "
        "traceback)"
    )


def run_command(
    name: str,
    body: Callable[[], Coroutine[Any, Any, int]],
    *,
    debug: bool,
    err: TextIO | None = None,
) -> int:
    """Run ``body`` on a new event loop; an error becomes one line on stderr and exit code 1."""
    stream = err or sys.stderr
    try:
        return asyncio.run(body())
    except KeyboardInterrupt:
        print(error_line(f"statepact {name}: interrupted"), file=stream)
        return 130
    except Exception as exc:
        trace = traceback.format_exc() if debug else None
        print(error_line(f"statepact {name}: error: {describe_error(exc)}", trace), file=stream)
        return 1
