"""``SessionServiceContract`` on every backing, through the repository's fixtures.

Memory first (the reference), then Redis (its database flushed per test) and
PostgreSQL (a database cloned per test from the migrated template, so with the
tables of revision ``statepact_0006``).
"""

from __future__ import annotations

from typing import Any

import pytest

from statepact.storage import Backing
from tests.adk._contract import SessionServiceContract


class TestOnMemory(SessionServiceContract):
    @pytest.fixture
    def backing(self, memory_backing: Backing[Any, Any, Any]) -> Backing[Any, Any, Any]:
        return memory_backing


class TestOnRedis(SessionServiceContract):
    @pytest.fixture
    def backing(self, redis_backing: Backing[Any, Any, Any]) -> Backing[Any, Any, Any]:
        return redis_backing


class TestOnPostgres(SessionServiceContract):
    @pytest.fixture
    def backing(self, postgres_backing: Backing[Any, Any, Any]) -> Backing[Any, Any, Any]:
        return postgres_backing
