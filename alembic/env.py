"""Alembic environment of statepact's PostgreSQL tables.

Where the connection comes from, in this order (Alembic cookbook, "sharing a
connection", and its async template):

1. ``config.attributes["connection"]``: a (sync facade of a) connection handed
   in by the caller, e.g. ``statepact.storage.postgres.migrate`` running inside
   ``AsyncConnection.run_sync``. If it is already in a transaction, the
   migrations join it and the caller commits.
2. A URL: ``-x url=...``, else ``sqlalchemy.url`` in ``alembic.ini``, else the
   ``STATEPACT_DATABASE_URL`` environment variable. A plain ``postgresql://``
   URL is run through asyncpg.

Every run takes a transaction-scoped advisory lock first (an offline script
too), so two processes upgrading at once (workers starting together) run the
revisions once. Revisions are recorded in ``statepact_alembic_version``, apart
from an application's own ``alembic_version``; a record an earlier release
wrote with a bare id (``0001``-``0003``) is rewritten to today's
(``statepact_0001``...) before anything runs. Offline (``--sql``), the SQL goes
to the config's output buffer; with ``config.attributes["within_application"]``
(``migrate.upgrade_from_env`` inside an application's offline script) it is
written without a ``BEGIN``/``COMMIT`` of its own, inside the application's.

New revisions: ``alembic revision --autogenerate --rev-id statepact_NNNN -m ...``
(the ids carry statepact's name so they can never be an application's).

This file must never configure logging when a caller asks it not to
(``config.attributes["configure_logger"] = False``): a library call must not
reconfigure an application's loggers.
"""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import create_async_engine

from statepact.storage.postgres.migrate import LEGACY_REVISIONS, owned_table
from statepact.storage.postgres.schema import metadata

config = context.config

if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = metadata
VERSION_TABLE = config.get_main_option("version_table") or "statepact_alembic_version"
# pg_advisory_xact_lock key of migrations: b"STATEPAC" as a big-endian bigint.
MIGRATION_LOCK_KEY = 0x5354415445504143
LOCK = f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})"
# One statement, harmless when nothing matches: earlier releases' bare ids become today's.
RENAME_LEGACY = (
    f"UPDATE {VERSION_TABLE} SET version_num = CASE version_num "
    + " ".join(f"WHEN '{old}' THEN '{new}'" for old, new in LEGACY_REVISIONS.items())
    + " END WHERE version_num IN ("
    + ", ".join(f"'{old}'" for old in LEGACY_REVISIONS)
    + ")"
)


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Compare only statepact's own tables: the database may hold an application's too."""
    if type_ == "table":
        return owned_table(name)
    return True


def _url() -> str:
    url = (
        context.get_x_argument(as_dictionary=True).get("url")
        or config.get_main_option("sqlalchemy.url")
        or os.environ.get("STATEPACT_DATABASE_URL")
    )
    if not url:
        raise RuntimeError(
            "no database URL: pass -x url=postgresql+asyncpg://..., set sqlalchemy.url "
            "in alembic.ini, or set STATEPACT_DATABASE_URL"
        )
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    return parsed.render_as_string(hide_password=False)


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        compare_type=True,
        compare_server_default=True,
        **kwargs,  # type: ignore[arg-type]
    )


def run_migrations_offline() -> None:
    """Emit the SQL of the revisions instead of running it (``alembic upgrade --sql``).

    No database is needed: the dialect is PostgreSQL, the only one statepact runs on.
    """
    nested = bool(config.attributes.get("within_application"))
    _configure(
        dialect_name="postgresql",
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        # Inside an application's script: its BEGIN/COMMIT hold ours too.
        **({"transactional_ddl": False} if nested else {}),
    )
    with context.begin_transaction():
        context.execute(LOCK)
        if context.get_starting_revision_argument() is not None:
            context.execute(RENAME_LEGACY)
        context.run_migrations()


def _rename_legacy(connection: Connection) -> None:
    present = connection.execute(
        text("SELECT to_regclass(:name) IS NOT NULL"), {"name": VERSION_TABLE}
    ).scalar()
    if present:
        connection.execute(text(RENAME_LEGACY))


def do_run_migrations(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        connection.execute(text(LOCK))
        _rename_legacy(connection)
        context.run_migrations()


async def run_async_migrations() -> None:
    engine = create_async_engine(_url(), poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    handed = config.attributes.get("connection")
    if handed is not None:
        do_run_migrations(handed)
    else:
        asyncio.run(run_async_migrations())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
