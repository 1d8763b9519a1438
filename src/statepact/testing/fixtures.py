"""The plugin's per-test fixtures for an application's own tests (``docs/testing.md``).

Every name starts with ``statepact_``, so none can clash with a fixture of the
application's. Per test, each gives something nobody else sees:

- ``statepact_clock``: a ``ManualClock``; ``statepact_queue_policy``: the
  ``QueuePolicy`` the work-queue fixtures are built with (``QueuePolicy()``;
  the queue suite and a test's ``parametrize`` override it).
- PostgreSQL: ``statepact_postgres_template`` (session) is built once, by
  statepact's migrations and then the ``pytest_statepact_postgres_template``
  hook (the application's own); ``statepact_postgres_database`` is a clone of
  it per test, with ``statement_timeout`` set, dropped after the test;
  ``statepact_postgres_settings``, ``statepact_postgres_engine``, and the
  stores on it: ``statepact_postgres_state_store``,
  ``statepact_postgres_work_queue``, ``statepact_postgres_backend`` (opened,
  closed after the test).
- Redis: ``statepact_redis_namespace``, a namespace of its own whose keys are
  deleted after the test; ``statepact_redis_settings``,
  ``statepact_redis_client``, and the stores under that namespace:
  ``statepact_redis_state_store``, ``statepact_redis_work_queue``,
  ``statepact_redis_backend``.
- Memory: ``statepact_memory_state_store``, ``statepact_memory_work_queue``,
  ``statepact_memory_backend``.

The stores are built with their plain constructors on the test's
``statepact_clock`` (no preflight: a test server need not be durable). The
database and namespace fixtures are synchronous (their own event loop, in a
thread), so a test without pytest-asyncio can use them; the engine, client and
store fixtures are async and need it.

This module must never import a driver at import time (the plugin imports it),
and never create, empty or drop anything it did not name itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest

from statepact.clock import ManualClock
from statepact.queue import QueuePolicy

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from sqlalchemy.ext.asyncio import AsyncEngine

    from statepact.settings import PostgresStoreSettings, RedisStoreSettings
    from statepact.storage.memory import MemoryBackend, MemoryStateStore, MemoryWorkQueue
    from statepact.storage.postgres import PostgresBackend, PostgresStateStore, PostgresWorkQueue
    from statepact.storage.redis import RedisBackend, RedisStateStore, RedisWorkQueue

try:  # pytest-asyncio's decorator works in its strict mode too; plain pytest's in auto mode
    from pytest_asyncio import fixture as async_fixture
except ImportError:  # pragma: no cover - without pytest-asyncio an async fixture cannot run
    async_fixture = pytest.fixture  # type: ignore[assignment]

__all__ = [
    "CONNECTIONS_WAIT",
    "POSTGRES_MAX_OVERFLOW",
    "POSTGRES_POOL_SIZE",
    "REDIS_POOL_SIZE",
    "statepact_clock",
    "statepact_memory_backend",
    "statepact_memory_state_store",
    "statepact_memory_work_queue",
    "statepact_postgres_backend",
    "statepact_postgres_database",
    "statepact_postgres_engine",
    "statepact_postgres_settings",
    "statepact_postgres_state_store",
    "statepact_postgres_template",
    "statepact_postgres_work_queue",
    "statepact_queue_policy",
    "statepact_redis_backend",
    "statepact_redis_client",
    "statepact_redis_namespace",
    "statepact_redis_settings",
    "statepact_redis_state_store",
    "statepact_redis_work_queue",
]

#: The suites run up to 50 calls at once: the pools are sized for that.
POSTGRES_POOL_SIZE = 12
POSTGRES_MAX_OVERFLOW = 8
REDIS_POOL_SIZE = 64
#: Seconds the template may take to lose its last session (one closing as the hook returns).
CONNECTIONS_WAIT = 5.0
#: The history the transaction suite reads back needs at least 16 versions per key.
_MEMORY_RETAIN_VERSIONS = 64


@pytest.fixture
def statepact_clock() -> ManualClock:
    """A ``ManualClock`` for one test; build stores and queues with it, move it with ``advance``."""
    return ManualClock()


@pytest.fixture
def statepact_queue_policy() -> QueuePolicy:
    """The policy the ``statepact_*_work_queue`` fixtures build their queue with."""
    return QueuePolicy()


# -- memory ------------------------------------------------------------------------------


@pytest.fixture
def statepact_memory_state_store(statepact_clock: ManualClock) -> MemoryStateStore:
    """An empty ``MemoryStateStore`` on the test's clock."""
    from statepact.storage.memory import MemoryStateStore

    return MemoryStateStore(clock=statepact_clock)


@pytest.fixture
def statepact_memory_work_queue(
    statepact_clock: ManualClock, statepact_queue_policy: QueuePolicy
) -> MemoryWorkQueue:
    """An empty ``MemoryWorkQueue`` on the test's clock and ``statepact_queue_policy``."""
    from statepact.storage.memory import MemoryWorkQueue

    return MemoryWorkQueue(clock=statepact_clock, policy=statepact_queue_policy)


@async_fixture
async def statepact_memory_backend(statepact_clock: ManualClock) -> AsyncIterator[MemoryBackend]:
    """An empty ``MemoryBackend`` keeping 64 versions per key; closed after the test."""
    from statepact.storage.memory import MemoryBackend, MemoryStoreSettings

    settings = MemoryStoreSettings(retain_versions=_MEMORY_RETAIN_VERSIONS)
    backend = MemoryBackend(clock=statepact_clock, settings=settings)
    try:
        yield backend
    finally:
        await backend.close()


# -- PostgreSQL --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def statepact_postgres_template(
    request: pytest.FixtureRequest, statepact_postgres_url: str
) -> Iterator[str]:
    """Name of a database migrated once per session (statepact's, then the hook's), to clone.

    Built on the server of ``statepact_postgres_url`` under a name no other
    session picks, and dropped at the end of the session. Nothing may stay
    connected to it: PostgreSQL clones only a database nobody is using.
    """
    from statepact.testing import databases

    name = databases.unique_database_name("tpl")
    url = databases.run_in_thread(lambda: databases.build_template(statepact_postgres_url, name))
    try:
        request.config.hook.pytest_statepact_postgres_template(url=url, config=request.config)
        left = databases.run_in_thread(
            lambda: databases.connections_to(statepact_postgres_url, name, wait=CONNECTIONS_WAIT)
        )
        if left:
            pytest.fail(
                f"{left} connection(s) to the template database are still open after the "
                "pytest_statepact_postgres_template hook returned; PostgreSQL cannot clone a "
                "database in use: close them in the hook (await engine.dispose())",
                pytrace=False,
            )
        yield name
    finally:
        databases.run_in_thread(lambda: databases.drop_database(statepact_postgres_url, name))


@pytest.fixture
def statepact_postgres_database(
    statepact_postgres_url: str, statepact_postgres_template: str
) -> Iterator[str]:
    """SQLAlchemy asyncpg URL of a database of this test's own, cloned from the template.

    It has statepact's tables at the head revision, whatever the
    ``pytest_statepact_postgres_template`` hook added, and ``statement_timeout =
    30s``; it is dropped after the test (``WITH (FORCE)``).
    """
    from statepact.testing import databases

    name = databases.unique_database_name("t")
    url = databases.run_in_thread(
        lambda: databases.create_database(
            statepact_postgres_url, name, template=statepact_postgres_template
        )
    )
    try:
        yield url
    finally:
        databases.run_in_thread(lambda: databases.drop_database(statepact_postgres_url, name))


@pytest.fixture
def statepact_postgres_settings(statepact_postgres_database: str) -> PostgresStoreSettings:
    """``PostgresStoreSettings`` for the test's database, its pool sized for the suites."""
    from pydantic import SecretStr

    from statepact.settings import PostgresStoreSettings

    return PostgresStoreSettings(
        dsn=SecretStr(statepact_postgres_database),
        pool_size=POSTGRES_POOL_SIZE,
        max_overflow=POSTGRES_MAX_OVERFLOW,
        pool_timeout=10.0,
    )


@async_fixture
async def statepact_postgres_engine(
    statepact_postgres_settings: PostgresStoreSettings,
) -> AsyncIterator[AsyncEngine]:
    """``create_engine(statepact_postgres_settings)``, disposed after the test."""
    from statepact.storage.postgres import create_engine

    engine = create_engine(statepact_postgres_settings)
    try:
        yield engine
    finally:
        await engine.dispose()


@pytest.fixture
def statepact_postgres_state_store(
    statepact_postgres_engine: AsyncEngine,
    statepact_clock: ManualClock,
    statepact_postgres_settings: PostgresStoreSettings,
) -> PostgresStateStore:
    """A ``PostgresStateStore`` on the test's database and clock."""
    from statepact.storage.postgres import PostgresStateStore

    return PostgresStateStore(
        statepact_postgres_engine, clock=statepact_clock, settings=statepact_postgres_settings
    )


@pytest.fixture
def statepact_postgres_work_queue(
    statepact_postgres_engine: AsyncEngine,
    statepact_clock: ManualClock,
    statepact_postgres_settings: PostgresStoreSettings,
    statepact_queue_policy: QueuePolicy,
) -> PostgresWorkQueue:
    """A ``PostgresWorkQueue`` on the test's database, clock and ``statepact_queue_policy``."""
    from statepact.storage.postgres import PostgresWorkQueue

    return PostgresWorkQueue(
        statepact_postgres_engine,
        clock=statepact_clock,
        settings=statepact_postgres_settings,
        policy=statepact_queue_policy,
    )


@async_fixture
async def statepact_postgres_backend(
    statepact_postgres_database: str, statepact_clock: ManualClock
) -> AsyncIterator[PostgresBackend]:
    """``PostgresBackend.connect`` on the test's database and clock; closed after the test.

    ``create_schema=False``: the schema comes from the template, and a database
    without it is an error, not something to repair.
    """
    from statepact.storage.postgres import PostgresBackend

    backend = await PostgresBackend.connect(
        statepact_postgres_database,
        clock=statepact_clock,
        min_size=1,
        max_size=8,
        create_schema=False,
    )
    try:
        yield backend
    finally:
        await backend.close()


# -- Redis -------------------------------------------------------------------------------


@pytest.fixture
def statepact_redis_namespace(statepact_redis_url: str) -> Iterator[str]:
    """A ``RedisStoreSettings.namespace`` of this test's own; its keys are deleted after.

    Deleted: the state store's, the work queue's, and those of a
    ``RedisBackend`` whose ``prefix`` is this namespace; nothing else on the
    server (no ``FLUSHDB``).
    """
    from statepact.testing import databases, namespaces

    namespace = namespaces.unique_namespace()
    try:
        yield namespace
    finally:
        databases.run_in_thread(
            lambda: namespaces.clear_namespace_at(statepact_redis_url, namespace)
        )


@pytest.fixture
def statepact_redis_settings(
    statepact_redis_url: str, statepact_redis_namespace: str
) -> RedisStoreSettings:
    """``RedisStoreSettings`` for the session's server under the test's namespace (the
    state store's and the queue's ``namespace``, the ``RedisBackend``'s ``tx_prefix``)."""
    from pydantic import SecretStr

    from statepact.settings import RedisStoreSettings

    return RedisStoreSettings(
        dsn=SecretStr(statepact_redis_url),
        namespace=statepact_redis_namespace,
        tx_prefix=statepact_redis_namespace,
        pool_size=REDIS_POOL_SIZE,
    )


@async_fixture
async def statepact_redis_client(
    statepact_redis_settings: RedisStoreSettings,
) -> AsyncIterator[Redis]:
    """``create_client(statepact_redis_settings)``, closed after the test."""
    from statepact.storage.redis import create_client

    client = create_client(statepact_redis_settings)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def statepact_redis_state_store(
    statepact_redis_client: Redis,
    statepact_clock: ManualClock,
    statepact_redis_settings: RedisStoreSettings,
) -> RedisStateStore:
    """A ``RedisStateStore`` under the test's namespace, on its clock."""
    from statepact.storage.redis import RedisStateStore

    return RedisStateStore(
        statepact_redis_client, clock=statepact_clock, settings=statepact_redis_settings
    )


@pytest.fixture
def statepact_redis_work_queue(
    statepact_redis_client: Redis,
    statepact_clock: ManualClock,
    statepact_redis_settings: RedisStoreSettings,
    statepact_queue_policy: QueuePolicy,
) -> RedisWorkQueue:
    """A ``RedisWorkQueue`` under the test's namespace, clock and ``statepact_queue_policy``."""
    from statepact.storage.redis import RedisWorkQueue

    return RedisWorkQueue(
        statepact_redis_client,
        clock=statepact_clock,
        settings=statepact_redis_settings,
        policy=statepact_queue_policy,
    )


@async_fixture
async def statepact_redis_backend(
    statepact_redis_client: Redis,
    statepact_redis_settings: RedisStoreSettings,
    statepact_clock: ManualClock,
) -> AsyncIterator[RedisBackend]:
    """A ``RedisBackend`` whose ``prefix`` is the test's namespace; closed after the test."""
    from statepact.storage.redis import RedisBackend

    backend = RedisBackend(
        statepact_redis_client, clock=statepact_clock, settings=statepact_redis_settings
    )
    try:
        yield backend
    finally:
        await backend.close()
