"""The conformance suites wired to the plugin's fixtures: subclass one and they run.

Each class here is a suite (``StateStoreConformance``, ``WorkQueueConformance``,
``TransactionConformance``) whose backing fixture is already provided, from
the plugin's per-test fixtures (:mod:`statepact.testing.fixtures`):

=====================================  ==============================================
class                                  runs on
=====================================  ==============================================
``PostgresStateStoreConformance``      ``statepact_postgres_state_store``
``PostgresWorkQueueConformance``       ``statepact_postgres_work_queue``
``PostgresTransactionConformance``     ``statepact_postgres_backend``
``RedisStateStoreConformance``         ``statepact_redis_state_store``
``RedisWorkQueueConformance``          ``statepact_redis_work_queue``
``RedisTransactionConformance``        ``statepact_redis_backend``
``Memory...Conformance`` (three)       ``statepact_memory_*``
=====================================  ==============================================

PostgreSQL runs on a database cloned per test from the session's template (the
application's ``pytest_statepact_postgres_template`` hook included), Redis under
a namespace per test, both on the servers of ``statepact_postgres_url`` and
``statepact_redis_url``. In a test module::

    from statepact.testing.conformance import PostgresWorkQueueConformance

    class TestQueueOnOurPostgres(PostgresWorkQueueConformance):
        pass

The names do not start with ``Test``, so importing them collects nothing by
itself. This module imports no driver.
"""

from __future__ import annotations

import pytest

from statepact.queue import WorkQueue
from statepact.state import StateStore
from statepact.testing.queue_suite import WorkQueueConformance
from statepact.testing.state_suite import StateStoreConformance
from statepact.testing.tx_suite import TransactionConformance
from statepact.tx import StorageBackend

__all__ = [
    "MemoryStateStoreConformance",
    "MemoryTransactionConformance",
    "MemoryWorkQueueConformance",
    "PostgresStateStoreConformance",
    "PostgresTransactionConformance",
    "PostgresWorkQueueConformance",
    "RedisStateStoreConformance",
    "RedisTransactionConformance",
    "RedisWorkQueueConformance",
]


class MemoryStateStoreConformance(StateStoreConformance):
    """``StateStoreConformance`` on ``statepact_memory_state_store``."""

    @pytest.fixture
    def state_store(self, statepact_memory_state_store: StateStore) -> StateStore:
        return statepact_memory_state_store


class MemoryWorkQueueConformance(WorkQueueConformance):
    """``WorkQueueConformance`` on ``statepact_memory_work_queue``."""

    @pytest.fixture
    def work_queue(self, statepact_memory_work_queue: WorkQueue) -> WorkQueue:
        return statepact_memory_work_queue


class MemoryTransactionConformance(TransactionConformance):
    """``TransactionConformance`` on ``statepact_memory_backend``."""

    @pytest.fixture
    def tx_backend(self, statepact_memory_backend: StorageBackend) -> StorageBackend:
        return statepact_memory_backend


class PostgresStateStoreConformance(StateStoreConformance):
    """``StateStoreConformance`` on ``statepact_postgres_state_store`` (a database per test)."""

    @pytest.fixture
    def state_store(self, statepact_postgres_state_store: StateStore) -> StateStore:
        return statepact_postgres_state_store


class PostgresWorkQueueConformance(WorkQueueConformance):
    """``WorkQueueConformance`` on ``statepact_postgres_work_queue`` (a database per test)."""

    @pytest.fixture
    def work_queue(self, statepact_postgres_work_queue: WorkQueue) -> WorkQueue:
        return statepact_postgres_work_queue

    @pytest.fixture
    def work_queue_peer(self, request: pytest.FixtureRequest) -> WorkQueue:
        """A second ``PostgresWorkQueue`` on the test's database, as another process holds."""
        from statepact.storage.postgres import PostgresWorkQueue

        return PostgresWorkQueue(
            request.getfixturevalue("statepact_postgres_engine"),
            clock=request.getfixturevalue("statepact_clock"),
            settings=request.getfixturevalue("statepact_postgres_settings"),
            policy=request.getfixturevalue("statepact_queue_policy"),
        )


class PostgresTransactionConformance(TransactionConformance):
    """``TransactionConformance`` on ``statepact_postgres_backend`` (a database per test)."""

    @pytest.fixture
    def tx_backend(self, statepact_postgres_backend: StorageBackend) -> StorageBackend:
        return statepact_postgres_backend


class RedisStateStoreConformance(StateStoreConformance):
    """``StateStoreConformance`` on ``statepact_redis_state_store`` (a namespace per test)."""

    @pytest.fixture
    def state_store(self, statepact_redis_state_store: StateStore) -> StateStore:
        return statepact_redis_state_store


class RedisWorkQueueConformance(WorkQueueConformance):
    """``WorkQueueConformance`` on ``statepact_redis_work_queue`` (a namespace per test)."""

    @pytest.fixture
    def work_queue(self, statepact_redis_work_queue: WorkQueue) -> WorkQueue:
        return statepact_redis_work_queue

    @pytest.fixture
    def work_queue_peer(self, request: pytest.FixtureRequest) -> WorkQueue:
        """A second ``RedisWorkQueue`` under the test's namespace, as another process holds."""
        from statepact.storage.redis import RedisWorkQueue

        return RedisWorkQueue(
            request.getfixturevalue("statepact_redis_client"),
            clock=request.getfixturevalue("statepact_clock"),
            settings=request.getfixturevalue("statepact_redis_settings"),
            policy=request.getfixturevalue("statepact_queue_policy"),
        )


class RedisTransactionConformance(TransactionConformance):
    """``TransactionConformance`` on ``statepact_redis_backend`` (a namespace per test)."""

    @pytest.fixture
    def tx_backend(self, statepact_redis_backend: StorageBackend) -> StorageBackend:
        return statepact_redis_backend
