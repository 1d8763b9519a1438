"""Locks and cancellation."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

from statepact.clock import ManualClock
from statepact.errors import (
    DeadlockError,
    LockTimeoutError,
)
from statepact.tx import (
    StorageBackend,
    Transaction,
    TransactionManager,
)

__all__ = ["LockConformance"]

from statepact.testing._tx_suite._common import LOCK_WAIT, R


class LockConformance:
    """Locks and cancellation."""

    # -- locks ------------------------------------------------------------------------------

    async def test_shared_locks_coexist(self, manager: TransactionManager) -> None:
        """Two transactions hold a shared lock on one key at the same time."""
        t1 = await manager.begin()
        t2 = await manager.begin()
        try:
            await t1.lock(R, "o1", mode="shared", timeout=LOCK_WAIT)
            await t2.lock(R, "o1", mode="shared", timeout=LOCK_WAIT)
            await t1.lock(R, "o1", mode="shared", timeout=0)  # re-lock is a no-op
        finally:
            await t1.rollback()
            await t2.rollback()

    async def test_exclusive_lock_excludes(self, manager: TransactionManager) -> None:
        """An exclusive lock keeps out shared and exclusive requests until they time out."""
        t1 = await manager.begin()
        t2 = await manager.begin()
        try:
            await t1.lock(R, "o1", timeout=LOCK_WAIT)
            with pytest.raises(LockTimeoutError) as caught:
                await t2.lock(R, "o1", mode="exclusive", timeout=LOCK_WAIT)
            assert (caught.value.resource, caught.value.key) == (R, "o1")
            with pytest.raises(LockTimeoutError):
                await t2.lock(R, "o1", mode="shared", timeout=0)
            await t2.lock(R, "o2", timeout=LOCK_WAIT)  # other keys are free
        finally:
            await t1.rollback()
            await t2.rollback()

    async def test_shared_lock_blocks_exclusive(self, manager: TransactionManager) -> None:
        """A shared holder keeps out an exclusive request."""
        t1 = await manager.begin()
        t2 = await manager.begin()
        try:
            await t1.lock(R, "o1", mode="shared", timeout=LOCK_WAIT)
            with pytest.raises(LockTimeoutError):
                await t2.lock(R, "o1", mode="exclusive", timeout=LOCK_WAIT)
        finally:
            await t1.rollback()
            await t2.rollback()

    async def test_locks_are_released_when_the_transaction_ends(
        self, manager: TransactionManager
    ) -> None:
        """A waiter gets the lock once the holder commits; a rollback releases too."""
        holder = await manager.begin()
        waiter = await manager.begin()
        await holder.lock(R, "o1")
        waiting = asyncio.create_task(waiter.lock(R, "o1", timeout=5.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        holder.write(R, "o1", 1)
        await holder.commit()
        await asyncio.wait_for(waiting, 5.0)
        await waiter.rollback()
        third = await manager.begin()
        await third.lock(R, "o1", timeout=LOCK_WAIT)
        await third.rollback()

    async def test_the_injected_clock_does_not_expire_a_live_lock(
        self, manager: TransactionManager, clock: ManualClock
    ) -> None:
        """A lock's TTL (where a backing has one) runs on the server's time, not the injected
        clock: moving the clock far ahead leaves a live holder's lock in place."""
        holder = await manager.begin()
        other = await manager.begin()
        try:
            await holder.lock(R, "o1")
            clock.advance(24 * 3600)
            with pytest.raises(LockTimeoutError):
                await other.lock(R, "o1", timeout=0)
        finally:
            await holder.rollback()
            await other.rollback()

    async def test_lock_cycle_is_broken(
        self, manager: TransactionManager, tx_backend: StorageBackend
    ) -> None:
        """A two-transaction lock cycle is broken: exactly one DeadlockError where the backing
        detects cycles, else LockTimeoutError."""
        t1 = await manager.begin()
        t2 = await manager.begin()
        await t1.lock(R, "a")
        await t2.lock(R, "b")

        async def attempt(tx: Transaction, key: str) -> BaseException | None:
            try:
                await tx.lock(R, key, timeout=1.0)
            except (DeadlockError, LockTimeoutError) as exc:
                await tx.rollback()
                return exc
            return None

        first = asyncio.create_task(attempt(t1, "b"))
        await asyncio.sleep(0.05)  # t1 is waiting before t2 closes the cycle
        outcomes = [await attempt(t2, "a"), await first]
        errors = [e for e in outcomes if e is not None]
        if tx_backend.detects_deadlocks:
            assert len(errors) == 1
            assert isinstance(outcomes[0], DeadlockError)  # the one that closed the cycle
            assert outcomes[1] is None  # the other got its lock
        else:
            assert errors
            assert all(isinstance(e, LockTimeoutError) for e in errors)
        for tx in (t1, t2):
            await tx.rollback()

    # -- cancellation -----------------------------------------------------------------------

    async def _lock_every_key(self, manager: TransactionManager, keys: Sequence[str]) -> list[str]:
        """The keys a fresh transaction cannot lock at once (timeout 0); it holds none after."""
        probe = await manager.begin()
        stuck = []
        try:
            for key in keys:
                try:
                    await probe.lock(R, key, timeout=0)
                except LockTimeoutError:
                    stuck.append(key)
        finally:
            await probe.rollback()
        return stuck

    async def test_a_cancelled_transaction_releases_its_locks(
        self, manager: TransactionManager
    ) -> None:
        """A transaction cancelled at any await (``asyncio.wait_for`` running out inside
        ``manager.run``) leaves none of its locks behind: every key can be locked afterwards."""
        rng = random.Random(10)
        keys = [f"c{i}" for i in range(40)]
        finished = 0

        async def body(tx: Transaction) -> None:
            key = rng.choice(keys)
            await tx.lock(R, key)
            tx.write(R, key, (await tx.read(R, key) or 0) + 1)

        async def worker() -> None:
            nonlocal finished
            for _ in range(15):
                try:
                    await asyncio.wait_for(manager.run(body), rng.uniform(0.005, 0.08))
                    finished += 1
                except TimeoutError:
                    pass

        await asyncio.gather(*(worker() for _ in range(20)))
        stuck = await self._lock_every_key(manager, keys)
        assert not stuck, f"{len(stuck)} of {len(keys)} keys still locked: {stuck}"
        assert finished > 0  # the scenario committed some, not only cancelled

    @pytest.mark.parametrize("ending", ["commit", "rollback"])
    async def test_a_transaction_cancelled_at_any_step_releases_its_locks(
        self, manager: TransactionManager, ending: str
    ) -> None:
        """However far a transaction got (begin, lock, read, commit or rollback) when it was
        cancelled, its locks are released and a fresh transaction can take them at once."""

        class Abandon(Exception):
            pass

        async def scenario(key: str) -> None:
            async with manager.transaction() as tx:
                await tx.lock(R, key)
                await asyncio.sleep(0)  # the caller's own awaits inside the transaction
                tx.write(R, key, (await tx.read(R, key) or 0) + 1)
                if ending == "rollback":
                    raise Abandon

        cancelled = 0
        for steps in range(1, 80):
            key = f"e{steps}"
            task = asyncio.ensure_future(scenario(key))
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            outcome = (await asyncio.gather(task, return_exceptions=True))[0]
            cancelled += isinstance(outcome, asyncio.CancelledError)
            stuck = await self._lock_every_key(manager, [key])
            assert not stuck, f"{ending} cancelled after {steps} loop steps left {key} locked"
        assert cancelled > 0  # the cancellations landed inside the transaction
