"""A queue worker process for ``test_queue_crash.py``: drains a real queue until it is empty.

Run as ``python -m tests.integration._queue_worker '<spec JSON>'``. It opens its
own client (Redis) or engine (PostgreSQL) from the URL in the spec, with
``SystemClock``, and loops: ``reap`` (so leases of killed workers come back),
``claim`` with a short lease, a short sleep standing in for the work (so a
SIGKILL usually lands while it holds a lease), then ``ack``. Around each step
it appends one line to its own log file and fsyncs it, so the test can read,
after any SIGKILL, what this process did::

    claim <tenant> <item_id> <token>    the claim returned this lease
    ack <tenant> <item_id> <token>      about to ack (written BEFORE the call)
    acked <tenant> <item_id> <token>    the ack returned (written AFTER it)
    lost <tenant> <item_id> <token>     the ack raised LeaseLostError

It exits 0 on its own once a claim finds nothing and ``stats()`` shows nothing
queued or leased (the test enqueues everything before any worker starts, so an
empty queue stays empty), printing a JSON ``done`` event with its counts.

This module must never settle an item any other way than ``ack`` and never
swallow an error other than ``LeaseLostError``: anything unexpected ends the
process non-zero so the test sees it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from statepact.clock import SystemClock
from statepact.errors import LeaseLostError
from statepact.queue import BaseWorkQueue, QueuePolicy
from tests._processes import say

IDLE_WAIT = 0.1  # seconds between polls while other workers' leases run out


class Log:
    """An append-only log file, every line written and fsynced before the call goes on."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, kind: str, tenant: str, item_id: str, token: int) -> None:
        os.write(self._fd, f"{kind} {tenant} {item_id} {token}\n".encode())
        os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


async def open_queue(spec: dict[str, Any]) -> tuple[BaseWorkQueue, Any]:
    """The queue this worker drains, and what to close afterwards."""
    policy = QueuePolicy(**spec["policy"])
    if spec["kind"] == "redis":
        from redis.asyncio import Redis

        from statepact.storage.redis import RedisStoreSettings, RedisWorkQueue

        client = Redis.from_url(spec["url"])
        # durable=False: the test server may keep nothing on disk; eviction is still checked.
        settings = RedisStoreSettings(
            namespace=spec["namespace"], queue_name=spec["queue"], durable=False
        )
        queue: BaseWorkQueue = await RedisWorkQueue.open(
            client, clock=SystemClock(), settings=settings, policy=policy
        )
        return queue, client.aclose
    from statepact.storage.postgres import (
        PostgresStoreSettings,
        PostgresWorkQueue,
        create_engine,
    )

    # A worker has one call in flight at a time: two connections are plenty.
    settings_pg = PostgresStoreSettings(
        dsn=spec["url"], queue_name=spec["queue"], pool_size=spec.get("pool_size", 2)
    )
    engine = create_engine(settings_pg)
    queue = await PostgresWorkQueue.open(
        engine, clock=SystemClock(), settings=settings_pg, policy=policy
    )
    return queue, engine.dispose


async def drain(queue: BaseWorkQueue, log: Log, spec: dict[str, Any]) -> dict[str, int]:
    worker_id = spec["worker_id"]
    counts = {"claimed": 0, "acked": 0, "lost": 0, "reaped": 0}
    while True:
        counts["reaped"] += len(await queue.reap())
        lease = await queue.claim(worker_id, lease_for=spec["lease"])
        if lease is None:
            stats = await queue.stats()
            if stats.queued == 0 and stats.leased == 0:
                return counts
            await asyncio.sleep(IDLE_WAIT)
            continue
        item = lease.item
        counts["claimed"] += 1
        log.write("claim", item.tenant, item.item_id, lease.token)
        await asyncio.sleep(spec["work"])
        log.write("ack", item.tenant, item.item_id, lease.token)
        try:
            await queue.ack(lease)
        except LeaseLostError:
            # Legal when this process was too slow: its lease lapsed and another took the item.
            counts["lost"] += 1
            log.write("lost", item.tenant, item.item_id, lease.token)
            continue
        counts["acked"] += 1
        log.write("acked", item.tenant, item.item_id, lease.token)


async def main(spec: dict[str, Any]) -> None:
    queue, close = await open_queue(spec)
    log = Log(spec["log"])
    try:
        say(event="ready")
        counts = await drain(queue, log, spec)
        say(event="done", **counts)
    finally:
        log.close()
        await close()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
