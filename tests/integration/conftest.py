"""Fixtures several integration modules share (the per-backing ones are in ``tests/fixtures``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from statepact.storage.postgres import _direct
from tests.fixtures.postgres import (
    create_database,
    drop_database,
    run_in_thread,
    unique_database_name,
)


@pytest.fixture
def statements(pg_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every SQL statement sent, in order: through SQLAlchemy on ``pg_engine`` (a bound
    store, one ``AsyncConnection``) and on the driver (the ``DirectExecutor`` a store or
    queue on an engine runs its statements with)."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    direct = _direct.Statements.execute

    async def execute(self: _direct.Statements, statement: Any, parameters: Any = None) -> Any:
        seen.append(statement.sql)
        return await direct(self, statement, parameters)

    monkeypatch.setattr(_direct.Statements, "execute", execute)
    event.listen(pg_engine.sync_engine, "before_cursor_execute", record)
    yield seen
    event.remove(pg_engine.sync_engine, "before_cursor_execute", record)


@pytest.fixture
def empty_database_url_sync(statepact_postgres_url: str) -> Iterator[str]:
    """A database with nothing in it, dropped after, for a synchronous test (one that runs the
    command line or Alembic, which start event loops of their own)."""
    name = unique_database_name("m")
    url = run_in_thread(lambda: create_database(statepact_postgres_url, name))
    try:
        yield url
    finally:
        run_in_thread(lambda: drop_database(statepact_postgres_url, name))
