"""MemoryBackend internals the conformance suite cannot see: history GC, the lock manager's
wait-for graph, and the serialization-graph audit."""

from __future__ import annotations

import asyncio

import pytest

from statepact.clock import ManualClock
from statepact.errors import ConflictError, DeadlockError, LockTimeoutError
from statepact.storage.memory import MemoryBackend
from statepact.storage.memory.backend import Footprint, LockManager, find_serialization_cycle
from statepact.tx import LockMode, StorageBackend, TransactionManager


async def write(manager: TransactionManager, key: str, value: object) -> int:
    async with manager.transaction() as tx:
        tx.write("r", key, value)
    return tx.result.version


def test_memory_backend_satisfies_the_protocol() -> None:
    backend = MemoryBackend()
    assert isinstance(backend, StorageBackend)
    assert backend.detects_deadlocks is True


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"lock_timeout": -1}, "lock_timeout"),
        ({"serialization_window": 0}, "serialization_window"),
        ({"retain_versions": 0}, "retain_versions"),
    ],
)
def test_constructor_refuses_bad_options(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        MemoryBackend(**kwargs)  # type: ignore[arg-type]


async def test_gc_keeps_only_the_latest_without_snapshots() -> None:
    backend = MemoryBackend(clock=ManualClock())
    manager = TransactionManager(backend)
    for value in range(5):
        await write(manager, "k", value)
    assert backend.retained_versions("r", "k") == [5]
    assert [e.version for e in await manager.history("r", "k")] == [5]


async def test_gc_keeps_what_a_live_snapshot_needs_until_it_ends() -> None:
    backend = MemoryBackend(clock=ManualClock())
    manager = TransactionManager(backend)
    await write(manager, "k", "v1")
    reader = await manager.begin()
    for value in ("v2", "v3", "v4"):
        await write(manager, "k", value)
    assert backend.retained_versions("r", "k") == [1, 4]
    assert await reader.read("r", "k") == "v1"
    await reader.commit()
    assert backend.retained_versions("r", "k") == [4]


async def test_gc_with_two_snapshots_keeps_one_version_each() -> None:
    backend = MemoryBackend(clock=ManualClock())
    manager = TransactionManager(backend)
    await write(manager, "k", 1)
    first = await manager.begin()
    await write(manager, "k", 2)
    await write(manager, "k", 3)
    second = await manager.begin()
    await write(manager, "k", 4)
    assert backend.retained_versions("r", "k") == [1, 3, 4]
    await second.rollback()
    assert backend.retained_versions("r", "k") == [1, 4]
    assert await first.read("r", "k") == 1
    await first.rollback()
    assert backend.retained_versions("r", "k") == [4]


async def test_retain_versions_and_gc_off() -> None:
    retained = MemoryBackend(clock=ManualClock(), retain_versions=2)
    kept_all = MemoryBackend(clock=ManualClock(), gc=False)
    for backend in (retained, kept_all):
        manager = TransactionManager(backend)
        for value in range(4):
            await write(manager, "k", value)
    assert retained.retained_versions("r", "k") == [3, 4]
    assert kept_all.retained_versions("r", "k") == [1, 2, 3, 4]


async def test_reading_a_collected_version_is_a_conflict() -> None:
    backend = MemoryBackend(clock=ManualClock())
    manager = TransactionManager(backend)
    for value in range(3):
        await write(manager, "k", value)
    # No snapshot was registered at 1, so version 1 is gone: "snapshot too old".
    with pytest.raises(ConflictError, match="snapshot too old"):
        await backend.read("r", "k", 1)
    assert (await backend.read("r", "k", 0)).data is None  # before the key existed
    assert (await backend.read("r", "k", 3)).version == 3


async def test_a_version_collected_between_two_kept_ones_is_not_read_silently() -> None:
    backend = MemoryBackend(clock=ManualClock())
    manager = TransactionManager(backend)
    await write(manager, "k", "v1")
    reader = await manager.begin()
    for value in ("v2", "v3", "v4"):
        await write(manager, "k", value)
    assert backend.retained_versions("r", "k") == [1, 4]
    with pytest.raises(ConflictError, match="snapshot too old"):
        await backend.read("r", "k", 2)  # v2 is gone; v1 must not stand in for it
    assert (await backend.read("r", "k", 1)).data == '"v1"'
    await reader.rollback()


async def test_closed_backend_refuses_calls() -> None:
    backend = MemoryBackend()
    await backend.close()
    assert await backend.health_check() is False
    with pytest.raises(RuntimeError, match="closed"):
        await backend.begin("t")


# -- the lock manager --------------------------------------------------------------------


async def test_three_cycle_refuses_only_the_closing_waiter() -> None:
    locks = LockManager()
    for txn, key in (("t1", "a"), ("t2", "b"), ("t3", "c")):
        await locks.acquire(txn, ("r", key), LockMode.EXCLUSIVE, 1.0)
    w1 = asyncio.create_task(locks.acquire("t1", ("r", "b"), LockMode.EXCLUSIVE, 2.0))
    w2 = asyncio.create_task(locks.acquire("t2", ("r", "c"), LockMode.EXCLUSIVE, 2.0))
    await asyncio.sleep(0.01)
    with pytest.raises(DeadlockError):
        await locks.acquire("t3", ("r", "a"), LockMode.EXCLUSIVE, 2.0)
    locks.release_all("t3")
    await asyncio.wait_for(w2, 1.0)
    locks.release_all("t2")
    await asyncio.wait_for(w1, 1.0)
    assert locks.holders(("r", "b")) == {"t1": LockMode.EXCLUSIVE}


async def test_two_sharers_upgrading_deadlock_once() -> None:
    locks = LockManager()
    slot = ("r", "k")
    await locks.acquire("t1", slot, LockMode.SHARED, 1.0)
    await locks.acquire("t2", slot, LockMode.SHARED, 1.0)
    upgrade = asyncio.create_task(locks.acquire("t1", slot, LockMode.EXCLUSIVE, 2.0))
    await asyncio.sleep(0.01)
    with pytest.raises(DeadlockError):
        await locks.acquire("t2", slot, LockMode.EXCLUSIVE, 2.0)
    locks.release_all("t2")
    await asyncio.wait_for(upgrade, 1.0)
    assert locks.holders(slot) == {"t1": LockMode.EXCLUSIVE}


async def test_timed_out_waiter_leaves_no_trace() -> None:
    locks = LockManager()
    slot = ("r", "k")
    await locks.acquire("t1", slot, LockMode.EXCLUSIVE, 1.0)
    with pytest.raises(LockTimeoutError):
        await locks.acquire("t2", slot, LockMode.SHARED, 0.02)
    # t2 no longer waits on t1, so t1 waiting on t2 is no cycle.
    await locks.acquire("t2", ("r", "other"), LockMode.EXCLUSIVE, 1.0)
    with pytest.raises(LockTimeoutError):
        await locks.acquire("t1", ("r", "other"), LockMode.EXCLUSIVE, 0.02)
    locks.release_all("t1")
    assert locks.holders(slot) == {}


async def test_release_grants_every_compatible_waiter() -> None:
    locks = LockManager()
    slot = ("r", "k")
    await locks.acquire("writer", slot, LockMode.EXCLUSIVE, 1.0)
    readers = [
        asyncio.create_task(locks.acquire(f"t{i}", slot, LockMode.SHARED, 2.0)) for i in range(3)
    ]
    await asyncio.sleep(0.01)
    assert not any(r.done() for r in readers)
    locks.release_all("writer")
    await asyncio.wait_for(asyncio.gather(*readers), 1.0)
    assert set(locks.holders(slot)) == {"t0", "t1", "t2"}


# -- the serialization-graph audit ----------------------------------------------------------


def test_audit_finds_the_write_skew_cycle() -> None:
    x, y = ("r", "x"), ("r", "y")
    t1 = Footprint("t1", seq=2, reads={x: 1, y: 1}, writes=frozenset({x}))
    t2 = Footprint("t2", seq=3, reads={x: 1, y: 1}, writes=frozenset({y}))
    cycle = find_serialization_cycle([t1], t2)
    assert cycle is not None and set(cycle) == {"t1", "t2"}


def test_audit_accepts_a_serial_history() -> None:
    x, y = ("r", "x"), ("r", "y")
    t1 = Footprint("t1", seq=2, reads={x: 1}, writes=frozenset({x}))
    t2 = Footprint("t2", seq=3, reads={x: 2, y: 1}, writes=frozenset({y}))
    t3 = Footprint("t3", seq=4, reads={y: 3}, writes=frozenset({x}))
    assert find_serialization_cycle([t1, t2], t3) is None


async def test_serializable_commit_runs_the_audit_window() -> None:
    backend = MemoryBackend(clock=ManualClock(), serialization_window=4)
    manager = TransactionManager(backend)
    for i in range(10):
        async with manager.transaction("serializable") as tx:
            await tx.read("r", "k")
            tx.write("r", "k", i)
    assert backend.sequence == 10
    assert len(backend._footprints) == 4
