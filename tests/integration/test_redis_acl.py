"""An ACL user on Redis: the rules docs/operations.md lists are enough, and a refusal is clear.

Each test starts its own durable ``redis-server`` (ACL users are the server's) and
connects as a user made for it: with the documented rules, every store and a
worker run; with keys that miss the queue's, or without ``INFO`` (the preflight's
read where ``CONFIG`` is refused), the call is a ``PreflightError`` quoting Redis's
``NOPERM`` reply, not a retryable unavailability, and nothing is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from statepact import QueuePolicy, RedisStoreSettings, RunRecord, WorkItem
from statepact.errors import PreflightError
from statepact.storage.redis import open_backing
from statepact.testing.plugin import RedisServerFactory
from statepact.worker import Job, Worker

pytestmark = pytest.mark.integration

#: What docs/operations.md ("Redis ACL users") tells an operator to allow, for the
#: default ``namespace`` (adk) and ``tx_prefix`` (statepact).
COMMANDS = ["+@all", "-@dangerous", "+info"]
KEYS = ["adk:*", "{adk:*", "{statepact}:*"]
#: The queue's control channel (a cancel of a leased item publishes on it).
CHANNELS = ["{adk:queue}:*"]


@pytest.fixture
async def server(
    statepact_redis_server_factory: RedisServerFactory,
) -> AsyncIterator[tuple[Redis, int]]:
    """A durable server of the test's own and an admin client on it."""
    started = statepact_redis_server_factory(["--appendonly", "yes"])
    admin = Redis.from_url(started.url)
    try:
        yield admin, started.port
    finally:
        await admin.aclose()


async def _user(
    server: tuple[Redis, int],
    *,
    commands: list[str],
    keys: list[str],
    channels: list[str] = CHANNELS,
) -> str:
    admin, port = server
    await admin.acl_setuser(
        "app",
        enabled=True,
        passwords=["+app-secret"],
        commands=commands,
        keys=keys,
        channels=channels,
    )
    return f"redis://app:app-secret@127.0.0.1:{port}/0"


async def test_the_documented_rules_run_every_store_and_a_worker(
    server: tuple[Redis, int],
) -> None:
    url = await _user(server, commands=COMMANDS, keys=KEYS)
    backing = await open_backing(RedisStoreSettings(dsn=url), policy=QueuePolicy())
    async with backing:
        await backing.state.put_run(RunRecord(tenant="acme", run_id="r1"))
        run = await backing.state.patch_run("acme", "r1", input_tokens=5)
        assert run.input_tokens == 5

        queue = backing.queue
        await queue.enqueue_many([WorkItem(tenant="acme", item_id=i) for i in ("x-2", "x-1")])
        await queue.enqueue(WorkItem(tenant="beta", item_id="b1"))
        leases = await queue.claim_batch("w1", lease_for=30, limit=3)
        assert [lease.item.item_id for lease in leases] == ["x-2", "b1", "x-1"]
        await queue.heartbeat(leases[0])
        assert all(isinstance(item, WorkItem) for item in await queue.ack_many(leases[1:]))
        assert await queue.reap() == []
        assert (await queue.stats()).leased == 1

        async with backing.manager.transaction() as tx:
            tx.write("agents", "a1", {"n": 1})
        async with backing.manager.transaction() as tx:
            await tx.lock("agents", "a1")
            assert await tx.read("agents", "a1") == {"n": 1}

        handled = asyncio.Event()

        async def handler(job: Job) -> None:
            handled.set()

        worker = Worker(queue, default=handler, concurrency=2, lease_for=30, poll_interval=5)
        await worker.start()
        try:
            await queue.enqueue(WorkItem(tenant="acme", item_id="late"))
            await asyncio.wait_for(handled.wait(), 3)  # woken, not polled
        finally:
            await worker.stop()


async def test_keys_outside_the_rules_are_refused_naming_the_acl_and_nothing_is_written(
    server: tuple[Redis, int],
) -> None:
    url = await _user(server, commands=COMMANDS, keys=["adk:*", "{statepact}:*"])
    backing = await open_backing(RedisStoreSettings(dsn=url), policy=QueuePolicy())
    async with backing:
        with pytest.raises(PreflightError) as caught:
            await backing.queue.enqueue_many([WorkItem(tenant="acme", item_id="i1")])
        await backing.state.put_run(RunRecord(tenant="acme", run_id="r1"))  # adk:* is allowed
    assert caught.value.retryable is False
    assert "no permissions to access one of the keys" in str(caught.value)
    assert "docs/operations.md#redis-acl-users" in str(caught.value)
    assert "app-secret" not in str(caught.value)
    admin, _ = server
    assert await admin.keys("{adk:queue}*") == []


async def test_a_user_that_may_read_neither_config_nor_info_is_refused_at_open(
    server: tuple[Redis, int],
) -> None:
    url = await _user(server, commands=["+@all", "-@dangerous"], keys=KEYS)
    with pytest.raises(PreflightError, match="no permissions to run the 'info' command"):
        await open_backing(RedisStoreSettings(dsn=url), policy=QueuePolicy())
