"""Apply, undo and inspect statepact's Alembic revisions from Python.

The revisions live once, in the repository's top-level ``alembic/`` with
``alembic.ini``; the wheel ships both as ``statepact/_migrations/``. This
module finds whichever copy is there (installed wheel first, then the source
checkout) so ``statepact db upgrade`` and :func:`upgrade` work from an
installed package too.

Every function takes an ``AsyncEngine``, an ``AsyncConnection`` or a URL
(``postgresql://`` is run through asyncpg). An engine or URL gets its own
connection and transaction, committed when the command succeeds; an
``AsyncConnection`` is used as it is and the caller commits. The connection is
handed to ``alembic/env.py`` through ``config.attributes["connection"]``
(Alembic's "sharing a connection" recipe), so the commands run in this
process's event loop rather than starting another. ``PostgresBackend.connect``
calls :func:`upgrade` when its tables are missing.

Errors are public ones: an unreachable server is
``StatePersistenceError(reason="unavailable")``, a role that may not create
tables is ``PreflightError``, an unknown revision (a database migrated by a
newer release) or a failed revision is ``SchemaVersionError``. Revisions run
in one transaction: a failure applies nothing.

This module must never print or log a URL with its password, and never
reconfigure the application's logging.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import pool
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from statepact.errors import (
    PoolExhaustedError,
    PreflightError,
    SchemaVersionError,
    StatepactError,
    StatePersistenceError,
)
from statepact.storage.postgres._client import is_connection_error, is_pool_exhausted, sqlstate_of

__all__ = [
    "VERSION_TABLE",
    "alembic_config",
    "check",
    "current",
    "downgrade",
    "head",
    "migrations_dir",
    "upgrade",
]

T = TypeVar("T")
VERSION_TABLE = "statepact_alembic_version"

EngineOrUrl = AsyncEngine | AsyncConnection | str


def migrations_dir() -> Path:
    """The directory holding ``alembic.ini`` and ``alembic/``: the wheel's copy, else the repo's."""
    packaged = resources.files("statepact") / "_migrations"
    if packaged.is_dir() and (packaged / "alembic.ini").is_file():
        return Path(str(packaged))
    # A source or editable checkout: src/statepact/storage/postgres/migrate.py -> repo root.
    root = Path(__file__).resolve().parents[4]
    if (root / "alembic.ini").is_file() and (root / "alembic" / "env.py").is_file():
        return root
    raise FileNotFoundError(
        "statepact's Alembic revisions were not found: neither statepact/_migrations "
        "(installed wheel) nor alembic/ beside the source tree"
    )


def alembic_config(connection: Connection | None = None) -> Any:
    """An Alembic ``Config`` for statepact's revisions, optionally handed ``connection``."""
    from alembic.config import Config

    where = migrations_dir()
    config = Config(str(where / "alembic.ini"))
    config.set_main_option("script_location", str(where / "alembic"))
    config.attributes["configure_logger"] = False
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _async_url(url: str) -> Any:
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    return parsed


@asynccontextmanager
async def _connection(target: EngineOrUrl) -> Any:
    if isinstance(target, AsyncConnection):
        yield target
        return
    engine = (
        target
        if isinstance(target, AsyncEngine)
        else create_async_engine(_async_url(target), poolclass=pool.NullPool)
    )
    try:
        async with engine.connect() as conn:
            yield conn
            if conn.in_transaction():
                await conn.commit()
    finally:
        if not isinstance(target, AsyncEngine):
            await engine.dispose()


# Alembic keeps its running environment in module globals (``alembic.context``),
# so two commands interleaving on one event loop would run on each other's
# connection: run them one at a time per loop. Across processes the advisory
# lock in env.py serialises them.
_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def _loop_lock() -> asyncio.Lock:
    loop = asyncio.get_running_loop()
    lock = _LOCKS.get(loop)
    if lock is None:
        lock = _LOCKS[loop] = asyncio.Lock()
    return lock


async def _run(target: EngineOrUrl, command: Callable[[Connection], T]) -> T:
    try:
        async with _loop_lock(), _connection(target) as conn:
            result: T = await conn.run_sync(command)
            return result
    except StatepactError:
        raise
    except Exception as exc:
        public = _translate(exc)
        if public is None:
            raise
        raise public from exc


def _translate(exc: BaseException) -> StatepactError | None:
    """Migration failures as public errors; the message names no URL and no password."""
    from alembic.util import CommandError

    if isinstance(exc, CommandError):
        # e.g. the database is at a revision this release does not ship (a newer one).
        return SchemaVersionError(f"statepact migrations: {exc}")
    state = sqlstate_of(exc)
    if is_pool_exhausted(exc):
        return PoolExhaustedError("statepact migrations: no pooled connection was free")
    if is_connection_error(exc):
        return StatePersistenceError(
            f"statepact migrations: the server is unreachable ({type(exc).__name__})",
            reason="unavailable",
        )
    if state == "42501":
        return PreflightError(
            [
                "the role may not create or alter statepact's tables (SQLSTATE 42501, "
                "permission denied); run the migrations as the schema's owner"
            ],
            server="PostgreSQL",
        )
    if isinstance(exc, SQLAlchemyError) or state is not None:
        return SchemaVersionError(
            f"statepact migrations failed ({type(exc).__name__}"
            f"{', SQLSTATE ' + state if state else ''}); nothing was applied"
        )
    return None


async def upgrade(target: EngineOrUrl, revision: str = "head") -> None:
    """Apply the revisions up to ``revision`` (``"head"``: all of them)."""
    from alembic import command

    def run(connection: Connection) -> None:
        command.upgrade(alembic_config(connection), revision)

    await _run(target, run)


async def downgrade(target: EngineOrUrl, revision: str = "base") -> None:
    """Undo the revisions down to ``revision`` (``"base"``: drop every statepact table)."""
    from alembic import command

    def run(connection: Connection) -> None:
        command.downgrade(alembic_config(connection), revision)

    await _run(target, run)


async def current(target: EngineOrUrl) -> str | None:
    """The revision the database is at, or ``None`` when no revision was applied."""
    from alembic.migration import MigrationContext

    def run(connection: Connection) -> str | None:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()

    return await _run(target, run)


def head() -> str:
    """The newest revision shipped with this release."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    found = script.get_current_head()
    if found is None:
        raise RuntimeError("statepact's Alembic revisions have no head")
    return found


async def check(target: EngineOrUrl) -> list[str]:
    """Everything that keeps the database from matching this release, one line each.

    Empty when the database is at the head revision and its tables match the
    metadata (Alembic's autogenerate comparison, storage options, sequences).
    """
    from statepact.storage.postgres.verify import schema_differences

    at = await current(target)
    wanted = head()
    problems = [] if at == wanted else [f"revision is {at or 'none'}, head is {wanted}"]
    async with _connection(target) as conn:
        problems.extend(await schema_differences(conn))
    return problems


def revisions() -> Iterator[str]:
    """Every revision shipped, oldest first."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    yield from reversed([rev.revision for rev in script.walk_revisions()])
