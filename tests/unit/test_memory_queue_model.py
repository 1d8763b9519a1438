"""MemoryWorkQueue against a naive model of the written rules.

The memory queue claims through heaps with lazily dropped entries so that a
claim never scans the backlog. This test drives it and a deliberately naive
model (``PlainQueueModel`` of the model lane, which scans everything, straight
from the rules in the queue's module docstring) with the same random
operations, and requires the same answers: which item each claim gets with
which token, which settles are refused, what every item, the stats and the dead
letters look like. It needs no server: 40 seeds of 300 steps.
"""

from __future__ import annotations

import random

import pytest

from statepact.clock import ManualClock
from statepact.errors import LeaseLostError
from statepact.models import Lease, WorkItem
from statepact.queue import QueuePolicy
from statepact.storage.memory import MemoryWorkQueue
from tests.model.test_queue_model import PlainQueueModel

POLICY = QueuePolicy(max_attempts=3, backoff_base=5, backoff_cap=20, jitter=0)
TENANTS = ["a", "B", "c", "dé"]


async def _check_state(queue: MemoryWorkQueue, model: PlainQueueModel) -> None:
    """Every item, the stats and each tenant's dead letters are the model's."""
    for tenant, item_id in model.rows:
        assert await queue.get_item(tenant, item_id) == model.get_item(tenant, item_id)
    assert (await queue.stats()).tenants == model.stats().tenants
    for tenant in TENANTS:
        dead = await queue.dead_letters(tenant, limit=1000)
        assert dead == model.dead_letters(tenant, 1000)


@pytest.mark.parametrize("seed", range(40))
async def test_memory_queue_matches_the_naive_model(seed: int) -> None:
    """300 random operations: the memory queue answers, and ends up, as the plain model does."""
    rng = random.Random(seed)
    clock = ManualClock()
    queue = MemoryWorkQueue(clock=clock, policy=POLICY)
    model = PlainQueueModel(clock, POLICY)
    leases: list[Lease] = []
    for step in range(300):
        op = rng.choices(
            ["enqueue", "claim", "batch", "heartbeat", "settle", "reap", "advance", "requeue"],
            weights=[30, 15, 5, 8, 15, 5, 15, 3],
        )[0]
        if op == "enqueue":
            tenant, item_id = rng.choice(TENANTS), f"i{rng.randrange(40)}"
            priority, delay = rng.randint(-1, 1), rng.choice([0, 0, 3, 10])
            item = WorkItem(tenant=tenant, item_id=item_id, priority=priority)
            await queue.enqueue(item, delay=delay)
            model.enqueue(item, delay)
        elif op in ("claim", "batch"):
            limit = 1 if op == "claim" else rng.randint(1, 6)
            seconds = float(rng.choice([5, 10, 30]))
            got = await queue.claim_batch("w", lease_for=seconds, limit=limit)
            leases.extend(got)
            assert [_claimed(lease) for lease in got] == [
                _claimed(lease) for lease in model.claim_batch("w", seconds, limit)
            ], f"step {step}"
        elif op == "heartbeat" and leases:
            lease = rng.choice(leases)
            try:
                expected = model.heartbeat(lease)
            except LeaseLostError:
                with pytest.raises(LeaseLostError):
                    await queue.heartbeat(lease)
            else:
                renewed = await queue.heartbeat(lease)
                assert renewed.token == expected.token
                leases.append(renewed)
        elif op == "settle" and leases:
            lease = rng.choice(leases)
            kind = rng.choice(["ack", "release", "fail"])
            retryable = rng.random() < 0.8
            try:
                _settle_model(model, kind, lease, retryable)
            except LeaseLostError:
                with pytest.raises(LeaseLostError):
                    await _settle(queue, kind, lease, retryable)
            else:
                await _settle(queue, kind, lease, retryable)
        elif op == "reap":
            moved = {(item.tenant, item.item_id) for item in await queue.reap()}
            assert moved == {(item.tenant, item.item_id) for item in model.reap()}
        elif op == "advance":
            clock.advance(rng.choice([1, 2.5, 5, 10, 31]))
        elif op == "requeue":
            item = WorkItem(tenant=rng.choice(TENANTS), item_id=f"i{rng.randrange(40)}")
            try:
                model.requeue(item.tenant, item.item_id)
            except ValueError:
                with pytest.raises(ValueError, match="item_id"):
                    await queue.requeue(item)
            else:
                await queue.requeue(item)
        if step % 25 == 0:
            await _check_state(queue, model)
    await _check_state(queue, model)


def _claimed(lease: Lease) -> tuple[str, str, int, int]:
    return (lease.item.tenant, lease.item.item_id, lease.token, lease.item.attempts)


def _settle_model(model: PlainQueueModel, kind: str, lease: Lease, retryable: bool) -> None:
    if kind == "ack":
        model.ack(lease)
    elif kind == "release":
        model.release(lease)
    else:
        model.fail(lease, "failed", retryable)


async def _settle(queue: MemoryWorkQueue, kind: str, lease: Lease, retryable: bool) -> None:
    if kind == "ack":
        await queue.ack(lease)
    elif kind == "release":
        await queue.release(lease)
    else:
        await queue.fail(lease, "failed", retryable=retryable)
