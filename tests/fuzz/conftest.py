"""The fuzz lane's fixtures: one seeded store per test on each backing, in a loop of its own.

``model_backing`` (from ``tests/model/_harness.py``) runs every fuzz test against
memory, Redis and PostgreSQL. Each ``fuzz_*`` fixture opens one store for the
whole test (all its Hypothesis examples) inside a :class:`LoopRunner`, seeds it
with a little data, and closes it afterwards. The examples share the store on
purpose: each compares the store before and after its own call.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pytest

from statepact.clock import ManualClock
from statepact.models import RunRecord, SessionRecord, WorkItem
from statepact.queue import QueuePolicy, WorkQueue
from statepact.state import StateStore
from statepact.tx import TransactionManager
from tests.model import _harness
from tests.model._harness import Backing, LoopRunner, Snapshot

# The backing fixtures of the model lane, registered here too.
memory_model_backing = _harness.memory_model_backing
redis_model_backing = _harness.redis_model_backing
postgres_model_backing = _harness.postgres_model_backing
model_backing = _harness.model_backing

T = TypeVar("T")

SEED_TENANTS = ("acme", "globex")
SEED_RUNS = ("r1", "r2")
SEED_SESSIONS = ("s1",)
SEED_RESOURCES = ("orders", "users")
SEED_KEYS = ("k1", "k2")
POLICY = QueuePolicy(max_attempts=2, backoff_base=5, backoff_cap=20, jitter=0)


@dataclass
class Target(Generic[T]):
    """A store under fuzz: call it through ``runner``; ``raw`` reads a server's every key/row."""

    backing: str
    runner: LoopRunner
    store: T
    clock: ManualClock
    raw: Snapshot | None

    def run(self, awaitable: Any) -> Any:
        return self.runner.run(awaitable)


@pytest.fixture
def fuzz_state(model_backing: Backing) -> Iterator[Target[StateStore]]:
    runner, clock = LoopRunner(), ManualClock()
    try:
        opened = runner.open(model_backing.state_store(clock))
        store = opened.value

        async def seed() -> None:
            for tenant in SEED_TENANTS:
                for session_id in SEED_SESSIONS:
                    await store.put_session(SessionRecord(tenant=tenant, session_id=session_id))
                for run_id in SEED_RUNS:
                    await store.put_run(
                        RunRecord(tenant=tenant, run_id=run_id, session_id=SEED_SESSIONS[0])
                    )
                    await store.patch_run(tenant, run_id, input_tokens=5, cost="0.5")

        runner.run(seed())
        yield Target(model_backing.name, runner, store, clock, opened.raw)
    finally:
        runner.close()


@pytest.fixture
def fuzz_queue(model_backing: Backing) -> Iterator[Target[WorkQueue]]:
    runner, clock = LoopRunner(), ManualClock()
    try:
        opened = runner.open(model_backing.work_queue(clock, POLICY))
        queue = opened.value

        async def seed() -> None:
            for tenant in SEED_TENANTS:
                for index in range(3):
                    await queue.enqueue(WorkItem(tenant=tenant, item_id=f"seed-{index}"))
            # One dead item per tenant, for dead_letters and requeue.
            for _ in SEED_TENANTS:
                lease = await queue.claim("seeder", lease_for=60)
                assert lease is not None
                await queue.fail(lease, "seeded", retryable=False)

        runner.run(seed())
        yield Target(model_backing.name, runner, queue, clock, opened.raw)
    finally:
        runner.close()


@pytest.fixture
def fuzz_tx(model_backing: Backing) -> Iterator[Target[TransactionManager]]:
    runner, clock = LoopRunner(), ManualClock()
    try:
        opened = runner.open(model_backing.tx_backend(clock))
        manager = TransactionManager(opened.value)

        async def seed() -> None:
            async with manager.transaction() as tx:
                for resource in SEED_RESOURCES:
                    for key in SEED_KEYS:
                        tx.write(resource, key, {"v": 1})
            await manager.register_resource(SEED_RESOURCES[0], {"owner": "seed"})
            await manager.acquire_lease(SEED_RESOURCES[0], "seeder", 3600)

        runner.run(seed())
        yield Target(model_backing.name, runner, manager, clock, opened.raw)
    finally:
        runner.close()
