"""A process that watches a Redis queue's control notices, for ``test_redis_queue_lifecycle.py``.

Run as ``python -m tests.integration._redis_control_watch '<spec JSON>'`` with
``url``, ``namespace`` and ``queue``. It opens its own client, enters
``queue.watch(on_cancel=...)``, prints ``{"event": "ready"}``, then one
``{"event": "cancel", "tenant", "item_id", "token", "at"}`` line per notice
(``at``: ``time.time()`` when the callback ran), and on a line ``paused`` on
stdin prints ``{"event": "paused", "paused": <queue.paused()>}``. It exits when
stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from redis.asyncio import Redis

from statepact.clock import SystemClock
from statepact.storage.redis import RedisStoreSettings, RedisWorkQueue
from tests._processes import say


def _heard(tenant: str, item_id: str, token: int) -> None:
    say(event="cancel", tenant=tenant, item_id=item_id, token=token, at=time.time())


async def main(spec: dict[str, Any]) -> None:
    client = Redis.from_url(spec["url"])
    settings = RedisStoreSettings(
        namespace=spec["namespace"], queue_name=spec["queue"], durable=False
    )
    queue = RedisWorkQueue(client, clock=SystemClock(), settings=settings)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        async with queue.watch(on_cancel=_heard):
            say(event="ready")
            while line := await reader.readline():
                if line.strip() == b"paused":
                    say(event="paused", paused=await queue.paused())
    finally:
        await client.aclose()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
