"""RedisWorkQueue's lifecycle calls against real servers: what only Redis shows (issue 33).

The behaviour shared with every backing (cancel, release with a delay, pause,
unique keys, prune) is the conformance suite's; this module checks the Redis
specifics: prune runs in bounded scripts however many items finished (measured
by the server's own latency tracking), a cancel's control notice reaches a watching
process, and a pause is seen by another client.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from statepact.clock import ManualClock
from statepact.models import ItemStatus, WorkItem
from statepact.storage.redis import RedisStoreSettings, RedisWorkQueue
from statepact.storage.redis._keys import QueueKeys
from statepact.testing.plugin import RedisServerFactory
from tests._processes import Worker, reap_all, spawn

pytestmark = pytest.mark.integration

LEASE = 30.0
FINISHED = 50_000
CHUNK = 1000


async def _finish(queue: RedisWorkQueue, tenant: str, prefix: str, count: int) -> None:
    """Enqueue, claim and ack ``count`` items of ``tenant``, a thousand per script."""
    for start in range(0, count, CHUNK):
        await queue.enqueue_many(
            [
                WorkItem(tenant=tenant, item_id=f"{prefix}{n}", payload={"n": n})
                for n in range(start, min(start + CHUNK, count))
            ]
        )
        leases = await queue.claim_batch("filler", lease_for=LEASE, limit=CHUNK)
        await queue.ack_many(leases)


async def test_prune_deletes_fifty_thousand_finished_items_in_bounded_scripts(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """50k done items are pruned in scripts of at most PRUNE_BATCH items, each well under
    100 ms by the server's latency tracking; live work, young items and another pruner
    are spared."""
    server = statepact_redis_server_factory()
    client = Redis.from_url(server.url)
    clock = ManualClock()
    queue = RedisWorkQueue(
        client, clock=clock, settings=RedisStoreSettings(namespace="prune", durable=False)
    )
    try:
        await _finish(queue, "acme", "old", FINISHED)
        dead = await queue.enqueue(WorkItem(tenant="acme", item_id="dead"))
        lease = await queue.claim("w", lease_for=LEASE)
        assert lease is not None and lease.item.item_id == dead.item_id
        await queue.fail(lease, "boom", retryable=False)
        clock.advance(2 * 86_400)  # past keep_done (1 day), not past keep_dead (7 days)
        await _finish(queue, "acme", "young", 10)
        await queue.enqueue(WorkItem(tenant="acme", item_id="live"))
        stats_before = await _timed_stats(queue)

        # The server's own measure: the slowest EVALSHA (p100 of its latency tracking) and
        # how many ran, counted from a reset just before the prune.
        await client.config_set("latency-tracking-info-percentiles", "50 100")
        await client.config_resetstat()
        started = time.perf_counter()
        pruned, other = await asyncio.gather(queue.prune(), _second_pruner(queue))
        elapsed = time.perf_counter() - started
        latency = (await client.info("latencystats"))["latency_percentiles_usec_evalsha"]
        evalsha = (await client.info("commandstats"))["cmdstat_evalsha"]
        # A first call of each script on this server is refused NOSCRIPT, then loaded and sent.
        calls = evalsha["calls"] - evalsha["failed_calls"]
        slowest_ms, median_ms = latency["p100"] / 1000, latency["p50"] / 1000
        print(
            f"\nprune of {FINISHED} done items: {calls} scripts, slowest {slowest_ms:.2f} ms, "
            f"median {median_ms:.2f} ms (server time), whole prune {elapsed:.2f} s; "
            f"stats() {stats_before * 1000:.2f} ms"
        )
        assert pruned == FINISHED
        assert other == 0  # the try-lock: the second caller gets 0 at once
        # Batches of 500, then one that finds none left, then the unlock.
        assert calls == FINISHED // 500 + 2
        assert slowest_ms < 100
        assert await queue.get_item("acme", "old0") is None
        assert (await queue.get_item("acme", "dead")).status == ItemStatus.DEAD  # type: ignore[union-attr]
        assert (await queue.get_item("acme", "young3")).status == ItemStatus.DONE  # type: ignore[union-attr]
        assert (await queue.get_item("acme", "live")).status == ItemStatus.QUEUED  # type: ignore[union-attr]
        keys = QueueKeys("prune", "default")
        assert await client.zcard(keys.finished("done")) == 10
        # A pruned id is free: enqueued again, it is a new item that runs.
        again = await queue.enqueue(WorkItem(tenant="acme", item_id="old0", payload={"n": -1}))
        assert again.payload == {"n": -1} and again.status == ItemStatus.QUEUED
        # The lock was given back: a later prune runs (nothing left past the cutoff).
        assert await queue.prune() == 0
        assert await client.exists(keys.prune_lock) == 0
    finally:
        await client.aclose()


async def _second_pruner(queue: RedisWorkQueue) -> int:
    await asyncio.sleep(0.05)  # the first holds the lock by now
    return await queue.prune()


async def _timed_stats(queue: RedisWorkQueue) -> float:
    started = time.perf_counter()
    await queue.stats()
    return time.perf_counter() - started


async def test_stats_cost_does_not_grow_with_finished_items(
    redis_client: Redis, clock: ManualClock
) -> None:
    """stats() reads the per-tenant counts: the same commands with 0 and 20k finished items,
    and cancelled items are counted without listing them."""
    queue = RedisWorkQueue(redis_client, clock=clock)
    empty = await _best_of(queue)
    await _finish(queue, "acme", "i", 20_000)
    await queue.enqueue(WorkItem(tenant="acme", item_id="c"))
    await queue.cancel("acme", "c", reason="not needed")
    full = await _best_of(queue)
    stats = await queue.stats()
    print(f"\nstats(): {empty * 1000:.3f} ms empty, {full * 1000:.3f} ms with 20k done")
    assert stats.tenants["acme"].cancelled == 1
    assert stats.queued == 0 and stats.leased == 0
    assert full < max(2 * empty, empty + 0.002)


async def _best_of(queue: RedisWorkQueue) -> float:
    best = float("inf")
    for _ in range(20):
        started = time.perf_counter()
        await queue.stats()
        best = min(best, time.perf_counter() - started)
    return best


async def test_a_cancel_reaches_a_watching_process_in_under_a_second(
    statepact_redis_url: str, redis_client: Redis
) -> None:
    """A leased item cancelled here: the watch of another process hears (tenant, item_id,
    token) within a second, and the old lease's ack and heartbeat are refused."""
    namespace = f"ctl{uuid.uuid4().hex[:8]}"
    settings = RedisStoreSettings(namespace=namespace, queue_name="jobs", durable=False)
    queue = RedisWorkQueue(redis_client, settings=settings)
    workers: list[Worker] = []
    try:
        watcher = await spawn(
            workers,
            "tests.integration._redis_control_watch",
            {"url": statepact_redis_url, "namespace": namespace, "queue": "jobs"},
        )
        await watcher.expect("ready")
        await queue.enqueue(WorkItem(tenant="acme", item_id="long"))
        await queue.enqueue(WorkItem(tenant="acme", item_id="waiting"))
        lease = await queue.claim("w1", lease_for=LEASE)
        assert lease is not None and lease.item.item_id == "long"
        sent = time.time()
        cancelled = await queue.cancel("acme", "long", reason="user asked")
        assert cancelled is not None and cancelled.status == ItemStatus.CANCELLED
        heard = await watcher.expect("cancel", timeout=5)
        latency = heard["at"] - sent
        print(f"\ncancel notice across processes: {latency * 1000:.1f} ms")
        assert (heard["tenant"], heard["item_id"], heard["token"]) == ("acme", "long", lease.token)
        assert latency < 1.0
        # A queued item's cancel sends no notice: nothing runs it.
        await queue.cancel("acme", "waiting")
        await watcher.send("paused")
        assert (await watcher.expect("paused", timeout=5))["paused"] is False
        assert [e["event"] for e in watcher.events].count("cancel") == 1
        with pytest.raises(Exception, match="lease"):
            await queue.ack(lease)
        with pytest.raises(Exception, match="lease"):
            await queue.heartbeat(lease)
    finally:
        for worker in workers:
            if worker.process.stdin is not None:
                worker.process.stdin.close()
        await reap_all(workers)


async def test_a_pause_is_seen_by_another_client_and_resume_wakes_its_watch(
    statepact_redis_url: str, redis_client: Redis, clock: ManualClock
) -> None:
    """pause() on one client: another client's queue sees paused() and claims nothing; resume()
    wakes that client's blocked watch at once and it claims again."""
    other_client = Redis.from_url(statepact_redis_url)
    try:
        mine = RedisWorkQueue(redis_client, clock=clock)
        theirs = RedisWorkQueue(other_client, clock=clock)
        await mine.enqueue(WorkItem(tenant="acme", item_id="a"))
        await mine.pause()
        assert await theirs.paused() is True
        assert await theirs.claim("w", lease_for=LEASE) is None
        async with theirs.watch() as watch:
            while await watch.wait(0.01):  # drain the enqueue's wake-up tokens
                pass
            waiting = asyncio.create_task(watch.wait(10.0))
            await asyncio.sleep(0.1)
            started = time.perf_counter()
            await mine.resume()
            assert await waiting is True
            woke = time.perf_counter() - started
        print(f"\nresume to a blocked watch waking: {woke * 1000:.1f} ms")
        assert woke < 1.0
        assert await theirs.paused() is False
        lease = await theirs.claim("w", lease_for=LEASE)
        assert lease is not None and lease.item.item_id == "a"
    finally:
        await other_client.aclose()


async def test_concurrent_enqueues_of_one_unique_key_store_one_item(
    statepact_redis_url: str, redis_client: Redis, clock: ManualClock
) -> None:
    """Ten clients enqueue ten ids under one unique key at once: one item is stored, and all
    ten get it back; once it is done the key is free again."""
    clients = [Redis.from_url(statepact_redis_url) for _ in range(10)]
    try:
        queues = [RedisWorkQueue(client, clock=clock) for client in clients]
        got = await asyncio.gather(
            *(
                q.enqueue(WorkItem(tenant="acme", item_id=f"i{n}", unique_key="summarise:c1"))
                for n, q in enumerate(queues)
            )
        )
    finally:
        for client in clients:
            await client.aclose()
    assert len({item.item_id for item in got}) == 1
    queue = RedisWorkQueue(redis_client, clock=clock)
    stats = await queue.stats()
    assert stats.queued == 1
    lease = await queue.claim("w", lease_for=LEASE)
    assert lease is not None
    await queue.ack(lease)
    fresh = await queue.enqueue(WorkItem(tenant="acme", item_id="next", unique_key="summarise:c1"))
    assert fresh.item_id == "next"
    # With a period, a done item keeps its slot to the end of the period.
    period = timedelta(hours=1)
    first = await queue.enqueue(
        WorkItem(tenant="acme", item_id="p1", unique_key="hourly", unique_for=period)
    )
    assert first.item_id == "p1"
    await queue.cancel("acme", "next")
    lease = await queue.claim("w", lease_for=LEASE)
    assert lease is not None and lease.item.item_id == "p1"
    await queue.ack(lease)
    blocked = await queue.enqueue(
        WorkItem(tenant="acme", item_id="p2", unique_key="hourly", unique_for=period)
    )
    assert blocked.item_id == "p1" and blocked.status == ItemStatus.DONE
    clock.advance(3600)
    later = await queue.enqueue(
        WorkItem(tenant="acme", item_id="p3", unique_key="hourly", unique_for=period)
    )
    assert later.item_id == "p3"


async def test_operator_reads_prunable_dead_letters_across_tenants_and_queues(
    redis_client: Redis, clock: ManualClock
) -> None:
    """prunable() counts from the finished indexes, dead_letters_all() pages every tenant's
    dead items by (tenant, item_id), queues() lists each queue with items, done ones too."""
    settings = RedisStoreSettings(namespace="ops", queue_name="jobs")
    queue = RedisWorkQueue(redis_client, clock=clock, settings=settings)
    other = RedisWorkQueue(
        redis_client, clock=clock, settings=settings.model_copy(update={"queue_name": "mail"})
    )
    for tenant, item_id in (("b", "2"), ("a", "9"), ("a", "10"), ("ab", "1")):
        await queue.enqueue(WorkItem(tenant=tenant, item_id=item_id))
    for lease in await queue.claim_batch("w", lease_for=LEASE, limit=4):
        await queue.fail(lease, "boom", retryable=False)
    await other.enqueue(WorkItem(tenant="a", item_id="m"))
    lease = await other.claim("w", lease_for=LEASE)
    assert lease is not None
    await other.ack(lease)

    first = await queue.dead_letters_all(limit=3)
    assert [(i.tenant, i.item_id) for i in first.items] == [("a", "10"), ("a", "9"), ("ab", "1")]
    assert first.next is not None
    rest = await queue.dead_letters_all(after=first.next, limit=3)
    assert [(i.tenant, i.item_id) for i in rest.items] == [("b", "2")] and rest.next is None

    assert await other.prunable() == {
        ItemStatus.DONE: 0,
        ItemStatus.CANCELLED: 0,
        ItemStatus.DEAD: 0,
    }
    clock.advance(8 * 86_400)
    assert await queue.prunable() == {
        ItemStatus.DONE: 0,
        ItemStatus.CANCELLED: 0,
        ItemStatus.DEAD: 4,
    }
    assert await other.prunable() == {
        ItemStatus.DONE: 1,
        ItemStatus.CANCELLED: 0,
        ItemStatus.DEAD: 0,
    }

    listed = await queue.queues()
    assert [(s.queue, s.dead) for s in listed] == [("jobs", 4), ("mail", 0)]
    assert await queue.prune() == 4
    assert (await queue.dead_letters_all()).items == []
    assert [s.queue for s in await queue.queues()] == ["mail"]


async def _drain(queue: RedisWorkQueue, worker_id: str, stop: asyncio.Event) -> int:
    """Claim and ack one item at a time until ``stop``; how many were acked."""
    acked = 0
    while not stop.is_set():
        lease = await queue.claim(worker_id, lease_for=LEASE)
        if lease is None:
            await asyncio.sleep(0.001)
            continue
        await queue.ack(lease)
        acked += 1
    return acked


async def _rate(queues: list[RedisWorkQueue], seconds: float, during: Any = None) -> float:
    """Claim+ack per second of ten workers over ``seconds`` (or while ``during`` runs)."""
    stop = asyncio.Event()
    workers = [asyncio.create_task(_drain(q, f"w{n}", stop)) for n, q in enumerate(queues)]
    started = time.perf_counter()
    if during is None:
        await asyncio.sleep(seconds)
    else:
        await during
    elapsed = time.perf_counter() - started
    stop.set()
    return sum(await asyncio.gather(*workers)) / elapsed


async def test_prune_while_ten_workers_drain_keeps_them_draining(
    statepact_redis_server_factory: RedisServerFactory,
) -> None:
    """A prune of many finished items while ten workers claim and ack: it deletes every
    one of them and the workers keep acking all along. The throughputs are printed; the
    issue's "within 20%" is a benchmark's to measure on a quiet machine
    (benchmarks/retention_under_load.py), not a timed assertion on a shared one."""
    finished = int(os.environ.get("STATEPACT_TEST_PRUNE_ITEMS", "50000"))
    server = statepact_redis_server_factory()
    settings = RedisStoreSettings(namespace="drain", durable=False)
    clock = ManualClock()
    clients = [Redis.from_url(server.url) for _ in range(11)]
    try:
        queues = [RedisWorkQueue(c, clock=clock, settings=settings) for c in clients]
        pruner = queues.pop()
        await _finish(pruner, "old", "o", finished)
        clock.advance(2 * 86_400)
        for start in range(0, 60_000, CHUNK):
            await pruner.enqueue_many(
                [
                    WorkItem(tenant=f"t{n % 10}", item_id=f"n{n}")
                    for n in range(start, start + CHUNK)
                ]
            )
        before = await _rate(queues, 3.0)
        started = time.perf_counter()
        prune = asyncio.ensure_future(pruner.prune())
        during = await _rate(queues, 0, prune)
        took = time.perf_counter() - started
        after = await _rate(queues, 3.0)
        pruned = prune.result()
        print(
            f"\n10 workers claim+ack: {before:.0f}/s before, {during:.0f}/s during the prune "
            f"of {pruned} items ({took:.1f} s), {after:.0f}/s after"
        )
        assert pruned == finished
        assert during > 0 and before > 0 and after > 0
    finally:
        for client in clients:
            await client.aclose()


async def test_a_watch_subscribes_again_after_its_connection_is_killed(
    redis_client: Redis, clock: ManualClock
) -> None:
    """The server drops the watch's pub/sub connection: the watch subscribes again on its
    own, and a cancel after that is heard."""
    queue = RedisWorkQueue(redis_client, clock=clock)
    heard: list[tuple[str, str, int]] = []
    async with queue.watch(on_cancel=lambda *notice: heard.append(notice)):
        assert await redis_client.client_kill_filter(_type="pubsub") >= 1
        for n in range(2):
            await queue.enqueue(WorkItem(tenant="acme", item_id=f"i{n}"))
        deadline = time.perf_counter() + 5
        # Cancel leased items until one is heard: those cancelled while the watch was
        # away are missed (their worker's heartbeat is the fallback), none after.
        while not heard and time.perf_counter() < deadline:
            await queue.enqueue(WorkItem(tenant="acme", item_id=f"x{time.perf_counter()}"))
            lease = await queue.claim("w", lease_for=LEASE)
            assert lease is not None
            await queue.cancel("acme", lease.item.item_id)
            await asyncio.sleep(0.2)
        assert heard and heard[-1][0] == "acme"
        subscribers = await redis_client.pubsub_numsub(QueueKeys("adk", "default").control)
        assert subscribers[0][1] == 1
