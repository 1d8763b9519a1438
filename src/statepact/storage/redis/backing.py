"""``open_backing``: the Redis state store, work queue and transaction backend together."""

from __future__ import annotations

from typing import Any

from statepact.clock import Clock
from statepact.queue import QueuePolicy
from statepact.settings import RedisStoreSettings
from statepact.storage import Backing, assemble_backing
from statepact.storage.redis._client import create_client
from statepact.storage.redis.backend import RedisBackend
from statepact.storage.redis.queue import RedisWorkQueue
from statepact.storage.redis.state import RedisStateStore

__all__ = ["open_backing"]


async def open_backing(
    settings: RedisStoreSettings,
    *,
    clock: Clock | None = None,
    policy: QueuePolicy | None = None,
    client: Any = None,
) -> Backing[RedisStateStore, RedisWorkQueue, RedisBackend]:
    """A ``RedisStateStore``, a ``RedisWorkQueue`` (``policy``) and a ``RedisBackend``
    under a ``TransactionManager``, all on one client, ``clock`` (else one
    ``SystemClock``) and ``settings``, each through its ``open()`` (the preflight,
    with ``settings.durable``).

    The client is ``create_client(settings)``'s, closed with the backing, unless
    ``client`` (a ``redis.asyncio.Redis`` or ``RedisCluster`` you own) is given.
    Raises what ``create_client`` and ``open()`` raise (``ValueError``,
    ``PreflightError``, ``StatePersistenceError``), having closed its own client.
    """
    redis = create_client(settings) if client is None else client
    return await assemble_backing(
        state=lambda clock: RedisStateStore.open(redis, clock=clock, settings=settings),
        queue=lambda clock: RedisWorkQueue.open(
            redis, clock=clock, settings=settings, policy=policy
        ),
        backend=lambda clock: RedisBackend.open(redis, clock=clock, settings=settings),
        clock=clock,
        max_value_bytes=settings.max_value_bytes,
        client=redis,
        close_client=redis.aclose if client is None else None,
    )
