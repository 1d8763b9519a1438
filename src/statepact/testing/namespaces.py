"""Per-test Redis namespaces: a fresh ``RedisStoreSettings.namespace`` and the sweep after it.

What the plugin's ``statepact_redis_namespace`` fixture runs, usable on its own:

- :func:`unique_namespace` gives ``statepact-test-<pid>-<random>``: no braces
  (``RedisStoreSettings`` refuses them), unique across sessions sharing a server;
- :func:`namespace_patterns` are the SCAN patterns of every key statepact puts
  under a namespace: the state store's (``<ns>:state:...``, slot per tenant),
  the work queue's (``{<ns>:queue}:...``, one slot) and a ``RedisBackend``
  built with ``prefix=<ns>`` (``{<ns>}:...``, one slot). They are read off the
  key codec, never written out here;
- :func:`clear_namespace` deletes exactly those keys, on a ``Redis`` or a
  ``RedisCluster`` client (redis-py's cluster client SCANs every primary and
  splits a multi-key ``UNLINK`` by slot).

Nothing outside the namespace is touched: unlike ``FLUSHDB``, tests of other
sessions on the same database keep their keys. This module imports redis-py;
the plugin imports it only when a test asks for a namespace.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from statepact.storage.redis import create_client
from statepact.storage.redis import namespace_patterns as _patterns

__all__ = ["clear_namespace", "clear_namespace_at", "namespace_patterns", "unique_namespace"]

_BATCH = 500


def unique_namespace() -> str:
    """``statepact-test-<pid>-<random>``: unique per process and call."""
    return f"statepact-test-{os.getpid()}-{uuid.uuid4().hex[:12]}"


def namespace_patterns(namespace: str) -> tuple[str, ...]:
    """SCAN ``MATCH`` patterns covering every key of ``namespace`` and no other namespace's,
    as the key codec gives them (``statepact.storage.redis.namespace_patterns``)."""
    return _patterns(namespace)


async def clear_namespace(redis: Any, namespace: str) -> int:
    """Delete every key under ``namespace``; return how many were deleted.

    ``redis`` is a ``redis.asyncio.Redis`` or ``RedisCluster``. It SCANs, so it
    is a test helper: keys written meanwhile may be missed.
    """
    deleted = 0
    for pattern in namespace_patterns(namespace):
        batch: list[Any] = []
        async for key in redis.scan_iter(match=pattern, count=_BATCH):
            batch.append(key)
            if len(batch) >= _BATCH:
                deleted += int(await redis.unlink(*batch))
                batch = []
        if batch:
            deleted += int(await redis.unlink(*batch))
    return deleted


async def clear_namespace_at(url: str, namespace: str) -> int:
    """:func:`clear_namespace` on a client of its own for ``url`` (one server), then closed."""
    from pydantic import SecretStr

    from statepact.settings import RedisStoreSettings

    client = create_client(RedisStoreSettings(dsn=SecretStr(url)))
    try:
        return await clear_namespace(client, namespace)
    finally:
        await client.aclose()
