"""The seed's backend snippets (``shared/seeds/statepact-backends.md``), run as written.

Each snippet's imports, constructor or ``connect()`` call and options are the
seed's, on real servers: PostgreSQL on a database of the test's own that starts
empty (``connect()`` creates the schema, as the seed says), Redis on the test
server (durable: AOF on, so ``connect()``'s persistence preflight passes). Each
backend is wrapped in ``TransactionManager`` and does one commit and one read,
then the seed's operations: ``health_check``, ``clear``, ``close``.
"""

from __future__ import annotations

import os

import pytest
from redis.asyncio import Redis
from sqlalchemy import pool, text
from sqlalchemy.ext.asyncio import create_async_engine

from statepact import TransactionManager
from statepact.storage.memory import MemoryBackend
from statepact.storage.postgres import PostgresBackend
from statepact.storage.redis import RedisBackend

R = "orders"


async def commit_read_clear(manager: TransactionManager, backend: object) -> None:
    """One commit (the first since the last clear) and one read, health_check, clear, close."""
    async with manager.transaction() as tx:
        tx.write(R, "o1", {"state": "paid"})
    assert tx.result.version == 1 and not tx.result.replayed
    async with manager.transaction() as tx:
        assert await tx.read(R, "o1") == {"state": "paid"}
    assert await manager.health_check() is True
    await backend.clear()  # type: ignore[attr-defined]
    async with manager.transaction() as tx:
        assert await tx.read(R, "o1") is None
    await manager.close()


async def statepact_tables(url: str) -> list[str]:
    engine = create_async_engine(url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT tablename FROM pg_tables WHERE tablename LIKE 'statepact\\_%' "
                    "AND tablename <> 'statepact_alembic_version' "
                    # The integrations' and the worker registry's tables come with the same
                    # revisions; not the seed's.
                    "AND tablename <> 'statepact_workers' "
                    "AND tablename NOT LIKE 'statepact\\_lg\\_%' "
                    "AND tablename NOT LIKE 'statepact\\_adk\\_%' ORDER BY tablename"
                )
            )
            return [row[0] for row in rows]
    finally:
        await engine.dispose()


SEED_TABLES = [
    "statepact_history",
    "statepact_idempotency",
    "statepact_leases",
    "statepact_locks",
    "statepact_meta",
    "statepact_resources",
    "statepact_values",
]


async def test_memory_backend_snippet() -> None:
    """MemoryBackend() and its documented options, under TransactionManager."""
    backend = MemoryBackend()
    manager = TransactionManager(backend)
    await commit_read_clear(manager, backend)
    assert await manager.health_check() is False  # closed

    backend = MemoryBackend(
        lock_timeout=5.0, serialization_window=512, retain_versions=None, gc=True
    )
    manager = TransactionManager(backend)
    await commit_read_clear(manager, backend)


@pytest.mark.integration
async def test_postgres_backend_snippets(
    empty_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgresBackend.connect(dsn) creates the schema on first connect; the seed's options."""
    assert await statepact_tables(empty_database_url) == []
    monkeypatch.setenv("STATEPACT_DATABASE_URL", empty_database_url)

    backend = await PostgresBackend.connect(os.environ["STATEPACT_DATABASE_URL"])
    manager = TransactionManager(backend)
    assert await statepact_tables(empty_database_url) == SEED_TABLES
    assert backend.engine.pool.size() == 10  # type: ignore[attr-defined]  # "1-10 connections"
    await commit_read_clear(manager, backend)

    # The seed's configuration, on the same database: the schema is there now.
    dsn = empty_database_url
    backend = await PostgresBackend.connect(
        dsn,
        min_size=2,
        max_size=20,
        lock_timeout=5.0,
        serialization_window=512,
    )
    manager = TransactionManager(backend)
    assert (backend.lock_timeout, backend.serialization_window) == (5.0, 512)
    assert backend.engine.pool.size() == 20  # type: ignore[attr-defined]
    assert backend.engine.pool.checkedin() == 2  # type: ignore[attr-defined]
    await commit_read_clear(manager, backend)  # version 1 again: clear() reset the sequence


@pytest.mark.integration
async def test_redis_backend_snippet(statepact_redis_url: str, redis_client: Redis) -> None:
    """RedisBackend.connect with the seed's prefix, history cap, idempotency TTL and lock TTL."""
    backend = await RedisBackend.connect(
        statepact_redis_url,
        prefix="myapp",
        history_limit=512,
        idempotency_ttl_seconds=30 * 24 * 3600,
        lock_ttl_seconds=60.0,
    )
    manager = TransactionManager(backend)
    assert (backend.history_limit, backend.idempotency_ttl_seconds) == (512, 30 * 24 * 3600)
    assert backend.lock_ttl_seconds == 60.0
    async with manager.transaction(idempotency_key="seed") as tx:
        tx.write(R, "o0", 0)
    keys = [key.decode() for key in await redis_client.keys("*") if isinstance(key, bytes)]
    assert keys and all(key.startswith("{myapp}:") for key in keys)
    assert "{myapp}:seq" in keys
    ttl = await redis_client.ttl(next(key for key in keys if ":idem:" in key))
    assert 30 * 24 * 3600 - 60 < ttl <= 30 * 24 * 3600
    await backend.clear()
    assert await redis_client.keys("*") == []
    await commit_read_clear(manager, backend)
    assert await redis_client.keys("*") == []
