"""Bad input, manager.run, hot keys, the registry and operations."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, timedelta
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.errors import (
    ConflictError,
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
from statepact.tx import (
    CommitResult,
    StorageBackend,
    Transaction,
    TransactionManager,
)

__all__ = ["OperationsConformance"]

from statepact.testing._tx_suite._common import R, commit_value, read_value


class OperationsConformance:
    """Bad input, manager.run, hot keys, the registry and operations."""

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
        assert await read_value(manager, "k") is None
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
        assert await read_value(manager, "big") is None

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
        nested, top = await read_value(manager, "nested"), await read_value(manager, "top")
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
        assert await read_value(manager, "k") is None
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
        await commit_value(manager, "k", 1)
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
        assert await read_value(manager, "k") == 1
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
        await commit_value(manager, "k", 1)
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
        assert await read_value(manager, "counter") == 20
        assert attempts > 20  # conflicts did happen and were retried

    async def test_run_gives_up_after_retries(self, manager: TransactionManager) -> None:
        """run raises the last ConflictError once its retries are spent, applying nothing."""
        calls = 0

        async def always_loses(tx: Transaction) -> None:
            nonlocal calls
            calls += 1
            await tx.read(R, "x")
            await commit_value(manager, "x", calls)  # a rival commits first, every time
            tx.write(R, "x", "mine")

        with pytest.raises(ConflictError):
            await manager.run(always_loses, retries=2)
        assert calls == 3
        assert await read_value(manager, "x") == 3

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
        assert await read_value(manager, "x") is None

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
        await commit_value(manager, "hot", 0)
        await self._heat(manager, "hot")  # hot at 1
        holder, let_go, follower = await self._hold_and_follow(manager)
        await asyncio.sleep(0.05)
        assert not follower.done()  # its first read waits for the holder's turn
        let_go.set()
        await holder
        assert await asyncio.wait_for(follower, 5) == 2  # it read the holder's commit
        assert await read_value(manager, "hot") == 3

    async def test_a_turn_held_past_hot_key_turn_is_passed_on(
        self, tx_backend: StorageBackend
    ) -> None:
        """A holder that keeps its turn longer than ``hot_key_turn`` no longer holds the
        line up: the next reads, and the first to commit wins as without turns."""
        manager = TransactionManager(tx_backend, hot_key_turn=0.05)
        await commit_value(manager, "hot", 0)
        await self._heat(manager, "hot")
        holder, let_go, follower = await self._hold_and_follow(manager)
        assert await asyncio.wait_for(follower, 5) == 1  # went ahead while the holder held
        assert not holder.done()
        let_go.set()
        with pytest.raises(ConflictError):
            await holder
        assert await read_value(manager, "hot") == 2

    async def test_without_turns_a_hot_keys_readers_do_not_wait(
        self, tx_backend: StorageBackend
    ) -> None:
        """``hot_key_turn=None``: every first read is sent at once, conflict or not."""
        manager = TransactionManager(tx_backend, hot_key_turn=None)
        await commit_value(manager, "hot", 0)
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
        await commit_value(manager, "hot", 0)
        await self._heat(manager, "hot")
        holder, _let_go, follower = await self._hold_and_follow(manager)
        await asyncio.sleep(0.02)
        assert not follower.done()
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
        assert await asyncio.wait_for(follower, 5) == 1  # the holder wrote nothing
        assert await read_value(manager, "hot") == 2

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
        await commit_value(manager, "o1", 1)
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
        await commit_value(manager, "o1", 1)
        async with manager.transaction(idempotency_key="once") as tx:
            tx.write(R, "o2", 2)
        lease = await manager.acquire_lease("job", "w1", 60)
        assert lease is not None
        await tx_backend.clear()
        assert await read_value(manager, "o1") is None
        assert await manager.history(R, "o1") == []
        assert await manager.resource_info(R) is None
        # The old holder's lease is gone: another owner gets one at once.
        again = await manager.acquire_lease("job", "w2", 60)
        assert again is not None and again.owner == "w2"
        async with manager.transaction(idempotency_key="once") as tx:
            tx.write(R, "o2", "different")
        assert tx.result == CommitResult(1, replayed=False)
