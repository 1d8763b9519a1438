"""``WorkQueueConformance``'s part: leases, heartbeats, failures, retries and the dead letter."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from statepact.clock import ManualClock
from statepact.errors import LeaseLostError
from statepact.models import ItemStatus, Lease
from statepact.queue import QueuePolicy, WorkQueue
from statepact.testing.queue_suite._common import (
    LEASE,
    SuiteBase,
    _claim,
    _fill,
    _item,
    _stats,
)

__all__ = ["SettleConformance"]


class SettleConformance(SuiteBase):
    """Leases, heartbeats, failures, retries, the dead letter and its recovery."""

    # -- leases ---------------------------------------------------------------

    async def test_reap_returns_expired_leases_to_ready(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """An expired lease is moved back to ready by reap, which returns what it moved."""
        await work_queue.enqueue(_item("acme", "job-1"))
        await work_queue.enqueue(_item("acme", "job-2"))
        first = await _claim(work_queue, "w1")
        clock.advance(10)
        await _claim(work_queue, "w1")
        clock.advance(LEASE - 10 - 0.001)
        assert await work_queue.reap() == []
        clock.advance(0.001)  # exactly at expires_at: lapsed
        moved = await work_queue.reap()
        assert [item.item_id for item in moved] == ["job-1"]
        (item,) = moved
        assert item.status is ItemStatus.QUEUED
        assert item.attempts == 1
        assert item.last_error == "lease expired"
        assert item.available_at == item.updated_at == clock.now()
        assert await work_queue.get_item("acme", "job-1") == item
        assert await work_queue.reap() == []
        again = await _claim(work_queue, "w2")
        assert again.item.item_id == "job-1"
        assert again.item.attempts == 2
        assert again.token > first.token
        assert (await work_queue.stats()).tenants == _stats(acme=(0, 2, 0))

    async def test_a_stale_holder_changes_nothing(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """After reap moved an item, its old holder's ack, fail, release and heartbeat raise
        LeaseLostError and change nothing."""
        await work_queue.enqueue(_item("acme", "job-1"))
        stale = await _claim(work_queue, "w1")
        clock.advance(LEASE + 1)
        await work_queue.reap()
        after_reap = await work_queue.get_item("acme", "job-1")
        stats = await work_queue.stats()
        settles: list[Callable[[], Awaitable[object]]] = [
            lambda: work_queue.ack(stale),
            lambda: work_queue.fail(stale, "late"),
            lambda: work_queue.fail(stale, "late", retryable=False),
            lambda: work_queue.release(stale),
            lambda: work_queue.heartbeat(stale),
        ]
        for settle in settles:
            with pytest.raises(LeaseLostError) as caught:
                await settle()
            assert caught.value.retryable is False
            assert await work_queue.get_item("acme", "job-1") == after_reap
            assert await work_queue.stats() == stats
        fresh = await _claim(work_queue, "w2")
        with pytest.raises(LeaseLostError):
            await work_queue.ack(stale)
        with pytest.raises(LeaseLostError):
            await work_queue.heartbeat(stale)
        assert await work_queue.get_item("acme", "job-1") == fresh.item
        done = await work_queue.ack(fresh)
        assert done.status is ItemStatus.DONE

    async def test_an_expired_lease_is_not_claimable_until_reaped(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A claim never takes a leased item, even one whose lease lapsed; reap moves it."""
        await work_queue.enqueue(_item("acme", "job-1"))
        await _claim(work_queue, "w1")
        clock.advance(LEASE * 3)
        assert await work_queue.claim("w2", lease_for=LEASE) is None
        assert await work_queue.claim_batch("w2", lease_for=LEASE, limit=5) == []
        await work_queue.reap()
        assert (await _claim(work_queue, "w2")).item.item_id == "job-1"

    async def test_a_lapsed_lease_still_settles_until_reaped(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A lapsed lease stays good until reap or a new claim moves the item on."""
        await work_queue.enqueue(_item("acme", "job-1"))
        await work_queue.enqueue(_item("acme", "job-2"))
        one = await _claim(work_queue)
        two = await _claim(work_queue)
        clock.advance(LEASE * 2)
        assert (await work_queue.ack(one)).status is ItemStatus.DONE
        renewed = await work_queue.heartbeat(two)
        assert renewed.expires_at == clock.now() + timedelta(seconds=LEASE)
        assert await work_queue.reap() == []
        assert (await work_queue.ack(renewed)).status is ItemStatus.DONE

    async def test_heartbeat_changes_the_token_and_extends(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """heartbeat extends the lease by its duration from now with a new token; the old
        token is stale."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue, "w1", lease_for=LEASE)
        clock.advance(20)
        renewed = await work_queue.heartbeat(lease)
        assert renewed.token > lease.token
        assert renewed.expires_at == clock.now() + timedelta(seconds=LEASE)
        assert renewed.worker_id == "w1"
        assert renewed.lease_seconds == LEASE
        clock.advance(5)
        again = await work_queue.heartbeat(renewed)
        assert again.token > renewed.token
        with pytest.raises(LeaseLostError):
            await work_queue.heartbeat(lease)
        with pytest.raises(LeaseLostError):
            await work_queue.ack(renewed)
        assert (await work_queue.get_item("acme", "job-1")) == lease.item
        assert (await work_queue.ack(again)).status is ItemStatus.DONE

    async def test_heartbeat_leaves_the_item_as_it_was(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """heartbeat moves only the token and the expiry: the item record is unchanged."""
        await work_queue.enqueue(_item("acme", "job-1", payload={"k": "v"}))
        lease = await _claim(work_queue)
        clock.advance(7)
        renewed = await work_queue.heartbeat(lease)
        assert renewed.item == lease.item
        assert await work_queue.get_item("acme", "job-1") == lease.item

    async def test_a_reap_after_a_live_heartbeat_moves_nothing(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A reaper that lost the race to a live heartbeat writes nothing."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue, lease_for=LEASE)
        clock.advance(20)
        renewed = await work_queue.heartbeat(lease)
        clock.advance(20)  # past the first expiry, before the renewed one
        assert await work_queue.reap() == []
        item = await work_queue.get_item("acme", "job-1")
        assert item is not None
        assert item.status is ItemStatus.LEASED
        assert (await work_queue.ack(renewed)).status is ItemStatus.DONE

    async def test_a_reap_racing_a_heartbeat_never_both_win(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A reap racing a heartbeat on a lapsed lease: either the heartbeat wins and reap moves
        nothing, or reap moves the item and the heartbeat raises LeaseLostError."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        clock.advance(LEASE + 1)
        moved, beat = await asyncio.gather(
            work_queue.reap(), work_queue.heartbeat(lease), return_exceptions=True
        )
        assert not isinstance(moved, BaseException)
        item = await work_queue.get_item("acme", "job-1")
        assert item is not None
        if isinstance(beat, LeaseLostError):
            assert [m.item_id for m in moved] == ["job-1"]
            assert item.status is ItemStatus.QUEUED
        else:
            assert isinstance(beat, Lease)
            assert moved == []
            assert item.status is ItemStatus.LEASED
            assert (await work_queue.ack(beat)).status is ItemStatus.DONE

    async def test_every_settle_is_fenced(self, work_queue: WorkQueue) -> None:
        """A lease that was settled already cannot settle again: LeaseLostError, nothing changes."""
        await _fill(work_queue, "acme", 3)
        acked, failed, released = await work_queue.claim_batch("w1", lease_for=LEASE, limit=3)
        await work_queue.ack(acked)
        await work_queue.fail(failed, "boom")
        await work_queue.release(released)
        before = [await work_queue.get_item("acme", f"i{n:04d}") for n in range(3)]
        for lease in (acked, failed, released):
            settles: list[Callable[[Lease], Awaitable[object]]] = [
                work_queue.ack,
                lambda held: work_queue.fail(held, "again"),
                work_queue.release,
                work_queue.heartbeat,
            ]
            for settle in settles:
                with pytest.raises(LeaseLostError):
                    await settle(lease)
        assert [await work_queue.get_item("acme", f"i{n:04d}") for n in range(3)] == before

    async def test_lapses_dead_letter_after_max_attempts(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A lease that lapses counts as a failed attempt without backoff; at max_attempts the
        item is dead-lettered with 'lease expired'."""
        await work_queue.enqueue(_item("acme", "job-1"))
        for attempt in (1, 2):
            lease = await _claim(work_queue)
            assert lease.item.attempts == attempt
            clock.advance(LEASE)
            (moved,) = await work_queue.reap()
            assert moved.status is ItemStatus.QUEUED
        await _claim(work_queue)
        clock.advance(LEASE)
        (moved,) = await work_queue.reap()
        assert moved.status is ItemStatus.DEAD
        assert moved.attempts == 3
        assert moved.last_error == "lease expired"
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        assert await work_queue.dead_letters("acme") == [moved]

    # -- fail, retry, dead letter -----------------------------------------------

    async def test_fail_retries_with_the_policys_backoff(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """fail retries after the policy's backoff: not claimable before it is due, claimable
        at it; after max attempts the item is dead with its last error kept."""
        await work_queue.enqueue(_item("acme", "job-1"))
        for attempt, backoff in ((1, 10), (2, 20)):
            lease = await _claim(work_queue)
            assert lease.item.attempts == attempt
            failed = await work_queue.fail(lease, f"boom {attempt}")
            assert failed.status is ItemStatus.QUEUED
            assert failed.attempts == attempt
            assert failed.last_error == f"boom {attempt}"
            assert failed.available_at == clock.now() + timedelta(seconds=backoff)
            assert await work_queue.get_item("acme", "job-1") == failed
            clock.advance(backoff - 0.001)
            assert await work_queue.claim("w1", lease_for=LEASE) is None
            clock.advance(0.001)
        lease = await _claim(work_queue)
        assert lease.item.attempts == 3
        assert lease.item.last_error == "boom 2"
        dead = await work_queue.fail(lease, "boom 3")
        assert dead.status is ItemStatus.DEAD
        assert dead.attempts == 3
        assert dead.last_error == "boom 3"
        assert await work_queue.get_item("acme", "job-1") == dead
        clock.advance(3600)
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        assert await work_queue.dead_letters("acme") == [dead]
        assert (await work_queue.stats()).tenants == _stats(acme=(0, 0, 1))

    async def test_fail_retry_in_replaces_the_backoff_not_the_dead_letter(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """``retry_in`` sets when a retry is due (0: at once); the policy still dead-letters
        at max attempts; a bad ``retry_in`` is refused naming it and changes nothing."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        for bad, error in ((-1, ValueError), (float("nan"), ValueError), ("soon", TypeError)):
            with pytest.raises(error, match="retry_in"):
                await work_queue.fail(lease, "boom", retry_in=bad)  # type: ignore[arg-type]
        assert await work_queue.get_item("acme", "job-1") == lease.item
        failed = await work_queue.fail(lease, "boom", retry_in=timedelta(seconds=3))
        assert failed.status is ItemStatus.QUEUED
        assert failed.available_at == clock.now() + timedelta(seconds=3)
        clock.advance(3)
        lease = await _claim(work_queue)
        failed = await work_queue.fail(lease, "boom", retry_in=0)
        assert failed.available_at == clock.now()
        lease = await _claim(work_queue)
        assert lease.item.attempts == 3
        dead = await work_queue.fail(lease, "boom", retry_in=1)
        assert dead.status is ItemStatus.DEAD

    async def test_a_non_retryable_failure_dead_letters_at_once(
        self, work_queue: WorkQueue
    ) -> None:
        """fail(retryable=False) dead-letters the item at once, with its error."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        dead = await work_queue.fail(lease, "poison: unparseable", retryable=False)
        assert dead.status is ItemStatus.DEAD
        assert dead.attempts == 1
        assert dead.last_error == "poison: unparseable"
        assert await work_queue.dead_letters("acme") == [dead]
        assert await work_queue.claim("w1", lease_for=LEASE) is None

    @pytest.mark.parametrize("queue_policy", [QueuePolicy(max_attempts=1, jitter=0)])
    async def test_the_queue_follows_its_policy(
        self, work_queue: WorkQueue, clock: ManualClock, queue_policy: QueuePolicy
    ) -> None:
        """Retries and the dead letter follow the queue's own QueuePolicy (here: one attempt)."""
        await work_queue.enqueue(_item("acme", "failed"))
        await work_queue.enqueue(_item("acme", "lapsed"))
        failed = await _claim(work_queue)
        assert (await work_queue.fail(failed, "once")).status is ItemStatus.DEAD
        await _claim(work_queue)
        clock.advance(LEASE)
        (moved,) = await work_queue.reap()
        assert moved.status is ItemStatus.DEAD
        assert {i.item_id for i in await work_queue.dead_letters("acme")} == {"failed", "lapsed"}

    async def test_error_text_round_trips(self, work_queue: WorkQueue) -> None:
        """The error text is kept as given (unicode included), without NUL characters."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        failed = await work_queue.fail(lease, "Ошибка ✗ 错误\nline 2\x00!")
        assert failed.last_error == "Ошибка ✗ 错误\nline 2!"
        stored = await work_queue.get_item("acme", "job-1")
        assert stored is not None
        assert stored.last_error == "Ошибка ✗ 错误\nline 2!"

    async def test_release_does_not_count_an_attempt(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """release gives the item back, due now, without counting the attempt."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        await work_queue.fail(lease, "first")
        clock.advance(10)
        lease = await _claim(work_queue)
        assert lease.item.attempts == 2
        clock.advance(3)
        released = await work_queue.release(lease)
        assert released.status is ItemStatus.QUEUED
        assert released.attempts == 1
        assert released.last_error == "first"
        assert released.available_at == released.updated_at == clock.now()
        assert await work_queue.get_item("acme", "job-1") == released
        again = await _claim(work_queue)
        assert again.item.attempts == 2
        assert again.token > lease.token

    async def test_requeue_brings_a_dead_item_back(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """requeue brings a dead item back, due now, with attempts reset and its last error kept."""
        await work_queue.enqueue(_item("acme", "job-1", payload={"x": 1}))
        dead = await work_queue.fail(await _claim(work_queue), "poison", retryable=False)
        clock.advance(60)
        back = await work_queue.requeue(dead)
        assert back.status is ItemStatus.QUEUED
        assert back.attempts == 0
        assert back.last_error == "poison"
        assert back.available_at == back.updated_at == clock.now()
        assert back.payload == {"x": 1}
        assert await work_queue.get_item("acme", "job-1") == back
        assert await work_queue.dead_letters("acme") == []
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 0, 0))
        lease = await _claim(work_queue)
        assert lease.item.attempts == 1

    async def test_requeue_refuses_an_item_that_is_not_dead(self, work_queue: WorkQueue) -> None:
        """requeue of a missing, queued, leased or done item raises ValueError naming item_id."""
        await _fill(work_queue, "acme", 3)
        queued = await work_queue.get_item("acme", "i0002")
        leased = await _claim(work_queue)
        done = await work_queue.ack(await _claim(work_queue))
        assert queued is not None
        for item in (queued, leased.item, done, _item("acme", "missing")):
            with pytest.raises(ValueError, match="item_id"):
                await work_queue.requeue(item)
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 1, 0))

    async def test_dead_letters_oldest_first(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """dead_letters lists the tenant's dead items by the time they died, then item id."""
        for item_id in ["x-late", "b", "a", "c-first"]:
            await work_queue.enqueue(_item("acme", item_id))
        await work_queue.enqueue(_item("other", "z"))
        leases = {
            lease.item.item_id: lease
            for lease in await work_queue.claim_batch("w1", lease_for=LEASE, limit=5)
        }
        await work_queue.fail(leases["c-first"], "e", retryable=False)
        clock.advance(1)
        await work_queue.fail(leases["z"], "e", retryable=False)
        await work_queue.fail(leases["b"], "e", retryable=False)
        await work_queue.fail(leases["a"], "e", retryable=False)
        clock.advance(1)
        await work_queue.fail(leases["x-late"], "e", retryable=False)
        dead = await work_queue.dead_letters("acme")
        assert [item.item_id for item in dead] == ["c-first", "a", "b", "x-late"]
        assert all(item.status is ItemStatus.DEAD for item in dead)
        limited = await work_queue.dead_letters("acme", limit=2)
        assert [item.item_id for item in limited] == ["c-first", "a"]
        assert [item.item_id for item in await work_queue.dead_letters("other")] == ["z"]
        assert await work_queue.dead_letters("nobody") == []

    async def test_purge_dead_deletes_only_that_tenants_dead_items(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """purge_dead deletes the tenant's dead items and returns how many; its queued,
        leased and done items and every other tenant's items are left as they were."""
        await _fill(work_queue, "acme", 6)
        await _fill(work_queue, "other", 2)
        leases = {
            (lease.item.tenant, lease.item.item_id): lease
            for lease in await work_queue.claim_batch("w1", lease_for=LEASE, limit=8)
        }
        for item_id in ("i0000", "i0001", "i0002"):
            await work_queue.fail(leases[("acme", item_id)], "poison", retryable=False)
        await work_queue.fail(leases[("other", "i0000")], "poison", retryable=False)
        done = await work_queue.ack(leases[("acme", "i0003")])
        queued = await work_queue.release(leases[("acme", "i0004")])
        leased = leases[("acme", "i0005")].item
        kept_other = [await work_queue.get_item("other", f"i000{n}") for n in range(2)]
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 1, 3), other=(0, 1, 1))
        clock.advance(1)
        assert await work_queue.purge_dead("acme") == 3
        assert await work_queue.dead_letters("acme") == []
        for item_id in ("i0000", "i0001", "i0002"):
            assert await work_queue.get_item("acme", item_id) is None
        assert await work_queue.get_item("acme", "i0003") == done
        assert await work_queue.get_item("acme", "i0004") == queued
        assert await work_queue.get_item("acme", "i0005") == leased
        assert [await work_queue.get_item("other", f"i000{n}") for n in range(2)] == kept_other
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 1, 0), other=(0, 1, 1))
        # The lease beside them still settles; the other tenant's dead letter is still there.
        await work_queue.ack(leases[("acme", "i0005")])
        assert [i.item_id for i in await work_queue.dead_letters("other")] == ["i0000"]

    async def test_purge_dead_again_returns_zero(self, work_queue: WorkQueue) -> None:
        """A second purge_dead, or one of a tenant with no dead item, deletes nothing and
        returns 0."""
        await work_queue.enqueue(_item("acme", "job-1"))
        await work_queue.fail(await _claim(work_queue), "poison", retryable=False)
        assert await work_queue.purge_dead("acme") == 1
        assert await work_queue.purge_dead("acme") == 0
        assert await work_queue.purge_dead("nobody") == 0
        assert (await work_queue.stats()).tenants == {}

    async def test_purge_dead_frees_the_item_ids(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A purged item is gone as if never enqueued: enqueue of its id stores a new item."""
        await work_queue.enqueue(_item("acme", "job-1", payload={"v": 1}))
        await work_queue.fail(await _claim(work_queue), "poison", retryable=False)
        await work_queue.purge_dead("acme")
        clock.advance(5)
        fresh = await work_queue.enqueue(_item("acme", "job-1", payload={"v": 2}))
        assert fresh.status is ItemStatus.QUEUED
        assert (fresh.payload, fresh.attempts, fresh.last_error) == ({"v": 2}, 0, None)
        assert fresh.created_at == clock.now()
        lease = await _claim(work_queue)
        assert (lease.item.item_id, lease.item.attempts) == ("job-1", 1)

    async def test_purge_dead_of_many_items(self, work_queue: WorkQueue) -> None:
        """purge_dead deletes a dead letter larger than one batch of any backing (2,500)."""
        await work_queue.enqueue_many([_item("acme", f"i{n:05d}") for n in range(2500)])
        for _ in range(3):
            leases = await work_queue.claim_batch("w1", lease_for=LEASE, limit=1000)
            for lease in leases:
                await work_queue.fail(lease, "poison", retryable=False)
        assert (await work_queue.stats()).tenants == _stats(acme=(0, 0, 2500))
        assert await work_queue.purge_dead("acme") == 2500
        assert (await work_queue.stats()).tenants == {}

    @pytest.mark.parametrize(
        ("tenant", "error"), [("", ValueError), ("a\x00b", ValueError), (7, TypeError)]
    )
    async def test_purge_dead_refuses_a_bad_tenant(
        self, work_queue: WorkQueue, tenant: Any, error: type[Exception]
    ) -> None:
        """purge_dead of a bad tenant raises ValueError/TypeError naming tenant, deleting
        nothing."""
        await work_queue.enqueue(_item("acme", "job-1"))
        await work_queue.fail(await _claim(work_queue), "poison", retryable=False)
        with pytest.raises(error, match="tenant"):
            await work_queue.purge_dead(tenant)
        assert (await work_queue.stats()).tenants == _stats(acme=(0, 0, 1))
