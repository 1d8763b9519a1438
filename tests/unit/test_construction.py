"""One construction shape: every backing object is ``(client, *, clock, settings)`` plus
``open()``, the transaction backends' options live in settings, and ``open_backing`` opens
the three together. Here with no server: the settings, the memory backing, and the server
backends' constructors (building one connects to nothing); the servers are in
``tests/integration/test_open_backing.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr, ValidationError
from sqlalchemy.ext.asyncio import create_async_engine

from statepact import (
    ManualClock,
    QueuePolicy,
    RetryPolicy,
    RunRecord,
    StatePersistenceError,
    WorkItem,
)
from statepact.settings import MemoryStoreSettings, PostgresStoreSettings, RedisStoreSettings
from statepact.storage import Backing
from statepact.storage.memory import (
    MemoryBackend,
    MemoryStateStore,
    MemoryWorkQueue,
    open_backing,
)
from statepact.storage.postgres import PostgresBackend
from statepact.storage.redis import RedisBackend, create_client

# -- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "field", "value"),
    [
        (MemoryStoreSettings, "lock_timeout", -1),
        (MemoryStoreSettings, "lock_timeout", float("nan")),
        (MemoryStoreSettings, "serialization_window", 0),
        (MemoryStoreSettings, "serialization_window", 2.0),
        (MemoryStoreSettings, "retain_versions", 0),
        (MemoryStoreSettings, "max_value_bytes", 0),
        (MemoryStoreSettings, "queue_name", ""),
        (RedisStoreSettings, "tx_prefix", "a{b"),
        (RedisStoreSettings, "tx_prefix", ""),
        (RedisStoreSettings, "history_limit", 0),
        (RedisStoreSettings, "history_limit", True),
        (RedisStoreSettings, "history_limit", "5"),
        (RedisStoreSettings, "idempotency_ttl_seconds", 0),
        (RedisStoreSettings, "lock_ttl_seconds", 0),
        (RedisStoreSettings, "lock_timeout", -0.5),
        (PostgresStoreSettings, "lock_ttl_seconds", -1),
        (PostgresStoreSettings, "lock_timeout", -1),
        (PostgresStoreSettings, "serialization_window", 0),
    ],
)
def test_settings_refuse_a_bad_option_naming_the_field(
    model: type[Any], field: str, value: object
) -> None:
    """A refused option is a ValidationError (a ValueError) naming the field."""
    with pytest.raises(ValidationError) as caught:
        model(**{field: value})
    assert isinstance(caught.value, ValueError)
    assert [error["loc"] for error in caught.value.errors()] == [(field,)]


def test_the_defaults_are_the_seeds() -> None:
    """The transaction options' defaults, once, in the settings."""
    memory = MemoryStoreSettings()
    assert (memory.lock_timeout, memory.serialization_window) == (5.0, 512)
    assert (memory.retain_versions, memory.gc) == (None, True)
    redis = RedisStoreSettings()
    assert (redis.tx_prefix, redis.history_limit) == ("statepact", 512)
    assert (redis.idempotency_ttl_seconds, redis.lock_ttl_seconds) == (30 * 24 * 3600, 60.0)
    assert redis.lock_timeout == 5.0
    postgres = PostgresStoreSettings()
    assert (postgres.lock_timeout, postgres.lock_ttl_seconds) == (5.0, 60.0)
    assert postgres.serialization_window == 512


def test_replace_is_a_validated_copy() -> None:
    """replace() changes what is given, keeps what is None, validates, and maps failover."""
    settings = RedisStoreSettings(namespace="app")
    assert settings.replace() is settings
    assert settings.replace(history_limit=None) is settings
    changed = settings.replace(tx_prefix="tx", failover=RetryPolicy(attempts=9, max_delay=1.0))
    assert (changed.namespace, changed.tx_prefix, changed.failover_attempts) == ("app", "tx", 9)
    assert changed.retry_policy == RetryPolicy(attempts=9, max_delay=1.0)
    assert settings.tx_prefix == "statepact"  # frozen: the original is unchanged
    with pytest.raises(ValidationError, match="history_limit"):
        settings.replace(history_limit=0)
    with pytest.raises(ValidationError, match="no_such_field"):
        settings.replace(no_such_field=1)


# -- memory ----------------------------------------------------------------------------------


def test_memory_backend_reads_its_options_from_settings() -> None:
    """MemoryBackend(clock=, settings=): the options come from MemoryStoreSettings."""
    clock = ManualClock()
    settings = MemoryStoreSettings(lock_timeout=1.5, serialization_window=8, retain_versions=3)
    backend = MemoryBackend(clock=clock, settings=settings.replace(gc=False))
    assert backend.clock is clock
    assert (backend.lock_timeout, backend.serialization_window) == (1.5, 8)
    assert (backend.retain_versions, backend.gc) == (3, False)
    assert backend.settings.gc is False


def test_memory_backend_keywords_win_over_settings() -> None:
    """The seed's keywords still work, and win over settings; a bad one names the field."""
    backend = MemoryBackend(settings=MemoryStoreSettings(lock_timeout=1.0), lock_timeout=2.0)
    assert backend.lock_timeout == 2.0 and backend.settings.lock_timeout == 2.0
    with pytest.raises(ValueError, match="retain_versions"):
        MemoryBackend(settings=MemoryStoreSettings(), retain_versions=0)


async def test_memory_open_builds_what_the_constructor_builds() -> None:
    """open() of each memory class takes the same arguments and checks nothing."""
    clock = ManualClock()
    settings = MemoryStoreSettings(max_value_bytes=64, queue_name="jobs", lock_timeout=0.5)
    state = await MemoryStateStore.open(clock=clock, settings=settings)
    queue = await MemoryWorkQueue.open(clock=clock, settings=settings, policy=QueuePolicy())
    backend = await MemoryBackend.open(clock=clock, settings=settings)
    assert state.clock is clock and queue.clock is clock and backend.clock is clock
    assert queue.name == "jobs" and backend.lock_timeout == 0.5
    with pytest.raises(StatePersistenceError, match="max_value_bytes=64"):
        await state.put_run(RunRecord(tenant="t", run_id="r", data={"x": "y" * 100}))
    # The stores' keywords still win over settings.
    assert MemoryWorkQueue(settings=settings, name="other").name == "other"
    with pytest.raises(ValueError, match="max_value_bytes"):
        MemoryStateStore(settings=settings, max_value_bytes=0)


async def test_memory_open_backing_opens_the_three_on_one_clock() -> None:
    """open_backing: state, queue and backend on the settings and one clock, a manager on
    the backend; close() closes the backend."""
    clock = ManualClock()
    settings = MemoryStoreSettings(queue_name="agents", retain_versions=5, max_value_bytes=1000)
    backing = await open_backing(settings, clock=clock, policy=QueuePolicy(max_attempts=2))
    assert isinstance(backing, Backing)
    assert backing.state.clock is clock and backing.queue.clock is clock
    assert backing.manager.clock is clock and backing.manager.backend is backing.backend
    assert backing.manager.max_value_bytes == 1000
    assert backing.queue.name == "agents" and backing.backend.retain_versions == 5
    assert backing.queue.policy.max_attempts == 2
    assert backing.client is None
    await backing.state.put_run(RunRecord(tenant="acme", run_id="r1"))
    await backing.queue.enqueue(WorkItem(tenant="acme", item_id="r1"))
    async with backing.manager.transaction() as tx:
        tx.write("budgets", "acme", {"spent": 1})
    assert tx.result.version == 1
    assert await backing.manager.health_check() is True
    await backing.close()
    assert await backing.manager.health_check() is False
    await backing.close()  # idempotent


async def test_memory_open_backing_as_a_context_manager_with_defaults() -> None:
    """``async with await open_backing()``: default settings and a system clock, closed on exit."""
    async with await open_backing() as backing:
        assert backing.state.clock is backing.queue.clock is backing.manager.clock
        assert backing.backend.settings == MemoryStoreSettings()
        assert await backing.manager.health_check() is True
    assert await backing.manager.health_check() is False


# -- the server backends' constructors (nothing connects) ------------------------------------


async def test_redis_backend_reads_its_options_from_settings() -> None:
    """RedisBackend(redis, clock=, settings=): tx_prefix and the tx options from settings;
    the seed's keywords win; building it sends nothing."""
    clock = ManualClock()
    client = create_client(RedisStoreSettings(dsn=SecretStr("redis://127.0.0.1:1/0")))
    try:
        settings = RedisStoreSettings(
            tx_prefix="app",
            history_limit=7,
            idempotency_ttl_seconds=60,
            lock_ttl_seconds=2.0,
            lock_timeout=0.25,
            failover_attempts=2,
        )
        backend = RedisBackend(client, clock=clock, settings=settings)
        assert backend.clock is clock and backend.prefix == "app"
        assert (backend.history_limit, backend.idempotency_ttl_seconds) == (7, 60)
        assert (backend.lock_ttl_seconds, backend.lock_timeout) == (2.0, 0.25)
        assert backend.settings.retry_policy.attempts == 2
        legacy = RedisBackend(
            client, settings=settings, prefix="seed", history_limit=9, failover=RetryPolicy(3)
        )
        assert (legacy.prefix, legacy.history_limit, legacy.lock_timeout) == ("seed", 9, 0.25)
        assert legacy.settings.failover_attempts == 3
        with pytest.raises(ValueError, match="tx_prefix"):
            RedisBackend(client, prefix="a{b")
        with pytest.raises(ValueError, match="history_limit"):
            RedisBackend(client, history_limit=0)
    finally:
        await client.aclose()


async def test_postgres_backend_reads_its_options_from_settings() -> None:
    """PostgresBackend(engine, clock=, settings=): the tx options from settings; the keywords
    win; building it connects to nothing."""
    clock = ManualClock()
    engine = create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:1/nothing")
    try:
        settings = PostgresStoreSettings(
            lock_timeout=0.5, lock_ttl_seconds=3.0, serialization_window=16, failover_attempts=2
        )
        backend = PostgresBackend(engine, clock=clock, settings=settings)
        assert backend.clock is clock and backend.engine is engine
        assert (backend.lock_timeout, backend.lock_ttl_seconds) == (0.5, 3.0)
        assert backend.serialization_window == 16
        assert backend.settings.retry_policy.attempts == 2
        legacy = PostgresBackend(engine, settings=settings, lock_timeout=1.0)
        assert (legacy.lock_timeout, legacy.serialization_window) == (1.0, 16)
        with pytest.raises(ValueError, match="serialization_window"):
            PostgresBackend(engine, serialization_window=0)
        with pytest.raises(TypeError, match="engine"):
            PostgresBackend("postgresql://x/y", settings=settings)  # type: ignore[arg-type]
    finally:
        await engine.dispose()
