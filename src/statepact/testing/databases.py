"""Per-test PostgreSQL databases: a template migrated once per session, cloned for each test.

What the plugin's ``statepact_postgres_template`` and ``statepact_postgres_database``
fixtures run (see ``docs/testing.md``, "Testing your application"), usable on
their own in a script or a fixture of yours:

- :func:`create_database` makes a database (a clone with ``template=``) and
  sets ``statement_timeout`` on it, so ``open()`` and the preflight accept it;
  PostgreSQL does not copy a database's settings into a clone, so every clone
  gets its own ``ALTER DATABASE ... SET``;
- :func:`build_template` creates the template and runs statepact's migrations on it;
- :func:`connections_to` counts who is still connected (a template with
  sessions on it cannot be cloned);
- :func:`drop_database` drops one ``WITH (FORCE)`` (PostgreSQL 13 and later).

Names come from :func:`unique_database_name`: ``statepact_<kind>_<pid>_<random>``,
so sessions running at the same time on one server (other developers, xdist
workers) never pick the same one, and only databases named here are dropped.

This module imports SQLAlchemy; the plugin imports it only when a test asks for
a database. It must never print a URL with its password.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlalchemy import pool, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

__all__ = [
    "STATEMENT_TIMEOUT",
    "admin_execute",
    "build_template",
    "connections_to",
    "create_database",
    "database_url",
    "drop_database",
    "run_in_thread",
    "unique_database_name",
]

T = TypeVar("T")

#: What every database made here gets as its ``statement_timeout`` (``verify()`` refuses 0).
STATEMENT_TIMEOUT = "30s"


def unique_database_name(kind: str) -> str:
    """``statepact_<kind>_<pid>_<random>``: unique per process and call, under 63 bytes."""
    if not kind.isidentifier() or len(kind) > 20:
        raise ValueError(f"kind: {kind!r} must be a short identifier")
    return f"statepact_{kind}_{os.getpid()}_{uuid.uuid4().hex[:10]}"


def database_url(server_url: str, database: str) -> str:
    """The server's URL pointed at ``database`` (password kept: it is only used to connect)."""
    return make_url(server_url).set(database=database).render_as_string(hide_password=False)


def run_in_thread(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a loop of its own in a worker thread, away from any running loop.

    Lets a synchronous fixture create and drop databases whether or not the
    test's own event loop (pytest-asyncio's) is running.
    """

    async def main() -> T:
        return await factory()

    with ThreadPoolExecutor(max_workers=1) as executor:
        return executor.submit(asyncio.run, main()).result()


def _quoted(name: str) -> str:
    if not name or '"' in name or "\x00" in name:
        raise ValueError(f"database name: {name!r} cannot be quoted as an identifier")
    return f'"{name}"'


async def admin_execute(server_url: str, *statements: str) -> None:
    """Run statements that cannot run in a transaction (CREATE/DROP DATABASE) on the server."""
    engine = create_async_engine(server_url, poolclass=pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            for statement in statements:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


async def create_database(
    server_url: str,
    name: str,
    *,
    template: str | None = None,
    statement_timeout: str | None = STATEMENT_TIMEOUT,
) -> str:
    """Create ``name`` (a clone of ``template`` if given) and return its URL.

    ``statement_timeout`` is set on the database (``None`` leaves the server's
    default, 0, which ``open()`` refuses).
    """
    clause = f" TEMPLATE {_quoted(template)}" if template else ""
    statements = [f"CREATE DATABASE {_quoted(name)}{clause}"]
    if statement_timeout is not None:
        statements.append(
            f"ALTER DATABASE {_quoted(name)} SET statement_timeout = '{statement_timeout}'"
        )
    await admin_execute(server_url, *statements)
    return database_url(server_url, name)


async def drop_database(server_url: str, name: str) -> None:
    """Drop ``name`` if it exists, ending the sessions still on it (``WITH (FORCE)``)."""
    await admin_execute(server_url, f"DROP DATABASE IF EXISTS {_quoted(name)} WITH (FORCE)")


async def connections_to(server_url: str, name: str, *, wait: float = 0.0) -> int:
    """How many sessions other than this one are connected to database ``name``.

    With ``wait`` (seconds), polls until there are none or the time is up: a
    session a client just closed takes a moment to leave ``pg_stat_activity``.
    """
    engine = create_async_engine(server_url, poolclass=pool.NullPool)
    deadline = asyncio.get_running_loop().time() + wait
    try:
        async with engine.connect() as conn:
            while True:
                count = int(
                    await conn.scalar(
                        text(
                            "SELECT count(*) FROM pg_stat_activity "
                            "WHERE datname = :name AND pid <> pg_backend_pid()"
                        ),
                        {"name": name},
                    )
                    or 0
                )
                await conn.rollback()  # a fresh snapshot of pg_stat_activity next time
                if count == 0 or asyncio.get_running_loop().time() >= deadline:
                    return count
                await asyncio.sleep(0.05)
    finally:
        await engine.dispose()


async def build_template(server_url: str, name: str) -> str:
    """Create database ``name`` with statepact's tables at the head revision; return its URL.

    Dropped again if the migrations fail, so a failed build leaves nothing behind.
    """
    from statepact._cancel import finish
    from statepact.storage.postgres import migrate

    url = await create_database(server_url, name)
    try:
        await migrate.upgrade(url)
    except BaseException:
        await finish(drop_database(server_url, name))
        raise
    return url
