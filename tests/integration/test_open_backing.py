"""One construction shape on real servers: ``open()`` checks the server for every Redis and
PostgreSQL object, the transaction backend included, and ``open_backing`` opens the three
together on one client, closing the client it built (and only that one).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from statepact import (
    ItemStatus,
    ManualClock,
    PreflightError,
    QueuePolicy,
    RunRecord,
    SchemaVersionError,
    WorkItem,
)
from statepact.settings import PostgresStoreSettings, RedisStoreSettings
from statepact.storage import Backing
from statepact.storage.postgres import PostgresBackend, create_engine
from statepact.storage.postgres import open_backing as open_postgres
from statepact.storage.redis import RedisBackend, TxKeys, create_client
from statepact.storage.redis import open_backing as open_redis
from statepact.testing.plugin import RedisServerFactory

pytestmark = pytest.mark.integration

POLICY = QueuePolicy(max_attempts=2)


async def _exercise(backing: Backing[Any, Any, Any]) -> None:
    """A run, its work item and a commit through one backing: the three work together."""
    state, queue, manager = backing.state, backing.queue, backing.manager
    await state.put_run(RunRecord(tenant="acme", run_id="r1"))
    await queue.enqueue(WorkItem(tenant="acme", item_id="r1"))
    lease = await queue.claim("w1", lease_for=30)
    assert lease is not None and lease.item.item_id == "r1"
    assert (await queue.ack(lease)).status is ItemStatus.DONE
    async with manager.transaction() as tx:
        tx.write("budgets", "acme", {"spent": 1})
    assert tx.result.version == 1
    assert (await state.get_run("acme", "r1")) is not None


# -- Redis ---------------------------------------------------------------------------------------


async def test_redis_open_backing_builds_and_closes_its_client(
    statepact_redis_settings: RedisStoreSettings,
) -> None:
    """open_backing(settings) builds its client with create_client, opens the three through
    open() (the backend's keys under tx_prefix), and close() closes the client."""
    clock = ManualClock()
    probe = create_client(statepact_redis_settings)
    try:
        backing = await open_redis(statepact_redis_settings, clock=clock, policy=POLICY)
        try:
            assert backing.state.clock is clock and backing.manager.clock is clock
            assert backing.backend.prefix == statepact_redis_settings.tx_prefix
            assert backing.queue.policy is POLICY
            await _exercise(backing)
            seq = TxKeys(statepact_redis_settings.tx_prefix).seq
            assert await probe.get(seq) == b"1"
            await backing.backend.clear()
            opened = await _connected(probe)
        finally:
            await backing.close()
        assert await backing.manager.health_check() is False
        for _ in range(100):  # the server sees the sockets close a moment later
            if await _connected(probe) < opened:
                break
            await asyncio.sleep(0.02)
        assert await _connected(probe) < opened
    finally:
        await probe.aclose()


async def _connected(client: Any) -> int:
    return int((await client.info("clients"))["connected_clients"])


async def test_redis_open_backing_leaves_a_client_it_was_given_open(
    statepact_redis_settings: RedisStoreSettings,
) -> None:
    """open_backing(client=...): the three run on that client, which outlives close()."""
    client = create_client(statepact_redis_settings)
    try:
        async with await open_redis(
            statepact_redis_settings, clock=ManualClock(), policy=POLICY, client=client
        ) as backing:
            assert backing.client is client
            await _exercise(backing)
            await backing.backend.clear()
        assert await backing.manager.health_check() is False
        assert await client.ping() is True
    finally:
        await client.aclose()


async def test_redis_open_runs_the_preflight_for_every_object(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """On a server that evicts keys, RedisBackend.open and open_backing raise PreflightError
    (durable or not), as the stores' open() does; the plain constructor does not check."""
    server = statepact_redis_server_factory(["--maxmemory-policy", "allkeys-lru"])
    settings = RedisStoreSettings(dsn=SecretStr(server.url), durable=False)
    client = create_client(settings)
    try:
        with pytest.raises(PreflightError, match="maxmemory-policy"):
            await RedisBackend.open(client, settings=settings)
        with pytest.raises(PreflightError, match="maxmemory-policy"):
            await open_redis(settings)
        with pytest.raises(PreflightError, match="maxmemory-policy"):
            await open_redis(settings, client=client)
        assert await client.ping() is True  # a client it was given stays open
        assert RedisBackend(client, settings=settings).prefix == "statepact"
    finally:
        await client.aclose()


async def test_redis_open_honours_durable(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """RedisBackend.open refuses a server that keeps nothing on disk unless the settings say
    durable=False, as RedisBackend.connect(durable=False) does."""
    server = statepact_redis_server_factory(["--appendonly", "no", "--save", ""])
    durable = RedisStoreSettings(dsn=SecretStr(server.url), tx_prefix=f"t{uuid.uuid4().hex[:8]}")
    client = create_client(durable)
    try:
        with pytest.raises(PreflightError, match="appendonly"):
            await RedisBackend.open(client, settings=durable)
        relaxed = await RedisBackend.open(client, settings=durable.replace(durable=False))
        assert await relaxed.health_check() is True
        await relaxed.close()
        assert await client.ping() is True  # the backend never closes a client it was given
    finally:
        await client.aclose()


# -- PostgreSQL ----------------------------------------------------------------------------------


async def test_postgres_open_backing_builds_and_disposes_its_engine(
    statepact_postgres_settings: PostgresStoreSettings,
) -> None:
    """open_backing(settings) builds its engine with create_engine, opens the three through
    open() with the transaction options from settings, and close() disposes of the engine."""
    settings = statepact_postgres_settings.replace(lock_timeout=0.75)
    backing = await open_postgres(settings, clock=ManualClock(), policy=POLICY)
    engine: AsyncEngine = backing.client
    try:
        assert backing.backend.engine is engine and backing.backend.lock_timeout == 0.75
        await _exercise(backing)
        # The state store's bound() on the backing's engine, in one transaction of yours.
        async with engine.begin() as conn:
            await backing.state.bound(conn).put_run(RunRecord(tenant="acme", run_id="r2"))
            await backing.queue.bound(conn).enqueue(WorkItem(tenant="acme", item_id="r2"))
        assert await backing.queue.get_item("acme", "r2") is not None
    finally:
        await backing.close()
    assert engine.pool.checkedin() == 0  # type: ignore[attr-defined]
    assert await backing.manager.health_check() is False


async def test_postgres_open_backing_leaves_an_engine_it_was_given_open(
    statepact_postgres_settings: PostgresStoreSettings,
) -> None:
    """open_backing(client=engine): the three share that engine, which outlives close()."""
    engine = create_engine(statepact_postgres_settings)
    try:
        async with await open_postgres(
            statepact_postgres_settings, clock=ManualClock(), policy=POLICY, client=engine
        ) as backing:
            assert backing.client is engine and backing.backend.engine is engine
            await _exercise(backing)
        async with engine.connect() as conn:
            sequence = text("SELECT last_value FROM statepact_version_seq")
            assert (await conn.execute(sequence)).scalar() == 1
    finally:
        await engine.dispose()


async def test_postgres_open_checks_the_schema_and_creates_nothing(
    empty_database_url: str,
) -> None:
    """On a database without the tables, open_backing and PostgresBackend.open raise
    SchemaVersionError and create nothing; PostgresBackend.open(create_schema=True) migrates."""
    settings = PostgresStoreSettings(dsn=SecretStr(empty_database_url))
    with pytest.raises(SchemaVersionError):
        await open_postgres(settings)
    engine = create_engine(settings)
    try:
        with pytest.raises(SchemaVersionError, match="create_schema=False"):
            await PostgresBackend.open(engine, settings=settings)
        async with engine.connect() as conn:
            found = await conn.execute(text("SELECT to_regclass('statepact_meta')"))
            assert found.scalar() is None
        backend = await PostgresBackend.open(engine, settings=settings, create_schema=True)
        assert await backend.health_check() is True
        await backend.close()
    finally:
        await engine.dispose()
