"""RedisWorkQueue against real servers: concurrency, the claim script, retries, claim cost.

The behaviour shared with every backing is the conformance suite's
(``tests/conformance``); this module checks what only Redis shows.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest
from redis.asyncio import Redis

from statepact._retry import new_op_id
from statepact.clock import ManualClock, to_micros
from statepact.errors import LeaseLostError, StatePersistenceError
from statepact.models import ItemStatus, Lease, WorkItem
from statepact.queue import QueuePolicy
from statepact.storage.redis import RedisStoreSettings, RedisWorkQueue
from statepact.storage.redis import queue as queue_module
from statepact.storage.redis._keys import QueueKeys, parse_ref, ref
from tests.fixtures.redis import ObservedRedis

pytestmark = pytest.mark.integration

LEASE = 30.0


async def _claim_script(queue: RedisWorkQueue, *, limit: int = 1, op: str | None = None) -> list:
    """Run the claim script as ``claim_batch`` sends it; the ``[R, token, ...]`` it answered."""
    now = queue.clock.now()
    reply = await queue._run(
        "claim",
        "claim",
        now,
        to_micros(now + timedelta(seconds=LEASE)),
        limit,
        queue_module._STEP,
        op=op or new_op_id(),
    )
    assert int(reply[0]) == 0
    answered = []
    for i in range(1, len(reply), 3):
        answered += [reply[i].decode(), reply[i + 1].decode()]
        record = dict(zip(reply[i + 2][::2], reply[i + 2][1::2], strict=True))
        # The script wrote the record it answers: leased under this very token.
        assert (record[b"status"], record[b"ctok"]) == (b"leased", reply[i + 1])
    return answered


async def test_ten_workers_on_ten_connections_take_ten_different_items(
    statepact_redis_url: str, redis_client: Redis, clock: ManualClock
) -> None:
    """Ten workers, each with its own connection, claiming at once take ten different items."""
    feeder = RedisWorkQueue(redis_client, clock=clock)
    for i in range(25):
        await feeder.enqueue(WorkItem(tenant=f"t{i % 3}", item_id=f"i{i}"))
    clients = [Redis.from_url(statepact_redis_url) for _ in range(10)]
    try:
        workers = [RedisWorkQueue(client, clock=clock) for client in clients]
        leases = await asyncio.gather(
            *(queue.claim(f"w{n}", lease_for=LEASE) for n, queue in enumerate(workers))
        )
        assert all(lease is not None for lease in leases)
        taken = [(lease.item.tenant, lease.item.item_id) for lease in leases if lease]
        assert len(set(taken)) == 10
        assert len({lease.token for lease in leases if lease}) == 10
        # Then batches from all ten at once take the other fifteen, each exactly once.
        batches = await asyncio.gather(
            *(
                queue.claim_batch(f"w{n}", lease_for=LEASE, limit=3)
                for n, queue in enumerate(workers)
            )
        )
    finally:
        for client in clients:
            await client.aclose()
    rest = [(lease.item.tenant, lease.item.item_id) for batch in batches for lease in batch]
    assert len(rest) == 15
    assert set(rest).isdisjoint(taken)
    assert len(set(rest)) == 15
    stats = await feeder.stats()
    assert (stats.queued, stats.leased) == (0, 25)


async def test_a_claim_left_half_written_by_the_two_script_layout_is_finished_by_reap(
    redis_client: Redis, clock: ManualClock
) -> None:
    """An earlier layout leased an item in one script and wrote its record in a second; a
    claimer that died in between left the item pending. Reap still writes such a record."""
    queue = RedisWorkQueue(redis_client, clock=clock, policy=QueuePolicy(max_attempts=3))
    await queue.enqueue(WorkItem(tenant="t", item_id="job"))
    claimed_at = clock.now()
    r, token = await _claim_script(queue)
    assert parse_ref(r) == ("t", "job")
    # What the first script of the old claim left: leased in the sets, the record as queued.
    keys = QueueKeys(queue.settings.namespace, queue.name)
    item_key = keys.item("t", "job")
    await redis_client.hset(item_key, mapping={"status": "queued", "attempts": 0, "ctok": ""})
    await redis_client.zadd(keys.pending, {r: to_micros(claimed_at)})

    half = await queue.get_item("t", "job")
    assert half is not None
    assert (half.status, half.attempts) == (ItemStatus.QUEUED, 0)
    assert await queue.claim("other", lease_for=LEASE) is None  # nobody else gets it

    clock.advance(5)
    assert await queue.reap() == []  # corrected, not moved: its lease has not lapsed
    fixed = await queue.get_item("t", "job")
    assert fixed is not None
    assert (fixed.status, fixed.attempts) == (ItemStatus.LEASED, 1)
    assert fixed.updated_at == claimed_at
    assert await redis_client.zcard(keys.pending) == 0

    clock.advance(LEASE)
    moved = await queue.reap()
    assert [(m.item_id, m.status, m.attempts, m.last_error) for m in moved] == [
        ("job", ItemStatus.QUEUED, 1, "lease expired")
    ]
    lease = await queue.claim("w", lease_for=LEASE)
    assert lease is not None
    assert lease.item.attempts == 2
    assert lease.token > int(token)


async def test_a_claim_is_one_script_that_writes_the_records(
    redis_client: Redis, clock: ManualClock
) -> None:
    """claim_batch is one EVALSHA: the leases' records say leased, attempt counted, at once."""
    queue = RedisWorkQueue(redis_client, clock=clock)
    for i in range(3):
        await queue.enqueue(WorkItem(tenant=f"t{i}", item_id="job"))
    leases = await queue.claim_batch("w", lease_for=LEASE, limit=3)
    assert len(leases) == 3
    for lease in leases:
        assert (lease.item.status, lease.item.attempts) == (ItemStatus.LEASED, 1)
        stored = await queue.get_item(lease.item.tenant, "job")
        assert stored == lease.item
    keys = QueueKeys(queue.settings.namespace, queue.name)
    assert await redis_client.zcard(keys.pending) == 0


async def test_a_claim_retried_after_a_lost_reply_claims_nothing_more(
    redis_client: Redis, clock: ManualClock
) -> None:
    """The claim script sent twice with one call id returns the same leases the second time."""
    queue = RedisWorkQueue(redis_client, clock=clock)
    for i in range(4):
        await queue.enqueue(WorkItem(tenant="t", item_id=f"i{i}"))
    op = new_op_id()
    first = await _claim_script(queue, limit=2, op=op)
    again = await _claim_script(queue, limit=2, op=op)
    assert first == again
    assert len(first) == 4
    stats = await queue.stats()
    assert (stats.queued, stats.leased) == (2, 2)


async def test_a_settle_retried_after_a_lost_reply_is_not_a_lost_lease(
    redis_client: Redis, clock: ManualClock
) -> None:
    """fail sent twice with one call id succeeds twice, even after the item moved on; another
    settle of that lease is refused."""
    queue = RedisWorkQueue(redis_client, clock=clock)
    await queue.enqueue(WorkItem(tenant="t", item_id="job"))
    lease = await queue.claim("w", lease_for=LEASE)
    assert lease is not None
    op = new_op_id()
    args = (ref("t", "job"), lease.token, "queued", to_micros(clock.now()), "1", "boom", 0, 20)
    first = await queue._run("fail", "settle", clock.now(), *args, op=op)
    assert int(first[0]) == 1
    # Meanwhile the item is claimed again by someone else.
    other = await queue.claim("v", lease_for=LEASE)
    assert other is not None
    again = await queue._run("fail", "settle", clock.now(), *args, op=op)
    assert int(again[0]) == 1
    with pytest.raises(LeaseLostError):
        await queue.ack(lease)
    assert (await queue.ack(other)).status is ItemStatus.DONE
    assert (await queue.stats()).tenants == {}


async def test_a_heartbeat_retried_after_a_lost_reply_returns_its_own_token(
    redis_client: Redis, clock: ManualClock
) -> None:
    """heartbeat sent twice with one call id gives the same new token both times."""
    queue = RedisWorkQueue(redis_client, clock=clock)
    await queue.enqueue(WorkItem(tenant="t", item_id="job"))
    lease = await queue.claim("w", lease_for=LEASE)
    assert lease is not None
    op = new_op_id()
    expires = to_micros(clock.now() + timedelta(seconds=LEASE))
    job = ref("t", "job")
    first = await queue._run("hb", "heartbeat", clock.now(), job, lease.token, expires, op=op)
    again = await queue._run("hb", "heartbeat", clock.now(), job, lease.token, expires, op=op)
    assert int(first[1]) == int(again[1]) > lease.token
    renewed = Lease(
        item=lease.item,
        worker_id="w",
        token=int(first[1]),
        expires_at=lease.expires_at,
        lease_seconds=LEASE,
    )
    assert (await queue.ack(renewed)).status is ItemStatus.DONE


async def test_many_items_coming_due_at_once_still_go_by_priority(
    redis_client: Redis, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More delayed items coming due than one script promotes: the claim still sees them all."""
    monkeypatch.setattr(queue_module, "_STEP", 4)
    queue = RedisWorkQueue(redis_client, clock=clock)
    for i in range(10):
        await queue.enqueue(WorkItem(tenant="t", item_id=f"low{i}"), delay=5)
    await queue.enqueue(WorkItem(tenant="t", item_id="urgent", priority=9), delay=5)
    clock.advance(5)
    lease = await queue.claim("w", lease_for=LEASE)
    assert lease is not None
    assert lease.item.item_id == "urgent"
    rest = await queue.claim_batch("w", lease_for=LEASE, limit=20)
    assert [lease.item.item_id for lease in rest] == [f"low{i}" for i in range(10)]


async def test_reap_moves_more_leases_than_one_script_handles(
    redis_client: Redis, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reap keeps calling until every expired lease has moved."""
    monkeypatch.setattr(queue_module, "_STEP", 3)
    queue = RedisWorkQueue(redis_client, clock=clock)
    for i in range(10):
        await queue.enqueue(WorkItem(tenant="t", item_id=f"i{i}"))
    assert len(await queue.claim_batch("w", lease_for=LEASE, limit=10)) == 10
    clock.advance(LEASE)
    moved = await queue.reap()
    assert sorted(item.item_id for item in moved) == sorted(f"i{i}" for i in range(10))
    assert (await queue.stats()).queued == 10


async def _commands_for_one_claim(observed: ObservedRedis, queue: RedisWorkQueue) -> list[str]:
    await observed.reset()
    lease = await queue.claim("w", lease_for=LEASE)
    assert lease is not None
    assert lease.item.tenant == "busy"
    return await observed.script_commands()


async def test_claim_cost_does_not_grow_with_backlog_or_idle_tenants(
    observed_redis: ObservedRedis,
) -> None:
    """A claim runs the same commands with 3 items queued as with thousands and idle tenants."""
    clock = ManualClock()
    queue = RedisWorkQueue(observed_redis.client, clock=clock)
    for i in range(3):
        await queue.enqueue(WorkItem(tenant="busy", item_id=f"i{i}"))
    await queue.claim("warm", lease_for=LEASE)
    small = await _commands_for_one_claim(observed_redis, queue)

    for i in range(3, 1500):
        await queue.enqueue(WorkItem(tenant="busy", item_id=f"i{i}", priority=i % 7))
    for i in range(500):
        await queue.enqueue(WorkItem(tenant="busy", item_id=f"later{i}"), delay=3600)
    # Two hundred tenants that were served once and are idle now.
    for i in range(200):
        await queue.enqueue(WorkItem(tenant=f"idle{i:03}", item_id="only"))
    for _ in range(200):
        lease = await queue.claim("w", lease_for=LEASE)
        assert lease is not None
        await queue.ack(lease)
    large = await _commands_for_one_claim(observed_redis, queue)
    assert large == small
    assert len(small) < 25


async def test_each_queue_call_is_one_round_trip(
    observed_redis: ObservedRedis,
) -> None:
    """Every queue call is one EVALSHA (get_item one HMGET of the record's fields, never
    its error history), a claim included."""
    clock = ManualClock()
    queue = RedisWorkQueue(
        observed_redis.client,
        clock=clock,
        policy=QueuePolicy(max_attempts=1),
        settings=RedisStoreSettings(max_value_bytes=64),
    )
    # Warm up every script once (loading it costs a SCRIPT LOAD).
    await queue.enqueue(WorkItem(tenant="t", item_id="w1"))
    lease = await queue.claim("w", lease_for=LEASE)
    assert lease is not None
    lease = await queue.heartbeat(lease)
    await queue.fail(lease, "boom")
    await queue.requeue(WorkItem(tenant="t", item_id="w1"))
    lease = await queue.claim("w", lease_for=LEASE)
    assert lease is not None
    await queue.ack(lease)
    await queue.reap()
    await queue.dead_letters("t")
    await queue.stats()

    async def trips(call: object) -> list[str]:
        await observed_redis.reset()
        await call  # type: ignore[misc]
        return await observed_redis.round_trips()

    assert await trips(queue.enqueue(WorkItem(tenant="t", item_id="a"))) == ["EVALSHA"]
    assert await trips(queue.claim("w", lease_for=LEASE)) == ["EVALSHA"]
    assert await trips(queue.claim("w", lease_for=LEASE)) == ["EVALSHA"]  # nothing due
    await queue.enqueue(WorkItem(tenant="t", item_id="b"))
    lease = await queue.claim("w", lease_for=LEASE)
    assert lease is not None
    await observed_redis.reset()
    lease = await queue.heartbeat(lease)
    assert await observed_redis.round_trips() == ["EVALSHA"]
    assert await trips(queue.release(lease)) == ["EVALSHA"]
    assert await trips(queue.get_item("t", "b")) == ["HMGET"]
    assert await trips(queue.error_history("t", "b")) == ["HMGET"]
    assert await trips(queue.reap()) == ["EVALSHA"]
    assert await trips(queue.dead_letters("t")) == ["EVALSHA"]
    assert await trips(queue.stats()) == ["EVALSHA"]
    await observed_redis.reset()
    with pytest.raises(StatePersistenceError) as caught:
        await queue.enqueue(WorkItem(tenant="t", item_id="big", payload={"x": "y" * 100}))
    assert caught.value.reason == "too_large"
    assert await observed_redis.round_trips() == []
    assert await queue.get_item("t", "big") is None


async def test_purge_dead_is_one_script_call_per_thousand_items(
    observed_redis: ObservedRedis,
) -> None:
    """purge_dead runs one EVALSHA per 1,000 dead items (plus the one that finds fewer), so
    a huge dead letter never holds the server for more than one batch of deletes."""
    queue = RedisWorkQueue(
        observed_redis.client, clock=ManualClock(), policy=QueuePolicy(max_attempts=1)
    )
    await queue.enqueue_many([WorkItem(tenant="t", item_id=f"i{n:05d}") for n in range(2500)])
    for _ in range(3):
        for lease in await queue.claim_batch("w", lease_for=LEASE, limit=1000):
            await queue.fail(lease, "poison", retryable=False)
    await queue.purge_dead("nobody")  # loads the script
    await observed_redis.reset()
    assert await queue.purge_dead("t") == 2500
    assert await observed_redis.round_trips() == ["EVALSHA"] * 3
    await observed_redis.reset()
    assert await queue.purge_dead("t") == 0
    assert await observed_redis.round_trips() == ["EVALSHA"]
    assert (await queue.stats()).tenants == {}
    assert await observed_redis.client.keys("*item:*") == []


async def test_a_client_that_decodes_responses_works(
    statepact_redis_url: str, redis_client: Redis, clock: ManualClock
) -> None:
    """A client built with decode_responses=True runs the whole item life cycle."""
    client = Redis.from_url(statepact_redis_url, decode_responses=True)
    try:
        queue = RedisWorkQueue(client, clock=clock, policy=QueuePolicy(max_attempts=1))
        stored = await queue.enqueue(WorkItem(tenant="té", item_id="ü", payload={"k": "v"}))
        assert await queue.get_item("té", "ü") == stored
        lease = await queue.claim("w", lease_for=LEASE)
        assert lease is not None
        dead = await queue.fail(lease, "kaputt")
        assert dead.status is ItemStatus.DEAD
        assert await queue.dead_letters("té") == [dead]
        assert (await queue.stats()).tenants["té"].dead == 1
    finally:
        await client.aclose()


async def test_queues_by_name_and_namespace_are_apart(
    redis_client: Redis, clock: ManualClock
) -> None:
    """Two queue names, or two namespaces, on one database share nothing."""
    one = RedisWorkQueue(redis_client, clock=clock, settings=RedisStoreSettings(queue_name="a"))
    two = RedisWorkQueue(redis_client, clock=clock, settings=RedisStoreSettings(queue_name="b"))
    three = RedisWorkQueue(redis_client, clock=clock, settings=RedisStoreSettings(namespace="x"))
    stored = await one.enqueue(WorkItem(tenant="t", item_id="i"))
    assert stored.queue == "a"
    assert await two.claim("w", lease_for=LEASE) is None
    assert await three.claim("w", lease_for=LEASE) is None
    lease = await one.claim("w", lease_for=LEASE)
    assert lease is not None
    with pytest.raises(LeaseLostError):
        await two.ack(lease)
    keys = {key async for key in redis_client.scan_iter(match="*")}
    assert keys
    assert all(key.startswith(QueueKeys("adk", "a").prefix.encode()) for key in keys)


class _TickingClock(ManualClock):
    """A manual clock that moves 1 ms forward at every reading: each enqueue has its own now."""

    def now(self) -> datetime:
        return self.advance(0.001)


async def test_concurrent_enqueues_share_round_trips_and_are_due_at_once(
    observed_redis: ObservedRedis,
) -> None:
    """Forty enqueues at once go in a few scripts (one alone, the others together), each
    caller gets its own item, and every item is ready: none waits in the delayed set because
    its batch was sent with another caller's earlier clock reading."""
    clock = _TickingClock()
    queue = RedisWorkQueue(observed_redis.client, clock=clock)
    await queue.enqueue(WorkItem(tenant="warm", item_id="w"))  # loads the scripts
    await observed_redis.reset()
    items = [WorkItem(tenant=f"t{n % 4}", item_id=f"i{n}", payload={"n": n}) for n in range(40)]
    stored = await asyncio.gather(*(queue.enqueue(item) for item in items))
    trips = await observed_redis.round_trips()
    assert 2 <= len(trips) < 10, trips
    assert [(item.tenant, item.item_id, item.payload) for item in stored] == [
        (item.tenant, item.item_id, item.payload) for item in items
    ]
    assert all(item.status is ItemStatus.QUEUED for item in stored)
    for item in stored:
        assert await queue.get_item(item.tenant, item.item_id) == item
    keys = QueueKeys(queue.settings.namespace, queue.name)
    assert await observed_redis.client.zcard(keys.delayed) == 0
    assert await queue.next_due() is None
    leases = await queue.claim_batch("w", lease_for=LEASE, limit=100)
    assert len(leases) == 41
