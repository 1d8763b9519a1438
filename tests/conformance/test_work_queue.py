"""Runs ``WorkQueueConformance`` against every backing, through the shipped wiring.

The classes are ``statepact.testing.conformance``'s, exactly as a user's test
module would use them: memory, Redis under a namespace per test, PostgreSQL on
a database cloned per test. The server-backed ones are marked ``integration``
by the plugin at collection (their fixtures reach its servers).
"""

from __future__ import annotations

import pytest

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
    @pytest.fixture(autouse=True)
    def _flow_control_not_enforced_yet(self, request: pytest.FixtureRequest) -> None:
        """PostgreSQL stores limit keys and weights but does not enforce QueueLimits
        yet (issue 35): it refuses a non-empty set_limits, a known divergence."""
        if request.node.name.startswith("test_flow_"):
            request.applymarker(
                pytest.mark.xfail(
                    raises=NotImplementedError,
                    strict=True,
                    reason="QueueLimits not enforced on PostgreSQL yet (issue 35)",
                )
            )
