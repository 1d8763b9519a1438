"""MemoryWorkQueue against a naive model of the written rules.

The memory queue claims through heaps with lazily dropped entries so that a
claim never scans the backlog. This test drives it and a deliberately naive
model (which scans everything, straight from the rules in the queue's module
docstring) with the same random operations, and requires the same answers:
which item each claim gets, which settles are refused, what every item and the
stats look like.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from statepact.clock import ManualClock
from statepact.errors import LeaseLostError
from statepact.models import ItemStatus, Lease, TenantQueueStats, WorkItem
from statepact.queue import QueuePolicy
from statepact.storage.memory import MemoryWorkQueue

POLICY = QueuePolicy(max_attempts=3, backoff_base=5, backoff_cap=20, jitter=0)
TENANTS = ["a", "B", "c", "dé"]


@dataclass
class _Row:
    tenant: str
    item_id: str
    priority: int
    order: int
    available_at: datetime
    updated_at: datetime
    attempts: int = 0
    status: ItemStatus = ItemStatus.QUEUED
    last_error: str | None = None
    token: int = 0
    expires_at: datetime | None = None


@dataclass
class Model:
    """The rules, written as plainly as possible."""

    rows: dict[tuple[str, str], _Row] = field(default_factory=dict)
    turns: dict[str, int] = field(default_factory=dict)
    turn_counter: int = 0
    token_counter: int = 0
    order_counter: int = 0

    def enqueue(self, tenant: str, item_id: str, priority: int, now: datetime, delay: int) -> None:
        if (tenant, item_id) not in self.rows:
            self.order_counter += 1
            self.rows[(tenant, item_id)] = _Row(
                tenant,
                item_id,
                priority,
                self.order_counter,
                now + timedelta(seconds=delay),
                now,
            )

    def claim(self, now: datetime, seconds: float, limit: int) -> list[tuple[str, str, int, int]]:
        got = []
        for _ in range(limit):
            due = [
                r
                for r in self.rows.values()
                if r.status is ItemStatus.QUEUED and r.available_at <= now
            ]
            if not due:
                break
            tenant = min({r.tenant for r in due}, key=lambda t: (self.turns.get(t, 0), t))
            row = min((r for r in due if r.tenant == tenant), key=lambda r: (-r.priority, r.order))
            self.turn_counter += 1
            self.turns[tenant] = self.turn_counter
            self.token_counter += 1
            row.status, row.attempts, row.token = (
                ItemStatus.LEASED,
                row.attempts + 1,
                self.token_counter,
            )
            row.expires_at, row.updated_at = now + timedelta(seconds=seconds), now
            got.append((row.tenant, row.item_id, row.token, row.attempts))
        return got

    def held(self, lease: Lease) -> _Row | None:
        row = self.rows.get((lease.item.tenant, lease.item.item_id))
        if row is None or row.status is not ItemStatus.LEASED or row.token != lease.token:
            return None
        return row

    def heartbeat(self, lease: Lease, now: datetime) -> int | None:
        row = self.held(lease)
        if row is None:
            return None
        self.token_counter += 1
        row.token, row.expires_at = self.token_counter, now + timedelta(seconds=lease.lease_seconds)
        return row.token

    def settle(self, kind: str, lease: Lease, now: datetime, retryable: bool) -> bool:
        row = self.held(lease)
        if row is None:
            return False
        row.updated_at = now
        if kind == "ack":
            row.status = ItemStatus.DONE
        elif kind == "release":
            row.status, row.attempts, row.available_at = ItemStatus.QUEUED, row.attempts - 1, now
        else:
            outcome = POLICY.after_failure(lease.item.attempts, now, retryable=retryable)
            row.last_error, row.available_at = "failed", outcome.available_at
            row.status = ItemStatus.DEAD if outcome.dead else ItemStatus.QUEUED
        return True

    def reap(self, now: datetime) -> set[tuple[str, str]]:
        moved = set()
        for row in self.rows.values():
            if row.status is ItemStatus.LEASED and row.expires_at and row.expires_at <= now:
                dead = POLICY.lapse_is_dead(row.attempts)
                row.status = ItemStatus.DEAD if dead else ItemStatus.QUEUED
                row.last_error, row.available_at, row.updated_at = "lease expired", now, now
                moved.add((row.tenant, row.item_id))
        return moved

    def requeue(self, tenant: str, item_id: str, now: datetime) -> bool:
        row = self.rows.get((tenant, item_id))
        if row is None or row.status is not ItemStatus.DEAD:
            return False
        row.status, row.attempts, row.available_at, row.updated_at = ItemStatus.QUEUED, 0, now, now
        return True

    def dead_letters(self, tenant: str) -> list[str]:
        dead = [r for r in self.rows.values() if r.tenant == tenant and r.status is ItemStatus.DEAD]
        return [r.item_id for r in sorted(dead, key=lambda r: (r.updated_at, r.item_id))]

    def stats(self) -> dict[str, TenantQueueStats]:
        counts: dict[str, list[int]] = {}
        for row in self.rows.values():
            slot = {ItemStatus.QUEUED: 0, ItemStatus.LEASED: 1, ItemStatus.DEAD: 2}.get(row.status)
            if slot is not None:
                counts.setdefault(row.tenant, [0, 0, 0])[slot] += 1
        return {
            t: TenantQueueStats(queued=q, leased=le, dead=d) for t, (q, le, d) in counts.items()
        }


def _view(item: WorkItem) -> tuple[object, ...]:
    return (item.status, item.attempts, item.last_error, item.available_at, item.updated_at)


def _row_view(row: _Row) -> tuple[object, ...]:
    return (row.status, row.attempts, row.last_error, row.available_at, row.updated_at)


async def _check_state(queue: MemoryWorkQueue, model: Model) -> None:
    for (tenant, item_id), row in model.rows.items():
        item = await queue.get_item(tenant, item_id)
        assert item is not None
        assert _view(item) == _row_view(row), (tenant, item_id)
    assert (await queue.stats()).tenants == model.stats()
    for tenant in TENANTS:
        dead = [i.item_id for i in await queue.dead_letters(tenant, limit=1000)]
        assert dead == model.dead_letters(tenant)


@pytest.mark.parametrize("seed", range(40))
async def test_memory_queue_matches_the_naive_model(seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock()
    queue = MemoryWorkQueue(clock=clock, policy=POLICY)
    model = Model()
    leases: list[Lease] = []
    for step in range(300):
        now = clock.now()
        op = rng.choices(
            ["enqueue", "claim", "batch", "heartbeat", "settle", "reap", "advance", "requeue"],
            weights=[30, 15, 5, 8, 15, 5, 15, 3],
        )[0]
        if op == "enqueue":
            tenant, item_id = rng.choice(TENANTS), f"i{rng.randrange(40)}"
            priority, delay = rng.randint(-1, 1), rng.choice([0, 0, 3, 10])
            await queue.enqueue(
                WorkItem(tenant=tenant, item_id=item_id, priority=priority), delay=delay
            )
            model.enqueue(tenant, item_id, priority, now, delay)
        elif op in ("claim", "batch"):
            limit = 1 if op == "claim" else rng.randint(1, 6)
            seconds = float(rng.choice([5, 10, 30]))
            got = await queue.claim_batch("w", lease_for=seconds, limit=limit)
            leases.extend(got)
            assert [
                (lease.item.tenant, lease.item.item_id, lease.token, lease.item.attempts)
                for lease in got
            ] == model.claim(now, seconds, limit), f"step {step}"
        elif op == "heartbeat" and leases:
            lease = rng.choice(leases)
            expected = model.heartbeat(lease, now)
            if expected is None:
                with pytest.raises(LeaseLostError):
                    await queue.heartbeat(lease)
            else:
                renewed = await queue.heartbeat(lease)
                assert renewed.token == expected
                leases.append(renewed)
        elif op == "settle" and leases:
            lease = rng.choice(leases)
            kind = rng.choice(["ack", "release", "fail"])
            retryable = rng.random() < 0.8
            if not model.settle(kind, lease, now, retryable):
                with pytest.raises(LeaseLostError):
                    await _settle(queue, kind, lease, retryable)
            else:
                await _settle(queue, kind, lease, retryable)
        elif op == "reap":
            moved = {(item.tenant, item.item_id) for item in await queue.reap()}
            assert moved == model.reap(now)
        elif op == "advance":
            clock.advance(rng.choice([1, 2.5, 5, 10, 31]))
        elif op == "requeue":
            tenant, item_id = rng.choice(TENANTS), f"i{rng.randrange(40)}"
            if model.requeue(tenant, item_id, now):
                await queue.requeue(WorkItem(tenant=tenant, item_id=item_id))
            else:
                with pytest.raises(ValueError, match="item_id"):
                    await queue.requeue(WorkItem(tenant=tenant, item_id=item_id))
        if step % 25 == 0:
            await _check_state(queue, model)
    await _check_state(queue, model)


async def _settle(queue: MemoryWorkQueue, kind: str, lease: Lease, retryable: bool) -> None:
    if kind == "ack":
        await queue.ack(lease)
    elif kind == "release":
        await queue.release(lease)
    else:
        await queue.fail(lease, "failed", retryable=retryable)
