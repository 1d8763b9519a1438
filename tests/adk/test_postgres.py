"""The ADK session service on PostgreSQL: its tables come from Alembic only, each call is
one statement, and an append sent again after a lost reply is applied once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from google.adk.sessions.base_session_service import GetSessionConfig
from sqlalchemy import event as sa_event
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from statepact.clock import ManualClock
from statepact.errors import SchemaVersionError
from statepact.integrations.adk import StatepactSessionService
from statepact.settings import PostgresStoreSettings
from statepact.storage import Backing
from statepact.storage.postgres import migrate, open_backing
from tests.adk._contract import APP, USER, event, resend_an_append
from tests.fixtures.postgres import drop_tables_like

pytestmark = pytest.mark.integration


async def test_open_refuses_a_database_without_the_tables(
    empty_database_url: str, clock: ManualClock
) -> None:
    """A database at head whose ADK tables are gone (dropped by hand, or never created by
    an application's own migrations): the state store opens, the session service refuses,
    naming the fix, and creates nothing."""
    await migrate.upgrade(empty_database_url, "head")
    await drop_tables_like(empty_database_url, r"statepact\_adk\_%")
    engine = create_async_engine(empty_database_url)
    try:
        async with await open_backing(
            PostgresStoreSettings(), clock=clock, client=engine
        ) as backing:
            with pytest.raises(SchemaVersionError, match="alembic upgrade head"):
                await StatepactSessionService.open(backing)
            async with engine.connect() as conn:
                found = await conn.execute(
                    text("SELECT to_regclass('statepact_adk_sessions') IS NULL")
                )
                assert found.scalar() is True
    finally:
        await engine.dispose()


@pytest.fixture
def statements(pg_engine: AsyncEngine) -> Iterator[list[str]]:
    """Every statement sent on ``pg_engine`` (the engine ``postgres_backing`` is opened on)."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    sa_event.listen(pg_engine.sync_engine, "before_cursor_execute", record)
    yield seen
    sa_event.remove(pg_engine.sync_engine, "before_cursor_execute", record)


async def test_each_call_is_one_statement(
    postgres_backing: Backing[Any, Any, Any], statements: list[str]
) -> None:
    """create, append (with every scope and usage), get (with both filters) and a page are
    one statement each, in its own implicit transaction: no BEGIN, no COMMIT."""
    service = await StatepactSessionService.open(postgres_backing)
    calls: dict[str, int] = {}

    async def count(name: str, call: Any) -> Any:
        before = len(statements)
        result = await call
        calls[name] = len(statements) - before
        return result

    session = await count(
        "create", service.create_session(app_name=APP, user_id=USER, state={"app:a": 1})
    )
    await count(
        "append",
        service.append_event(session, event({"k": 1, "app:a": 2, "user:u": 3}, usage=(4, 5))),
    )
    config = GetSessionConfig(num_recent_events=5, after_timestamp=1.0)
    await count(
        "get",
        service.get_session(app_name=APP, user_id=USER, session_id=session.id, config=config),
    )
    await count("page", service.list_sessions_page(app_name=APP))
    await count("user_state", service.get_user_state(app_name=APP, user_id=USER))
    await count("usage", service.usage(app_name=APP, user_id=USER))
    assert calls == {"create": 1, "append": 1, "get": 1, "page": 1, "user_state": 1, "usage": 1}
    assert not [s for s in statements if s.strip().upper() in ("BEGIN", "COMMIT")]


async def test_an_append_sent_again_is_applied_once(
    postgres_backing: Backing[Any, Any, Any], clock: ManualClock
) -> None:
    """The same append (its call id) sent twice answers the version it made both times and
    stores one event, counted once."""
    await resend_an_append(postgres_backing, clock)
