"""Where the database is: ``ORDERS_DATABASE_URL``, read by the app, the worker and Alembic."""

from __future__ import annotations

import os

from pydantic import SecretStr

from statepact import PostgresStoreSettings

ENVIRONMENT_VARIABLE = "ORDERS_DATABASE_URL"


def database_url() -> str:
    """The application's database, ``postgresql+asyncpg://user:password@host:port/db``."""
    url = os.environ.get(ENVIRONMENT_VARIABLE)
    if not url:
        raise RuntimeError(
            f"{ENVIRONMENT_VARIABLE} is not set: export it as "
            "postgresql+asyncpg://user:password@host:port/database"
        )
    return url


def store_settings() -> PostgresStoreSettings:
    """statepact's settings for this app: the same database, one pool for everything."""
    return PostgresStoreSettings(
        dsn=SecretStr(database_url()),
        queue_name="orders",
        pool_size=10,
        pool_timeout=5.0,  # wait up to 5 s for a pooled connection under load
    )
