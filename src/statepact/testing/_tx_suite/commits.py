"""Commits, reads, deletes, idempotency, leases and fencing."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from statepact.clock import ManualClock
from statepact.errors import (
    ConflictError,
    FencingError,
    IdempotencyConflictError,
    LeaseLostError,
)
from statepact.tx import (
    CommitResult,
    TransactionManager,
)

__all__ = ["CommitConformance"]

from statepact.testing._tx_suite._common import ISOLATIONS, R, commit_value, read_value


class CommitConformance:
    """Commits, reads, deletes, idempotency, leases and fencing."""

    # -- commits, reads, deletes -------------------------------------------------------------

    async def test_commit_then_read(self, manager: TransactionManager) -> None:
        """A committed write is read back, equal, by a later transaction; JSON types survive."""
        value = {"state": "paid", "lines": [1, 2.5, "x", True, None], "n": {"deep": [{}]}}
        result = await commit_value(manager, "o1", value)
        assert result == CommitResult(version=1, replayed=False)
        assert await read_value(manager, "o1") == value
        for scalar in ([1, 2], "text", 42, 0.5, False):
            await commit_value(manager, "scalar", scalar)
            assert await read_value(manager, "scalar") == scalar

    async def test_absent_key_reads_none(self, manager: TransactionManager) -> None:
        """A key never written reads as None."""
        assert await read_value(manager, "nope") is None
        assert await manager.history(R, "nope") == []

    async def test_versions_are_the_commit_sequence(self, manager: TransactionManager) -> None:
        """Each writing commit gets the next sequence number, starting at 1 on an empty backend."""
        versions = [(await commit_value(manager, f"k{i}", i)).version for i in range(3)]
        assert versions == [1, 2, 3]
        async with manager.transaction() as tx:
            tx.write(R, "a", 1)
            tx.write("other", "b", 2)
        assert tx.result.version == 4
        assert [e.version for e in await manager.history("other", "b")] == [4]

    async def test_delete(self, manager: TransactionManager) -> None:
        """A committed delete makes the key read as None and is a version in its history."""
        await commit_value(manager, "o1", {"v": 1})
        async with manager.transaction() as tx:
            tx.delete(R, "o1")
        assert tx.result.version == 2
        assert await read_value(manager, "o1") is None
        history = await manager.history(R, "o1")
        assert [(e.version, e.value, e.deleted) for e in history] == [
            (2, None, True),
            (1, {"v": 1}, False),
        ]
        await commit_value(manager, "o1", {"v": 3})
        assert await read_value(manager, "o1") == {"v": 3}

    async def test_read_your_own_writes(self, manager: TransactionManager) -> None:
        """A transaction reads its own buffered writes and deletes, last one winning."""
        await commit_value(manager, "gone", "before")
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
        assert await read_value(manager, "o1") == {"v": 3}
        assert await read_value(manager, "gone") is None
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
        assert await read_value(manager, "o1") == {"items": [1]}

    async def test_rollback_on_exception_applies_nothing(self, manager: TransactionManager) -> None:
        """An exception inside the block rolls the transaction back: nothing is applied."""

        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            async with manager.transaction() as tx:
                tx.write(R, "o1", 1)
                raise Boom
        assert await read_value(manager, "o1") is None
        with pytest.raises(RuntimeError):
            _ = tx.result
        assert (await commit_value(manager, "o2", 2)).version == 1

    async def test_history_newest_first(
        self, manager: TransactionManager, clock: ManualClock
    ) -> None:
        """history lists committed versions newest first, with the injected clock's time."""
        times = []
        for value in range(4):
            times.append(clock.now())
            await commit_value(manager, "o1", {"v": value})
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
        await commit_value(manager, "o1", "v1")
        reader = await manager.begin("snapshot")
        assert reader.taken_at == 1
        await commit_value(manager, "o1", "v2")
        await commit_value(manager, "o1", "v3")
        await commit_value(manager, "new", "created later")
        async with manager.transaction() as tx:
            tx.delete(R, "o1")
        assert await reader.read(R, "o1") == "v1"
        assert await reader.read(R, "new") is None
        assert (await reader.commit()).version == 1
        assert await read_value(manager, "o1") is None

    async def test_read_only_commits_do_not_advance_the_sequence(
        self, manager: TransactionManager
    ) -> None:
        """A commit that writes nothing returns its snapshot sequence and does not advance it."""
        await commit_value(manager, "o1", 1)
        for isolation in ISOLATIONS:
            async with manager.transaction(isolation) as tx:
                await tx.read(R, "o1")
            assert tx.result == CommitResult(1)
        async with manager.transaction("serializable", idempotency_key="read-only") as tx:
            await tx.read(R, "o1")
        assert tx.result == CommitResult(1)
        assert (await commit_value(manager, "o2", 2)).version == 2

    # -- idempotency ------------------------------------------------------------------------

    async def test_idempotent_replay_applies_once(self, manager: TransactionManager) -> None:
        """The same key and request replays the first CommitResult (replayed=True), applied once."""
        async with manager.transaction(idempotency_key="pay-1") as tx:
            tx.write(R, "o1", {"state": "paid", "amount": 5})
        first = tx.result
        assert first == CommitResult(1, replayed=False)
        await commit_value(manager, "o1", {"state": "shipped"})
        async with manager.transaction(idempotency_key="pay-1") as again:
            # Same writes, object keys in another order: the same request.
            assert await again.read(R, "o1") == {"state": "shipped"}
            again.write(R, "o1", {"amount": 5, "state": "paid"})
        assert again.result == CommitResult(1, replayed=True)
        assert await read_value(manager, "o1") == {"state": "shipped"}
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
        assert await read_value(manager, "o1") == {"amount": 5}
        assert await read_value(manager, "o2") is None
        assert (await commit_value(manager, "o3", 1)).version == 2

    async def test_conflicting_commit_leaves_no_idempotency_record(
        self, manager: TransactionManager
    ) -> None:
        """A commit refused by validation records nothing: the key can commit afterwards."""
        await commit_value(manager, "o1", 0)
        tx = await manager.begin("snapshot", idempotency_key="k")
        tx.write(R, "o1", 1)
        await commit_value(manager, "o1", 2)
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
        assert await read_value(manager, "o1") == "by w1"
        async with manager.transaction(fencing=new) as tx:
            tx.write(R, "o1", "by w2")
        assert tx.result.version == 2
        assert await read_value(manager, "o1") == "by w2"

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
