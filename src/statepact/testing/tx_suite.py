"""``TransactionConformance``: the behaviour every ``StorageBackend`` must show.

Subclass it in a test module and provide two fixtures:

- ``tx_backend``: an opened, empty ``StorageBackend`` (sequence 0, no values,
  leases, token marks, locks or idempotency records) built with the test's
  ``clock``; it must see nothing another test wrote and retain at least 16
  versions per key in its history (``MemoryBackend(retain_versions=...)``).
- ``clock``: the ``ManualClock`` the backend was built with. The class defines
  it as the plugin's ``statepact_clock``, so a fixture built with
  ``statepact_clock`` (or with ``clock``, inside the class) needs nothing more.

::

    import pytest
    from statepact.testing.tx_suite import TransactionConformance

    @pytest.fixture
    async def tx_backend(statepact_clock):
        backend = MyBackend(clock=statepact_clock)
        yield backend
        await backend.close()

    class TestMyBackend(TransactionConformance):
        pass

The suite uses ``TransactionManager`` over the backend and the clock only,
never a backing's internals nor the server's time. It runs unchanged against
every backing; memory is the reference. A known divergence is a strict
``xfail`` in the subclass, with its reason.

Lock cycles: a backing whose ``detects_deadlocks`` is ``True`` must refuse
exactly one transaction of a two-cycle with ``DeadlockError`` at once; one
whose flag is ``False`` must break the cycle with ``LockTimeoutError``. The
test asserts whichever the backing declares.

Hermitage-style tests script two transactions step by step (after Martin
Kleppmann's Hermitage) and assert what each isolation level allows: dirty
writes and dirty reads never; lost updates refused under ``snapshot`` and
``serializable``; read skew refused under ``snapshot``; write skew allowed under
``snapshot`` and refused under ``serializable``. Three-transaction cases
follow: Fekete, O'Neil and O'Neil's read-only transaction anomaly (allowed
under ``snapshot``, one of the three refused under ``serializable``), a write
skew cycle over three transactions, and a lost update among three writers.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, timedelta
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.errors import (
    ConflictError,
    DeadlockError,
    FencingError,
    IdempotencyConflictError,
    LeaseLostError,
    LockTimeoutError,
    StatePersistenceError,
)
from statepact.testing._inputs import (
    AWARE_ELSEWHERE,
    EACH_ACCEPTED_JSON,
    EACH_BROKEN_CLOCK,
    EACH_REFUSED_JSON,
    assert_plain_json,
    assert_refused_at,
)
from statepact.testing._tx_retention import TransactionRetentionConformance
from statepact.testing.isolation import (
    Anomaly,
    TxnRecord,
    check_history,
    record_append,
    record_read,
)
from statepact.tx import (
    CommitResult,
    Isolation,
    StorageBackend,
    Transaction,
    TransactionManager,
)

__all__ = ["TransactionConformance"]

R = "orders"
ISOLATIONS = [i.value for i in Isolation]
LOCK_WAIT = 0.3  # seconds a test lets a lock wait; real time, not the clock


async def _commit_value(manager: TransactionManager, key: str, value: Any) -> CommitResult:
    async with manager.transaction() as tx:
        tx.write(R, key, value)
    return tx.result


async def _read_value(manager: TransactionManager, key: str, resource: str = R) -> Any:
    async with manager.transaction() as tx:
        return await tx.read(resource, key)


def _names(anomalies: Sequence[Anomaly]) -> set[str]:
    return {a.name for a in anomalies}


class TransactionConformance(TransactionRetentionConformance):
    """The transaction behaviour every ``StorageBackend`` shares (see the module docstring)."""

    @pytest.fixture
    def clock(self, statepact_clock: ManualClock) -> ManualClock:
        """The suite's clock is the plugin's ``statepact_clock``: build the backing with either."""
        return statepact_clock

    @pytest.fixture
    def manager(self, tx_backend: StorageBackend) -> TransactionManager:
        return TransactionManager(tx_backend)

    # -- commits, reads, deletes -------------------------------------------------------------

    async def test_commit_then_read(self, manager: TransactionManager) -> None:
        """A committed write is read back, equal, by a later transaction; JSON types survive."""
        value = {"state": "paid", "lines": [1, 2.5, "x", True, None], "n": {"deep": [{}]}}
        result = await _commit_value(manager, "o1", value)
        assert result == CommitResult(version=1, replayed=False)
        assert await _read_value(manager, "o1") == value
        for scalar in ([1, 2], "text", 42, 0.5, False):
            await _commit_value(manager, "scalar", scalar)
            assert await _read_value(manager, "scalar") == scalar

    async def test_absent_key_reads_none(self, manager: TransactionManager) -> None:
        """A key never written reads as None."""
        assert await _read_value(manager, "nope") is None
        assert await manager.history(R, "nope") == []

    async def test_versions_are_the_commit_sequence(self, manager: TransactionManager) -> None:
        """Each writing commit gets the next sequence number, starting at 1 on an empty backend."""
        versions = [(await _commit_value(manager, f"k{i}", i)).version for i in range(3)]
        assert versions == [1, 2, 3]
        async with manager.transaction() as tx:
            tx.write(R, "a", 1)
            tx.write("other", "b", 2)
        assert tx.result.version == 4
        assert [e.version for e in await manager.history("other", "b")] == [4]

    async def test_delete(self, manager: TransactionManager) -> None:
        """A committed delete makes the key read as None and is a version in its history."""
        await _commit_value(manager, "o1", {"v": 1})
        async with manager.transaction() as tx:
            tx.delete(R, "o1")
        assert tx.result.version == 2
        assert await _read_value(manager, "o1") is None
        history = await manager.history(R, "o1")
        assert [(e.version, e.value, e.deleted) for e in history] == [
            (2, None, True),
            (1, {"v": 1}, False),
        ]
        await _commit_value(manager, "o1", {"v": 3})
        assert await _read_value(manager, "o1") == {"v": 3}

    async def test_read_your_own_writes(self, manager: TransactionManager) -> None:
        """A transaction reads its own buffered writes and deletes, last one winning."""
        await _commit_value(manager, "gone", "before")
        async with manager.transaction() as tx:
            tx.write(R, "o1", {"v": 1})
            assert await tx.read(R, "o1") == {"v": 1}
            tx.write(R, "o1", {"v": 2})
            assert await tx.read(R, "o1") == {"v": 2}
            tx.delete(R, "o1")
            assert await tx.read(R, "o1") is None
            tx.write(R, "o1", {"v": 3})
            tx.delete(R, "gone")
            assert await tx.read(R, "gone") is None
        assert await _read_value(manager, "o1") == {"v": 3}
        assert await _read_value(manager, "gone") is None
        assert [e.version for e in await manager.history(R, "o1")] == [2]

    async def test_read_returns_a_copy(self, manager: TransactionManager) -> None:
        """Mutating a value after write or read changes nothing stored or buffered."""
        value = {"items": [1]}
        async with manager.transaction() as tx:
            tx.write(R, "o1", value)
            value["items"].append(2)
            seen = await tx.read(R, "o1")
            seen["items"].append(3)
            assert await tx.read(R, "o1") == {"items": [1]}
        assert await _read_value(manager, "o1") == {"items": [1]}

    async def test_rollback_on_exception_applies_nothing(self, manager: TransactionManager) -> None:
        """An exception inside the block rolls the transaction back: nothing is applied."""

        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            async with manager.transaction() as tx:
                tx.write(R, "o1", 1)
                raise Boom
        assert await _read_value(manager, "o1") is None
        with pytest.raises(RuntimeError):
            _ = tx.result
        assert (await _commit_value(manager, "o2", 2)).version == 1

    async def test_history_newest_first(
        self, manager: TransactionManager, clock: ManualClock
    ) -> None:
        """history lists committed versions newest first, with the injected clock's time."""
        times = []
        for value in range(4):
            times.append(clock.now())
            await _commit_value(manager, "o1", {"v": value})
            clock.advance(10)
        history = await manager.history(R, "o1")
        assert [e.version for e in history] == [4, 3, 2, 1]
        assert [e.value for e in history] == [{"v": 3}, {"v": 2}, {"v": 1}, {"v": 0}]
        assert [e.committed_at for e in history] == times[::-1]
        assert [e.version for e in await manager.history(R, "o1", limit=2)] == [4, 3]

    async def test_snapshot_reads_the_version_current_at_taken_at(
        self, manager: TransactionManager
    ) -> None:
        """A snapshot reads the newest version at or before taken_at, after later commits."""
        await _commit_value(manager, "o1", "v1")
        reader = await manager.begin("snapshot")
        assert reader.taken_at == 1
        await _commit_value(manager, "o1", "v2")
        await _commit_value(manager, "o1", "v3")
        await _commit_value(manager, "new", "created later")
        async with manager.transaction() as tx:
            tx.delete(R, "o1")
        assert await reader.read(R, "o1") == "v1"
        assert await reader.read(R, "new") is None
        assert (await reader.commit()).version == 1
        assert await _read_value(manager, "o1") is None

    async def test_read_only_commits_do_not_advance_the_sequence(
        self, manager: TransactionManager
    ) -> None:
        """A commit that writes nothing returns its snapshot sequence and does not advance it."""
        await _commit_value(manager, "o1", 1)
        for isolation in ISOLATIONS:
            async with manager.transaction(isolation) as tx:
                await tx.read(R, "o1")
            assert tx.result == CommitResult(1)
        async with manager.transaction("serializable", idempotency_key="read-only") as tx:
            await tx.read(R, "o1")
        assert tx.result == CommitResult(1)
        assert (await _commit_value(manager, "o2", 2)).version == 2

    # -- idempotency ------------------------------------------------------------------------

    async def test_idempotent_replay_applies_once(self, manager: TransactionManager) -> None:
        """The same key and request replays the first CommitResult (replayed=True), applied once."""
        async with manager.transaction(idempotency_key="pay-1") as tx:
            tx.write(R, "o1", {"state": "paid", "amount": 5})
        first = tx.result
        assert first == CommitResult(1, replayed=False)
        await _commit_value(manager, "o1", {"state": "shipped"})
        async with manager.transaction(idempotency_key="pay-1") as again:
            # Same writes, object keys in another order: the same request.
            assert await again.read(R, "o1") == {"state": "shipped"}
            again.write(R, "o1", {"amount": 5, "state": "paid"})
        assert again.result == CommitResult(1, replayed=True)
        assert await _read_value(manager, "o1") == {"state": "shipped"}
        assert [e.version for e in await manager.history(R, "o1")] == [2, 1]

    async def test_idempotency_key_with_a_different_request_is_refused(
        self, manager: TransactionManager
    ) -> None:
        """The same key with different writes raises IdempotencyConflictError; nothing applied."""
        async with manager.transaction(idempotency_key="pay-1") as tx:
            tx.write(R, "o1", {"amount": 5})
        with pytest.raises(IdempotencyConflictError) as caught:
            async with manager.transaction(idempotency_key="pay-1") as tx:
                tx.write(R, "o1", {"amount": 6})
                tx.write(R, "o2", {"extra": True})
        assert caught.value.key == "pay-1"
        assert await _read_value(manager, "o1") == {"amount": 5}
        assert await _read_value(manager, "o2") is None
        assert (await _commit_value(manager, "o3", 1)).version == 2

    async def test_conflicting_commit_leaves_no_idempotency_record(
        self, manager: TransactionManager
    ) -> None:
        """A commit refused by validation records nothing: the key can commit afterwards."""
        await _commit_value(manager, "o1", 0)
        tx = await manager.begin("snapshot", idempotency_key="k")
        tx.write(R, "o1", 1)
        await _commit_value(manager, "o1", 2)
        with pytest.raises(ConflictError):
            await tx.commit()
        async with manager.transaction(idempotency_key="k") as retry:
            retry.write(R, "o1", 1)
        assert retry.result == CommitResult(3, replayed=False)

    # -- leases and fencing ---------------------------------------------------------------------

    async def test_lease_tokens_strictly_increase(
        self, manager: TransactionManager, clock: ManualClock
    ) -> None:
        """Tokens strictly increase per resource across acquire, expiry, re-acquire and release."""
        first = await manager.acquire_lease("job", "w1", 10)
        assert first is not None
        assert (first.resource, first.owner, first.ttl) == ("job", "w1", 10.0)
        assert first.expires_at == clock.now() + timedelta(seconds=10)
        again = await manager.acquire_lease("job", "w1", 10)
        assert again is not None and again.token > first.token
        clock.advance(11)
        taken = await manager.acquire_lease("job", "w2", 5)
        assert taken is not None and taken.token > again.token and taken.owner == "w2"
        assert await manager.release_lease(taken) is True
        after_release = await manager.acquire_lease("job", "w3", 5)
        assert after_release is not None and after_release.token > taken.token
        other = await manager.acquire_lease("other-job", "w1", 5)
        assert other is not None

    async def test_live_lease_is_not_granted_to_another_owner(
        self, manager: TransactionManager, clock: ManualClock
    ) -> None:
        """acquire_lease returns None while another owner holds a live lease, changing nothing."""
        held = await manager.acquire_lease("job", "w1", 10)
        assert held is not None
        clock.advance(9.9)
        assert await manager.acquire_lease("job", "w2", 10) is None
        renewed = await manager.renew_lease(held)
        assert renewed.token == held.token
        clock.advance(10)  # exactly at expiry: expired
        taken = await manager.acquire_lease("job", "w2", 10)
        assert taken is not None and taken.token > held.token

    async def test_renew_extends_and_keeps_the_token(
        self, manager: TransactionManager, clock: ManualClock
    ) -> None:
        """renew_lease moves expires_at to now + ttl and keeps the token."""
        lease = await manager.acquire_lease("job", "w1", 10)
        assert lease is not None
        clock.advance(5)
        renewed = await manager.renew_lease(lease)
        assert renewed.token == lease.token
        assert renewed.expires_at == clock.now() + timedelta(seconds=10)
        longer = await manager.renew_lease(renewed, ttl=timedelta(minutes=1))
        assert longer.expires_at == clock.now() + timedelta(minutes=1) and longer.ttl == 60.0

    async def test_renew_of_a_lost_lease_fails(
        self, manager: TransactionManager, clock: ManualClock
    ) -> None:
        """Renewing an expired or taken-over lease raises LeaseLostError and changes nothing."""
        lease = await manager.acquire_lease("job", "w1", 10)
        assert lease is not None
        clock.advance(10)
        with pytest.raises(LeaseLostError):
            await manager.renew_lease(lease)
        taken = await manager.acquire_lease("job", "w2", 10)
        assert taken is not None
        with pytest.raises(LeaseLostError):
            await manager.renew_lease(lease)
        assert await manager.acquire_lease("job", "w3", 10) is None  # w2 still holds it
        assert (await manager.renew_lease(taken)).token == taken.token

    async def test_release_only_the_current_lease(
        self, manager: TransactionManager, clock: ManualClock
    ) -> None:
        """release_lease of a stale lease returns False and leaves the current holder alone."""
        old = await manager.acquire_lease("job", "w1", 10)
        assert old is not None
        clock.advance(10)
        current = await manager.acquire_lease("job", "w2", 10)
        assert current is not None
        assert await manager.release_lease(old) is False
        assert await manager.acquire_lease("job", "w3", 10) is None
        assert await manager.release_lease(current) is True
        assert await manager.release_lease(current) is False
        assert await manager.acquire_lease("job", "w3", 10) is not None

    async def test_stale_fencing_token_is_refused(
        self, manager: TransactionManager, clock: ManualClock
    ) -> None:
        """A commit fenced by a token below the highest issued raises FencingError; not applied."""
        old = await manager.acquire_lease("job", "w1", 10)
        assert old is not None
        async with manager.transaction(fencing=old) as tx:
            tx.write(R, "o1", "by w1")
        clock.advance(10)
        new = await manager.acquire_lease("job", "w2", 10)
        assert new is not None
        with pytest.raises(FencingError) as caught:
            async with manager.transaction(fencing=old) as tx:
                tx.write(R, "o1", "late w1")
        assert (caught.value.resource, caught.value.token) == ("job", old.token)
        assert caught.value.highest == new.token
        assert await _read_value(manager, "o1") == "by w1"
        async with manager.transaction(fencing=new) as tx:
            tx.write(R, "o1", "by w2")
        assert tx.result.version == 2
        assert await _read_value(manager, "o1") == "by w2"

    async def test_fencing_checks_the_token_not_the_expiry(
        self, manager: TransactionManager, clock: ManualClock
    ) -> None:
        """An expired lease whose token is still the highest issued still fences successfully."""
        lease = await manager.acquire_lease("job", "w1", 10)
        assert lease is not None
        clock.advance(60)
        async with manager.transaction(fencing=lease) as tx:
            tx.write(R, "o1", 1)
        assert tx.result.version == 1

    async def test_concurrent_acquisitions_grant_one(self, manager: TransactionManager) -> None:
        """Of many owners acquiring one resource at once, exactly one gets the lease."""
        leases = await asyncio.gather(
            *(manager.acquire_lease("job", f"w{i}", 30) for i in range(10))
        )
        granted = [lease for lease in leases if lease is not None]
        assert len(granted) == 1

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

    # -- Hermitage-style interleavings -------------------------------------------------------

    async def _seed(self, manager: TransactionManager, **values: Any) -> None:
        async with manager.transaction() as tx:
            for key, value in values.items():
                tx.write(R, key, value)

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_no_dirty_write(self, manager: TransactionManager, isolation: str) -> None:
        """G0: two transactions writing the same two keys never leave a mix of both."""
        await self._seed(manager, x=10, y=20)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        t1.write(R, "x", 11)
        t2.write(R, "x", 12)
        t1.write(R, "y", 21)
        t2.write(R, "y", 22)
        await t1.commit()
        if isolation == "read_committed":
            await t2.commit()
            expected = (12, 22)
        else:
            with pytest.raises(ConflictError):
                await t2.commit()
            expected = (11, 21)
        assert (await _read_value(manager, "x"), await _read_value(manager, "y")) == expected

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_no_aborted_read(self, manager: TransactionManager, isolation: str) -> None:
        """G1a: a write of a transaction that rolled back is never read."""
        await self._seed(manager, x=10)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        t1.write(R, "x", 101)
        assert await t2.read(R, "x") == 10
        await t1.rollback()
        assert await t2.read(R, "x") == 10
        await t2.commit()
        assert await _read_value(manager, "x") == 10

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_no_intermediate_read(self, manager: TransactionManager, isolation: str) -> None:
        """G1b: only a transaction's final write is ever read, and only once committed."""
        await self._seed(manager, x=10)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        t1.write(R, "x", 101)
        assert await t2.read(R, "x") == 10
        t1.write(R, "x", 11)
        await t1.commit()
        expected = 11 if isolation == "read_committed" else 10
        assert await t2.read(R, "x") == expected
        if isolation == "serializable":
            with pytest.raises(ConflictError):
                await t2.commit()  # what it read was replaced before it committed
        else:
            await t2.commit()

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_no_circular_information_flow(
        self, manager: TransactionManager, isolation: str
    ) -> None:
        """G1c: two transactions cannot each see the other's uncommitted write."""
        await self._seed(manager, x=10, y=20)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        t1.write(R, "x", 11)
        t2.write(R, "y", 22)
        assert await t1.read(R, "y") == 20
        assert await t2.read(R, "x") == 10
        await t1.commit()
        if isolation == "serializable":
            # t2 read x, which t1 has since replaced: backward validation refuses it.
            with pytest.raises(ConflictError):
                await t2.commit()
            assert await _read_value(manager, "y") == 20
        else:
            await t2.commit()
            assert await _read_value(manager, "y") == 22
        assert await _read_value(manager, "x") == 11

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_lost_update(self, manager: TransactionManager, isolation: str) -> None:
        """P4: a read-modify-write race loses an update only under read_committed."""
        await self._seed(manager, x=10)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        v1 = await t1.read(R, "x")
        v2 = await t2.read(R, "x")
        t1.write(R, "x", v1 + 1)
        t2.write(R, "x", v2 + 1)
        await t1.commit()
        if isolation == "read_committed":
            await t2.commit()  # the lost update read_committed allows
        else:
            with pytest.raises(ConflictError) as caught:
                await t2.commit()
            assert (caught.value.resource, caught.value.key) == (R, "x")
        assert await _read_value(manager, "x") == 11

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_read_skew(self, manager: TransactionManager, isolation: str) -> None:
        """G-single: a reader sees both keys from one moment, except under read_committed."""
        await self._seed(manager, x=50, y=50)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        assert await t1.read(R, "x") == 50
        t2.write(R, "x", 25)
        t2.write(R, "y", 75)
        await t2.commit()
        y = await t1.read(R, "y")
        if isolation == "read_committed":
            assert y == 75  # the skewed total read_committed allows
            await t1.commit()
        else:
            assert y == 50
            if isolation == "serializable":
                with pytest.raises(ConflictError):
                    await t1.commit()  # read x has been replaced since
            else:
                await t1.commit()

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_write_skew(self, manager: TransactionManager, isolation: str) -> None:
        """G2-item: two on-call doctors both leave under snapshot; serializable refuses one."""
        await self._seed(manager, alice=True, bob=True)
        t1 = await manager.begin(isolation)
        t2 = await manager.begin(isolation)
        on_call_1 = [await t1.read(R, "alice"), await t1.read(R, "bob")]
        on_call_2 = [await t2.read(R, "alice"), await t2.read(R, "bob")]
        assert on_call_1 == on_call_2 == [True, True]
        t1.write(R, "alice", False)
        t2.write(R, "bob", False)
        await t1.commit()
        if isolation == "serializable":
            with pytest.raises(ConflictError) as caught:
                await t2.commit()
            assert (caught.value.resource, caught.value.key) == (R, "alice")
            assert await _read_value(manager, "bob") is True
        else:
            await t2.commit()  # the write skew snapshot allows
            assert await _read_value(manager, "bob") is False
        assert await _read_value(manager, "alice") is False

    # -- three-transaction interleavings ---------------------------------------------------

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_read_only_anomaly(self, manager: TransactionManager, isolation: str) -> None:
        """Fekete's read-only anomaly: all three commit under snapshot; serializable refuses one."""
        await self._seed(manager, checking=0, savings=0)
        withdraw = await manager.begin(isolation)
        seen = [await withdraw.read(R, "checking"), await withdraw.read(R, "savings")]
        assert seen == [0, 0]
        deposit = await manager.begin(isolation)
        deposit.write(R, "savings", await deposit.read(R, "savings") + 20)
        await deposit.commit()
        report = await manager.begin(isolation)
        # The report sees the deposit but not the withdrawal: deposit, report, withdrawal in
        # any serial order. The withdrawal saw no deposit (and charges the overdraft fee of
        # 1): withdrawal before deposit. If all three commit, no serial order exists.
        assert [await report.read(R, "checking"), await report.read(R, "savings")] == [0, 20]
        await report.commit()
        withdraw.write(R, "checking", seen[0] - 10 - (1 if sum(seen) < 10 else 0))
        if isolation == "serializable":
            with pytest.raises(ConflictError) as caught:
                await withdraw.commit()  # what it read of savings was replaced
            assert (caught.value.resource, caught.value.key) == (R, "savings")
            expected = [0, 20]
        else:
            await withdraw.commit()  # the anomaly: no serial order shows the report [0, 20]
            expected = [-11, 20]
        stored = [await _read_value(manager, key) for key in ("checking", "savings")]
        assert stored == expected

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_three_transaction_write_skew(
        self, manager: TransactionManager, isolation: str
    ) -> None:
        """G2 over three: each overwrites what the previous one read; serializable refuses one."""
        await self._seed(manager, x=0, y=0, z=0)
        t1, t2, t3 = [await manager.begin(isolation) for _ in range(3)]
        # Read-write dependencies t1 -> t3 (x), t3 -> t2 (z), t2 -> t1 (y): a cycle.
        t1.write(R, "y", await t1.read(R, "x") + 1)
        t2.write(R, "z", await t2.read(R, "y") + 1)
        t3.write(R, "x", await t3.read(R, "z") + 1)
        await t1.commit()
        if isolation == "serializable":
            with pytest.raises(ConflictError) as caught:
                await t2.commit()  # read y, which t1 has since replaced
            assert (caught.value.resource, caught.value.key) == (R, "y")
            await t3.commit()  # z was never replaced: t1 then t3 is a serial order
            expected = (1, 1, 0)
        else:
            await t2.commit()
            await t3.commit()  # all three read 0: no serial order gives every key 1
            expected = (1, 1, 1)
        stored = tuple([await _read_value(manager, key) for key in ("x", "y", "z")])
        assert stored == expected

    @pytest.mark.parametrize("isolation", ISOLATIONS)
    async def test_three_transaction_lost_update(
        self, manager: TransactionManager, isolation: str
    ) -> None:
        """Three read-modify-writes of one key: read_committed keeps the last; others the first."""
        await self._seed(manager, counter=0)
        txns = [await manager.begin(isolation) for _ in range(3)]
        for tx, amount in zip(txns, (1, 10, 100), strict=True):
            tx.write(R, "counter", await tx.read(R, "counter") + amount)
        outcomes: list[str] = []
        for tx in txns:
            try:
                await tx.commit()
                outcomes.append("committed")
            except ConflictError as exc:
                assert (exc.resource, exc.key) == (R, "counter")
                outcomes.append("refused")
        if isolation == "read_committed":
            assert outcomes == ["committed"] * 3
            assert await _read_value(manager, "counter") == 100  # two updates lost
        else:
            assert outcomes == ["committed", "refused", "refused"]
            assert await _read_value(manager, "counter") == 1
        history = await manager.history(R, "counter")
        assert len(history) == 1 + outcomes.count("committed")

    async def test_serializable_validates_reads_of_absent_keys(
        self, manager: TransactionManager
    ) -> None:
        """A key read as absent and created since refuses a serializable commit."""
        t1 = await manager.begin("serializable")
        assert await t1.read(R, "slot-9") is None
        await _commit_value(manager, "slot-9", "booked by another")
        t1.write(R, "booking", "slot-9")
        with pytest.raises(ConflictError) as caught:
            await t1.commit()
        assert (caught.value.resource, caught.value.key) == (R, "slot-9")
        assert await _read_value(manager, "booking") is None

    async def test_read_committed_reads_the_latest_commit(
        self, manager: TransactionManager
    ) -> None:
        """Under read_committed each read sees the newest committed version."""
        await self._seed(manager, x=1)
        t1 = await manager.begin("read_committed")
        assert await t1.read(R, "x") == 1
        await _commit_value(manager, "x", 2)
        assert await t1.read(R, "x") == 2
        await t1.commit()

    # -- bad input -----------------------------------------------------------------------------

    async def test_bad_input_is_refused_with_nothing_applied(
        self, manager: TransactionManager
    ) -> None:
        """Bad isolation, ids, values and TTLs raise ValueError/TypeError naming the field."""
        with pytest.raises(ValueError, match="isolation"):
            manager.transaction("repeatable_read")
        with pytest.raises(ValueError, match="idempotency_key"):
            manager.transaction(idempotency_key="")
        with pytest.raises(TypeError, match="fencing"):
            manager.transaction(fencing="token-7")  # type: ignore[arg-type]
        async with manager.transaction() as tx:
            tx.write(R, "good", 1)
            with pytest.raises(ValueError, match="resource"):
                tx.write("", "k", 1)
            with pytest.raises(ValueError, match="key"):
                tx.write(R, "", 1)
            with pytest.raises(ValueError, match="key"):
                await tx.read(R, "")
            with pytest.raises(ValueError, match="value"):
                tx.write(R, "k", {"when": object()})
            with pytest.raises(ValueError, match="value"):
                tx.write(R, "k", float("nan"))
            with pytest.raises(ValueError, match="value"):
                tx.write(R, "k", {1: "non-string key"})
            with pytest.raises(ValueError, match="value"):
                tx.write(R, "k", None)
            with pytest.raises(ValueError, match="mode"):
                await tx.lock(R, "k", mode="upgrade")
            with pytest.raises(ValueError, match="timeout"):
                await tx.lock(R, "k", timeout=-1)
        assert tx.result.version == 1
        assert await _read_value(manager, "k") is None
        assert await manager.history(R, "k") == []
        with pytest.raises(ValueError, match="ttl"):
            await manager.acquire_lease("job", "w1", -5)
        with pytest.raises(ValueError, match="ttl"):
            await manager.acquire_lease("job", "w1", 0)
        with pytest.raises(ValueError, match="owner"):
            await manager.acquire_lease("job", "", 5)
        assert (await manager.acquire_lease("job", "w1", 5)) is not None
        with pytest.raises(ValueError, match="limit"):
            await manager.history(R, "good", limit=0)
        with pytest.raises(ValueError, match="metadata"):
            await manager.register_resource("r", {"bad": float("inf")})
        assert await manager.resource_info("r") is None

    async def test_oversized_value_is_refused(self, manager: TransactionManager) -> None:
        """A value over max_value_bytes raises StatePersistenceError(too_large) before commit."""
        async with manager.transaction() as tx:
            with pytest.raises(StatePersistenceError) as caught:
                tx.write(R, "big", "x" * 300_000)
        assert caught.value.reason == "too_large" and not caught.value.retryable
        assert await _read_value(manager, "big") is None

    @EACH_ACCEPTED_JSON
    async def test_json_values_beyond_dict_and_list_are_stored_as_plain_json(
        self, manager: TransactionManager, value: Any, stored: Any
    ) -> None:
        """Any Mapping is a JSON object, a tuple an array, a str/int/float subclass its plain
        value, nested or at the top of a value, and in resource metadata."""
        async with manager.transaction() as tx:
            tx.write(R, "nested", {"a": {"b": value}})
            tx.write(R, "top", value)
        await manager.register_resource(R, {"a": {"b": value}})
        nested, top = await _read_value(manager, "nested"), await _read_value(manager, "top")
        assert nested == {"a": {"b": stored}}
        assert top == stored
        [entry] = await manager.history(R, "top")
        assert entry.value == stored
        info = await manager.resource_info(R)
        assert info is not None and info.metadata == {"a": {"b": stored}}
        for found in (nested, top, entry.value, info.metadata):
            assert_plain_json(found)

    @EACH_REFUSED_JSON
    async def test_values_json_cannot_hold_are_refused_naming_where(
        self, manager: TransactionManager, value: Any, says: str
    ) -> None:
        """A value or metadata JSON cannot hold exactly raises ValueError naming the path
        (value['a']['b'], metadata['a']['b']); nothing is applied."""
        async with manager.transaction() as tx:
            with pytest.raises(ValueError) as in_value:
                tx.write(R, "k", {"a": {"b": value}})
        with pytest.raises(ValueError) as in_metadata:
            await manager.register_resource(R, {"a": {"b": value}})
        for caught, field in ((in_value, "value"), (in_metadata, "metadata")):
            assert_refused_at(caught.value, f"{field}['a']['b']", says)
        assert await _read_value(manager, "k") is None
        assert await manager.history(R, "k") == []
        assert await manager.resource_info(R) is None

    @EACH_BROKEN_CLOCK
    async def test_a_clock_without_a_timezone_is_refused_naming_the_clock(
        self,
        manager: TransactionManager,
        clock: ManualClock,
        monkeypatch: pytest.MonkeyPatch,
        reading: Any,
        error: type[Exception],
    ) -> None:
        """A clock whose now() is naive or not a datetime is refused naming the clock by a
        commit, the lease calls and register_resource; nothing is applied."""
        await _commit_value(manager, "k", 1)
        lease = await manager.acquire_lease("job", "w1", 10)
        assert lease is not None
        monkeypatch.setattr(clock, "now", lambda: reading)

        async def commit() -> None:
            async with manager.transaction() as tx:
                tx.write(R, "k", 2)

        calls: list[Callable[[], Awaitable[Any]]] = [
            commit,
            lambda: manager.acquire_lease("other", "w1", 10),
            lambda: manager.renew_lease(lease),
            lambda: manager.release_lease(lease),
            lambda: manager.register_resource(R, {"x": 1}),
        ]
        for call in calls:
            with pytest.raises(error, match=r"^clock"):
                await call()
        monkeypatch.undo()
        assert await _read_value(manager, "k") == 1
        assert len(await manager.history(R, "k")) == 1
        info = await manager.resource_info(R)
        assert info is not None and info.metadata == {}
        assert await manager.acquire_lease("other", "w2", 10) is not None
        assert await manager.acquire_lease("job", "w2", 10) is None  # w1's lease still holds
        renewed = await manager.renew_lease(lease)
        assert renewed.token == lease.token

    async def test_a_clock_in_another_zone_is_stored_as_utc(
        self, manager: TransactionManager, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An aware reading in another zone is the same instant, stored and returned in UTC."""
        monkeypatch.setattr(clock, "now", lambda: AWARE_ELSEWHERE)
        await _commit_value(manager, "k", 1)
        lease = await manager.acquire_lease("job", "w1", 10)
        assert lease is not None
        [entry] = await manager.history(R, "k")
        info = await manager.resource_info(R)
        assert info is not None
        moments = [entry.committed_at, info.last_commit_at, lease.expires_at]
        for moment in moments:
            assert moment is not None and moment.utcoffset() == timedelta(0)
            assert moment == moment.astimezone(UTC)
        assert entry.committed_at == info.last_commit_at == AWARE_ELSEWHERE
        assert lease.expires_at == AWARE_ELSEWHERE + timedelta(seconds=10)

    # -- manager.run ---------------------------------------------------------------------------

    async def test_run_retries_conflicts_on_a_hot_key(self, manager: TransactionManager) -> None:
        """20 concurrent increments of one key through manager.run end at exactly 20."""
        attempts = 0

        async def increment(tx: Transaction) -> int:
            nonlocal attempts
            attempts += 1
            current = await tx.read(R, "counter") or 0
            await asyncio.sleep(0)  # let the others read the same version
            tx.write(R, "counter", current + 1)
            return int(current + 1)

        results = await asyncio.gather(*(manager.run(increment, retries=100) for _ in range(20)))
        assert sorted(results) == list(range(1, 21))
        assert await _read_value(manager, "counter") == 20
        assert attempts > 20  # conflicts did happen and were retried

    async def test_run_gives_up_after_retries(self, manager: TransactionManager) -> None:
        """run raises the last ConflictError once its retries are spent, applying nothing."""
        calls = 0

        async def always_loses(tx: Transaction) -> None:
            nonlocal calls
            calls += 1
            await tx.read(R, "x")
            await _commit_value(manager, "x", calls)  # a rival commits first, every time
            tx.write(R, "x", "mine")

        with pytest.raises(ConflictError):
            await manager.run(always_loses, retries=2)
        assert calls == 3
        assert await _read_value(manager, "x") == 3

    async def test_run_does_not_retry_other_errors(self, manager: TransactionManager) -> None:
        """An error that is not a conflict propagates at once, and nothing is applied."""
        calls = 0

        async def fails(tx: Transaction) -> None:
            nonlocal calls
            calls += 1
            tx.write(R, "x", 1)
            raise KeyError("not a conflict")

        with pytest.raises(KeyError):
            await manager.run(fails)
        assert calls == 1
        assert await _read_value(manager, "x") is None

    # -- hot keys ------------------------------------------------------------------------------

    async def _heat(self, manager: TransactionManager, key: str) -> None:
        """Make ``key`` hot in ``manager``: two transactions read it, one commit is refused."""
        first = manager.transaction()
        second = manager.transaction()
        async with first, second:
            seen = await first.read(R, key)
            await second.read(R, key)
            first.write(R, key, seen + 1)
            second.write(R, key, seen + 1)
            await first.commit()
            with pytest.raises(ConflictError):
                await second.commit()

    async def _hold_and_follow(
        self, manager: TransactionManager
    ) -> tuple[asyncio.Task[None], asyncio.Event, asyncio.Task[int]]:
        """A transaction that has read the hot key and waits to be let go (the holder), and
        one whose first read is of the same key (the follower, answering what it read)."""
        have_read = asyncio.Event()
        let_go = asyncio.Event()

        async def hold() -> None:
            async with manager.transaction() as tx:
                seen = await tx.read(R, "hot")
                have_read.set()
                await let_go.wait()
                tx.write(R, "hot", seen + 1)

        async def follow() -> int:
            async with manager.transaction() as tx:
                seen = int(await tx.read(R, "hot"))
                tx.write(R, "hot", seen + 1)
            return seen

        holder = asyncio.create_task(hold())
        await have_read.wait()
        return holder, let_go, asyncio.create_task(follow())

    async def test_after_a_conflict_the_keys_readers_take_turns(
        self, tx_backend: StorageBackend
    ) -> None:
        """Once a key has had a conflict, a transaction whose first read is of that key
        waits for the transaction holding the key's turn to end, then reads its commit:
        neither is refused."""
        manager = TransactionManager(tx_backend, hot_key_turn=30)
        await _commit_value(manager, "hot", 0)
        await self._heat(manager, "hot")  # hot at 1
        holder, let_go, follower = await self._hold_and_follow(manager)
        await asyncio.sleep(0.05)
        assert not follower.done()  # its first read waits for the holder's turn
        let_go.set()
        await holder
        assert await asyncio.wait_for(follower, 5) == 2  # it read the holder's commit
        assert await _read_value(manager, "hot") == 3

    async def test_a_turn_held_past_hot_key_turn_is_passed_on(
        self, tx_backend: StorageBackend
    ) -> None:
        """A holder that keeps its turn longer than ``hot_key_turn`` no longer holds the
        line up: the next reads, and the first to commit wins as without turns."""
        manager = TransactionManager(tx_backend, hot_key_turn=0.05)
        await _commit_value(manager, "hot", 0)
        await self._heat(manager, "hot")
        holder, let_go, follower = await self._hold_and_follow(manager)
        assert await asyncio.wait_for(follower, 5) == 1  # went ahead while the holder held
        assert not holder.done()
        let_go.set()
        with pytest.raises(ConflictError):
            await holder
        assert await _read_value(manager, "hot") == 2

    async def test_without_turns_a_hot_keys_readers_do_not_wait(
        self, tx_backend: StorageBackend
    ) -> None:
        """``hot_key_turn=None``: every first read is sent at once, conflict or not."""
        manager = TransactionManager(tx_backend, hot_key_turn=None)
        await _commit_value(manager, "hot", 0)
        await self._heat(manager, "hot")
        holder, let_go, follower = await self._hold_and_follow(manager)
        assert await asyncio.wait_for(follower, 5) == 1
        let_go.set()
        with pytest.raises(ConflictError):
            await holder

    async def test_a_cancelled_holder_passes_its_turn_on(self, tx_backend: StorageBackend) -> None:
        """A holder cancelled mid-transaction rolls back and hands the turn to the next in
        line at once (not ``hot_key_turn`` later)."""
        manager = TransactionManager(tx_backend, hot_key_turn=30)
        await _commit_value(manager, "hot", 0)
        await self._heat(manager, "hot")
        holder, _let_go, follower = await self._hold_and_follow(manager)
        await asyncio.sleep(0.02)
        assert not follower.done()
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
        assert await asyncio.wait_for(follower, 5) == 1  # the holder wrote nothing
        assert await _read_value(manager, "hot") == 2

    # -- registry and operations --------------------------------------------------------------

    async def test_register_resource(self, manager: TransactionManager, clock: ManualClock) -> None:
        """register_resource stores metadata; commits record the resource's version and time."""
        assert await manager.resource_info(R) is None
        await manager.register_resource(R, {"owner": "billing"})
        info = await manager.resource_info(R)
        assert info is not None
        assert (info.name, info.metadata, info.version, info.last_commit_at) == (
            R,
            {"owner": "billing"},
            0,
            None,
        )
        clock.advance(3)
        await _commit_value(manager, "o1", 1)
        info = await manager.resource_info(R)
        assert info is not None
        assert (info.metadata, info.version, info.last_commit_at) == (
            {"owner": "billing"},
            1,
            clock.now(),
        )
        await manager.register_resource(R, {"owner": "ops"})
        info = await manager.resource_info(R)
        assert info is not None and info.metadata == {"owner": "ops"} and info.version == 1
        async with manager.transaction() as tx:
            tx.write("implicit", "k", 1)
        implicit = await manager.resource_info("implicit")
        assert implicit is not None and implicit.metadata == {} and implicit.version == 2

    async def test_health_check(self, manager: TransactionManager) -> None:
        """health_check answers True on an open backend."""
        assert await manager.health_check() is True

    async def test_clear_empties_the_backend(
        self, manager: TransactionManager, tx_backend: StorageBackend
    ) -> None:
        """clear removes values, history, leases and idempotency records; the sequence restarts."""
        await _commit_value(manager, "o1", 1)
        async with manager.transaction(idempotency_key="once") as tx:
            tx.write(R, "o2", 2)
        lease = await manager.acquire_lease("job", "w1", 60)
        assert lease is not None
        await tx_backend.clear()
        assert await _read_value(manager, "o1") is None
        assert await manager.history(R, "o1") == []
        assert await manager.resource_info(R) is None
        # The old holder's lease is gone: another owner gets one at once.
        again = await manager.acquire_lease("job", "w2", 60)
        assert again is not None and again.owner == "w2"
        async with manager.transaction(idempotency_key="once") as tx:
            tx.write(R, "o2", "different")
        assert tx.result == CommitResult(1, replayed=False)

    # -- the isolation checker on real interleavings --------------------------------------------

    async def _random_history(
        self,
        manager: TransactionManager,
        isolation: str,
        *,
        txns: int = 40,
        keys: int = 4,
        seed: int = 7,
    ) -> list[TxnRecord]:
        """Concurrent random list-append transactions, each attempt recorded, then a final read."""
        rng = random.Random(seed)
        history: list[TxnRecord] = []
        counter = iter(range(1, 1_000_000))

        async def one(n: int) -> None:
            plan = [
                (rng.choice(["append", "read"]), f"k{rng.randrange(keys)}")
                for _ in range(rng.randint(1, 4))
            ]
            doomed = rng.random() < 0.1
            attempts: list[TxnRecord] = []

            async def body(tx: Transaction) -> None:
                record = TxnRecord(f"t{n}.{len(attempts) + 1}")
                attempts.append(record)
                history.append(record)
                for kind, key in plan:
                    if kind == "append":
                        await record_append(tx, record, "lists", key, next(counter))
                    else:
                        await record_read(tx, record, "lists", key)
                    await asyncio.sleep(0)
                if doomed:
                    raise _Abort

            try:
                await manager.run(body, isolation=isolation, retries=200)
            except _Abort:
                return
            # Only the last attempt committed; the earlier ones were rolled back.
            attempts[-1].committed = True

        await asyncio.gather(*(one(n) for n in range(txns)))
        final = TxnRecord("final", committed=True)
        async with manager.transaction() as tx:
            for k in range(keys):
                await record_read(tx, final, "lists", f"k{k}")
        history.append(final)
        return history

    async def test_isolation_checker_finds_nothing_under_serializable(
        self, manager: TransactionManager
    ) -> None:
        """Concurrent random serializable transactions show no G0, G1 or G2 anomaly."""
        history = await self._random_history(manager, "serializable")
        assert check_history(history) == []
        committed = [r for r in history if r.committed]
        assert len(committed) > 20
        assert any(  # not vacuous: transactions did read each other's appends
            op.kind == "read" and op.value for r in committed for op in r.ops
        )

    async def test_isolation_checker_finds_no_g0_g1_under_weaker_levels(
        self, manager: TransactionManager
    ) -> None:
        """Random snapshot transactions show no G0/G1/G-single; read_committed no G0/G1."""
        snapshot = _names(check_history(await self._random_history(manager, "snapshot")))
        assert not snapshot & {"G0", "G1a", "G1b", "G1c", "G-single", "garbage", "lost-append"}
        await manager.backend.clear()
        committed = _names(check_history(await self._random_history(manager, "read_committed")))
        assert not committed & {"G0", "G1a", "G1b", "G1c", "garbage"}

    async def test_isolation_checker_catches_write_skew_under_snapshot(
        self, manager: TransactionManager
    ) -> None:
        """The checker reports G2 for a write skew that snapshot isolation lets through."""
        history: list[TxnRecord] = []
        t1 = await manager.begin("snapshot")
        t2 = await manager.begin("snapshot")
        r1, r2 = TxnRecord("t1"), TxnRecord("t2")
        history += [r1, r2]
        for tx, record in ((t1, r1), (t2, r2)):
            await record_read(tx, record, "lists", "x")
            await record_read(tx, record, "lists", "y")
        await record_append(t1, r1, "lists", "x", 1)
        await record_append(t2, r2, "lists", "y", 2)
        await t1.commit()
        r1.committed = True
        await t2.commit()
        r2.committed = True
        final = TxnRecord("final", committed=True)
        async with manager.transaction() as tx:
            await record_read(tx, final, "lists", "x")
            await record_read(tx, final, "lists", "y")
        history.append(final)
        anomalies = check_history(history)
        assert [(a.name, sorted(a.txns)) for a in anomalies] == [("G2", ["t1", "t2"])]


class _Abort(Exception):
    """Raised by a random transaction chosen to roll back."""
