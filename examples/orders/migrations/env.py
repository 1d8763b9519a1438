"""The application's Alembic environment: Alembic's async template, plus statepact's lines.

Each line added for statepact is marked ``# statepact``: the filter keeps the
application's autogenerate from seeing statepact's tables, and
``upgrade_from_env()`` applies statepact's revisions in the same transaction
whenever the application runs ``alembic upgrade``. See docs/adopting.md.
"""

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from orders_app.models import metadata as target_metadata
from orders_app.settings import ENVIRONMENT_VARIABLE
from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import async_engine_from_config

from statepact.storage.postgres import migrate as statepact_migrate  # statepact

config = context.config

if config.config_file_name is not None:
    fileConfig(config.config_file_name)

if os.environ.get(ENVIRONMENT_VARIABLE):  # the app's URL, as the app and the worker read it
    config.set_main_option("sqlalchemy.url", os.environ[ENVIRONMENT_VARIABLE].replace("%", "%%"))


def run_migrations_offline() -> None:
    """Run migrations in 'offline' mode (alembic upgrade --sql)."""
    url = config.get_main_option("sqlalchemy.url")
    context.configure(
        url=url,
        target_metadata=target_metadata,
        include_name=statepact_migrate.include_name,  # statepact: not the app's tables
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )

    with context.begin_transaction():
        statepact_migrate.upgrade_from_env()  # statepact: its revisions, in this script
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        include_name=statepact_migrate.include_name,  # statepact: not the app's tables
    )

    with context.begin_transaction():
        statepact_migrate.upgrade_from_env()  # statepact: its revisions, same transaction
        context.run_migrations()


async def run_async_migrations() -> None:
    connectable = async_engine_from_config(
        config.get_section(config.config_ini_section, {}),
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )

    async with connectable.connect() as connection:
        await connection.run_sync(do_run_migrations)

    await connectable.dispose()


def run_migrations_online() -> None:
    asyncio.run(run_async_migrations())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
