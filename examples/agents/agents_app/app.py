"""The application's parts on one statepact backing: sessions, checkpoints, queue, worker.

``AgentsApp.open(backing)`` opens ADK's session service and LangGraph's
checkpoint saver on the backing (memory, Redis or PostgreSQL: the same code);
``app.worker()`` is a statepact ``Worker`` on the backing's queue that runs both
kinds of item. ``open_backing_for(url)`` opens the backing a URL names.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agents_app import research, support
from agents_app.model import CannedModel
from agents_app.research import Journal, ResearchGraph
from agents_app.support import SupportAgent
from statepact.integrations.adk import StatepactSessionService
from statepact.integrations.langgraph import StatepactCheckpointSaver
from statepact.storage import Backing
from statepact.worker import Worker

__all__ = ["AgentsApp", "open_backing_for", "until"]

POLL_SECONDS = 0.05


async def until(check: Callable[[], Awaitable[bool] | bool], *, poll: float = POLL_SECONDS) -> None:
    """Return once ``check()`` (a function or a coroutine function) is true, polling."""
    while True:
        outcome = check()
        if await outcome if inspect.isawaitable(outcome) else outcome:
            return
        await asyncio.sleep(poll)


async def open_backing_for(url: str, *, namespace: str | None = None) -> Backing[Any, Any, Any]:
    """The backing ``url`` names: ``memory``, ``redis://...`` or ``postgresql://...``
    (migrated first: ``statepact db upgrade``). ``namespace`` keys Redis apart."""
    if url == "memory":
        from statepact.settings import MemoryStoreSettings
        from statepact.storage.memory import open_backing as open_memory

        return await open_memory(MemoryStoreSettings())
    if url.startswith(("redis://", "rediss://")):
        from statepact.settings import RedisStoreSettings
        from statepact.storage.redis import open_backing as open_redis

        settings = RedisStoreSettings(dsn=url)
        if namespace is not None:
            settings = settings.replace(namespace=namespace)
        return await open_redis(settings)
    if url.startswith("postgresql"):
        from statepact.settings import PostgresStoreSettings
        from statepact.storage.postgres import open_backing as open_postgres

        return await open_postgres(PostgresStoreSettings(dsn=url))
    raise ValueError(f"url: expected memory, redis://... or postgresql://..., got {url!r}")


@dataclass
class AgentsApp:
    """The backing and what runs on it; ``model`` is the agent's (stand-in) model."""

    backing: Backing[Any, Any, Any]
    sessions: StatepactSessionService
    saver: StatepactCheckpointSaver
    model: CannedModel

    @classmethod
    async def open(
        cls, backing: Backing[Any, Any, Any], *, model: CannedModel | None = None
    ) -> AgentsApp:
        return cls(
            backing=backing,
            sessions=await StatepactSessionService.open(backing),
            saver=await StatepactCheckpointSaver.open(backing),
            model=model or CannedModel(),
        )

    def worker(
        self,
        *,
        journal: Journal | None = None,
        concurrency: int = 10,
        lease_for: float = 30.0,
        reap_every: float | None = None,
        grace_period: float = 30.0,
        worker_id: str | None = None,
    ) -> Worker:
        """A ``Worker`` on the backing's queue running support turns and research runs.

        A worker that dies mid-item leaves its lease to expire; any worker's reaper
        (every ``reap_every`` s, default ``lease_for``) hands the item to the next claim.
        """
        worker = Worker(
            self.backing.queue,
            concurrency=concurrency,
            lease_for=lease_for,
            reap_every=reap_every,
            grace_period=grace_period,
            worker_id=worker_id,
        )
        worker.add_task(
            support.TASK, SupportAgent(self.sessions, support.build_agent(self.model)).turn
        )
        worker.add_task(research.TASK, ResearchGraph(self.saver, journal).run)
        return worker

    async def idle(self) -> bool:
        """Whether the queue holds nothing queued (due now or later) or leased (a dead
        worker's lease counts until it is reaped)."""
        stats = await self.backing.queue.stats()
        return not (stats.queued or stats.leased)
