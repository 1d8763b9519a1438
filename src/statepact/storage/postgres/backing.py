"""``open_backing``: the PostgreSQL state store, work queue and transaction backend together."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from statepact.clock import Clock
from statepact.queue import QueuePolicy
from statepact.settings import PostgresStoreSettings
from statepact.storage import Backing, assemble_backing
from statepact.storage.postgres._engine import create_engine
from statepact.storage.postgres.backend import PostgresBackend
from statepact.storage.postgres.queue import PostgresWorkQueue
from statepact.storage.postgres.schema import StateTables
from statepact.storage.postgres.state import PostgresStateStore

__all__ = ["open_backing"]


async def open_backing(
    settings: PostgresStoreSettings,
    *,
    clock: Clock | None = None,
    policy: QueuePolicy | None = None,
    client: AsyncEngine | None = None,
    tables: StateTables | None = None,
) -> Backing[PostgresStateStore, PostgresWorkQueue, PostgresBackend]:
    """A ``PostgresStateStore``, a ``PostgresWorkQueue`` (``policy``) and a
    ``PostgresBackend`` under a ``TransactionManager``, all on one engine, ``clock``
    (else one ``SystemClock``) and ``settings``, each through its ``open()``: the
    stores' ``verify()``, the backend's schema check. Nothing is created: run the
    migrations first (``statepact db upgrade``).

    The engine is ``create_engine(settings)``'s, disposed with the backing, unless
    ``client`` (an ``AsyncEngine`` you own) is given. ``tables`` renames the
    ``adk_*`` tables, as for the stores. Raises what ``open()`` raises
    (``SchemaVersionError``, ``PreflightError``, ``StatePersistenceError``), having
    disposed of its own engine.
    """
    engine = create_engine(settings) if client is None else client
    return await assemble_backing(
        state=lambda clock: PostgresStateStore.open(
            engine, clock=clock, settings=settings, tables=tables
        ),
        queue=lambda clock: PostgresWorkQueue.open(
            engine, clock=clock, settings=settings, policy=policy, tables=tables
        ),
        backend=lambda clock: PostgresBackend.open(engine, clock=clock, settings=settings),
        clock=clock,
        max_value_bytes=settings.max_value_bytes,
        client=engine,
        close_client=engine.dispose if client is None else None,
    )
