"""Runs ``WorkQueueConformance`` against every backing, through the shipped wiring.

The classes are ``statepact.testing.conformance``'s, exactly as a user's test
module would use them: memory, Redis under a namespace per test, PostgreSQL on
a database cloned per test. The server-backed ones are marked ``integration``
by the plugin at collection (their fixtures reach its servers).
"""

from __future__ import annotations

from statepact.testing.conformance import (
    MemoryWorkQueueConformance,
    PostgresWorkQueueConformance,
    RedisWorkQueueConformance,
)


class TestWorkQueueOnMemory(MemoryWorkQueueConformance):
    pass


class TestWorkQueueOnRedis(RedisWorkQueueConformance):
    pass


class TestWorkQueueOnPostgres(PostgresWorkQueueConformance):
    pass
