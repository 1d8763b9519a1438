"""The PostgreSQL backings: SQLAlchemy Core (async, asyncpg) with Alembic migrations.

- :class:`PostgresStateStore` and :class:`PostgresWorkQueue` (the ``StateStore``
  and ``WorkQueue`` protocols); ``bound(session)`` runs either inside a
  transaction the caller opened, so a state change and the work it queued
  commit together or not at all.
- :data:`metadata` (one ``MetaData`` with every table), :data:`EXPECTED_SCHEMA`
  derived from it, and :class:`StateTables` (table names, plain identifiers only).
- :func:`verify` (what ``open()`` runs) and ``statepact.storage.postgres.migrate``
  (``upgrade``/``downgrade``/``current``/``check``, the same revisions as
  ``statepact db``; ``upgrade_from_env`` for an application's own Alembic
  ``env.py``), and :class:`AutogenerateFilter`, which hides statepact's objects
  from an application's autogenerate.
- :class:`EngineExecutor` (SQLAlchemy), :class:`DirectExecutor` and
  :class:`Prepared` (asyncpg, compiled statements): the executors the stores use
  (their pool, failover and error translation), for an integration that keeps
  tables of its own (``statepact.integrations``).

Importing this package imports SQLAlchemy (and asyncpg when a connection is
made), never Alembic: that is loaded only by the migration helpers. Nothing
here creates or alters a table at import or at ``open()``.
"""

from statepact.settings import PostgresStoreSettings
from statepact.storage.postgres._client import EngineExecutor, connect_refusal
from statepact.storage.postgres._direct import DirectExecutor, Prepared
from statepact.storage.postgres._engine import (
    asyncpg_url,
    create_engine,
    refuse_closed_connections,
)
from statepact.storage.postgres.backend import PostgresBackend
from statepact.storage.postgres.backing import open_backing
from statepact.storage.postgres.migrate import AutogenerateFilter
from statepact.storage.postgres.queue import PostgresWorkQueue
from statepact.storage.postgres.schema import EXPECTED_SCHEMA, StateTables, metadata
from statepact.storage.postgres.state import PostgresStateStore
from statepact.storage.postgres.verify import verify

__all__ = [
    "EXPECTED_SCHEMA",
    "AutogenerateFilter",
    "DirectExecutor",
    "EngineExecutor",
    "PostgresBackend",
    "PostgresStateStore",
    "PostgresStoreSettings",
    "PostgresWorkQueue",
    "Prepared",
    "StateTables",
    "asyncpg_url",
    "connect_refusal",
    "create_engine",
    "metadata",
    "open_backing",
    "refuse_closed_connections",
    "verify",
]
