"""One engine for the whole app: the application's tables and statepact's share its pool.

``create_engine(settings)`` is statepact's factory: an ordinary SQLAlchemy
``AsyncEngine`` (asyncpg), sized by the settings, that sets a
``statement_timeout`` on connections that have none (``open()`` refuses a
connection without one). An engine the app builds itself works the same, given
a timeout (docs: Adopting statepact).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from orders_app.settings import store_settings
from statepact import QueuePolicy
from statepact.storage.postgres import PostgresStateStore, PostgresWorkQueue, create_engine

#: A failed item is tried again after 30 s, then 60 s, ... (capped at 10 minutes), and goes to
#: the dead letter after its fifth failure.
POLICY = QueuePolicy(max_attempts=5, backoff_base=30.0)


@dataclass(frozen=True)
class Services:
    """The engine, a session factory and statepact's stores on that engine."""

    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    state: PostgresStateStore
    queue: PostgresWorkQueue

    @classmethod
    async def open(cls) -> Services:
        """Connect; ``open()`` checks statepact's schema (run ``alembic upgrade head`` first)."""
        settings = store_settings()
        engine = create_engine(settings)
        try:
            state = await PostgresStateStore.open(engine, settings=settings)
            queue = await PostgresWorkQueue.open(engine, settings=settings, policy=POLICY)
        except BaseException:
            await engine.dispose()
            raise
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        return cls(engine=engine, sessions=sessions, state=state, queue=queue)

    async def close(self) -> None:
        await self.engine.dispose()


def run_id_for(order_id: int) -> str:
    """The statepact run (and work item) of an order."""
    return f"order-{order_id}"
