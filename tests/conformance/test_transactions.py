"""Runs ``TransactionConformance`` against every backing, through the shipped wiring.

The classes are ``statepact.testing.conformance``'s, exactly as a user's test
module would use them: memory, Redis under a namespace per test (the
``RedisBackend`` prefix), PostgreSQL on a database cloned per test. The
server-backed ones are marked ``integration`` by the plugin at collection.
"""

from __future__ import annotations

from statepact.testing.conformance import (
    MemoryTransactionConformance,
    PostgresTransactionConformance,
    RedisTransactionConformance,
)


class TestTransactionsOnMemory(MemoryTransactionConformance):
    pass


class TestTransactionsOnRedis(RedisTransactionConformance):
    pass


class TestTransactionsOnPostgres(PostgresTransactionConformance):
    pass
