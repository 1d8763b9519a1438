"""``WorkQueueConformance``'s part: cancel, release's options, pause and resume."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from statepact.clock import ManualClock
from statepact.errors import LeaseLostError
from statepact.models import ItemStatus, WorkItem
from statepact.queue import WorkQueue
from statepact.testing.queue_suite._common import (
    LEASE,
    SuiteBase,
    _claim,
    _item,
    _stats,
    _woken_by,
)

__all__ = ["LifecycleConformance"]


class LifecycleConformance(SuiteBase):
    """Stopping work: cancel, snooze-like release, shutdown release, pause."""

    # -- cancel ----------------------------------------------------------------

    async def test_cancel_a_queued_item(self, work_queue: WorkQueue, clock: ManualClock) -> None:
        """A queued item becomes cancelled at once, with the reason in last_error, and is
        never claimed."""
        await work_queue.enqueue(_item("acme", "job-1"))
        clock.advance(5)
        cancelled = await work_queue.cancel("acme", "job-1", reason="no longer wanted")
        assert cancelled is not None
        assert cancelled.status is ItemStatus.CANCELLED
        assert cancelled.last_error == "no longer wanted"
        assert cancelled.updated_at == clock.now()
        assert await work_queue.get_item("acme", "job-1") == cancelled
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        assert (await work_queue.stats()).tenants == _stats(acme=(0, 0, 0, 1))

    async def test_cancel_a_delayed_item(self, work_queue: WorkQueue, clock: ManualClock) -> None:
        """A delayed item cancelled is never claimed, not even once it would be due."""
        await work_queue.enqueue(_item("acme", "later"), delay=60)
        await work_queue.enqueue(_item("acme", "now"))
        cancelled = await work_queue.cancel("acme", "later")
        assert cancelled is not None and cancelled.status is ItemStatus.CANCELLED
        assert cancelled.last_error is None
        assert await work_queue.next_due() is None
        clock.advance(120)
        lease = await _claim(work_queue)
        assert lease.item.item_id == "now"
        assert await work_queue.claim("w1", lease_for=LEASE) is None

    async def test_cancel_a_leased_item_voids_its_lease(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A leased item becomes cancelled; every later settle or heartbeat with its lease
        raises LeaseLostError and writes nothing; reap does not move it."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        cancelled = await work_queue.cancel("acme", "job-1", reason="stop")
        assert cancelled is not None
        assert cancelled.status is ItemStatus.CANCELLED
        assert cancelled.last_error == "stop"
        assert cancelled.attempts == 1
        for settle in (
            lambda: work_queue.ack(lease),
            lambda: work_queue.heartbeat(lease),
            lambda: work_queue.fail(lease, "boom"),
            lambda: work_queue.fail(lease, "boom", retryable=False),
            lambda: work_queue.release(lease),
            lambda: work_queue.release(lease, count_attempt=True, delay=5),
        ):
            with pytest.raises(LeaseLostError):
                await settle()
        (lost,) = await work_queue.ack_many([lease])
        assert isinstance(lost, LeaseLostError)
        clock.advance(LEASE * 2)
        assert await work_queue.reap() == []
        assert await work_queue.get_item("acme", "job-1") == cancelled
        assert (await work_queue.stats()).tenants == _stats(acme=(0, 0, 0, 1))

    async def test_cancel_racing_a_claim_leaks_nothing(
        self, work_queue: WorkQueue, work_queue_peer: WorkQueue
    ) -> None:
        """A cancel racing a claim: every item ends cancelled, every lease the claim got is
        void, and nothing is left queued or leased."""
        ids = [f"job-{index:02d}" for index in range(20)]
        await work_queue.enqueue_many([_item("acme", item_id) for item_id in ids])
        leases, answers = await asyncio.gather(
            work_queue_peer.claim_batch("w1", lease_for=LEASE, limit=20),
            work_queue.cancel_many("acme", ids),
        )
        assert [item.status if item else None for item in answers] == [ItemStatus.CANCELLED] * 20
        if leases:
            assert all(isinstance(a, LeaseLostError) for a in await work_queue.ack_many(leases))
        assert (await work_queue.stats()).tenants == _stats(acme=(0, 0, 0, 20))
        assert await work_queue.claim("w2", lease_for=LEASE) is None

    async def test_cancel_racing_an_ack_exactly_one_wins(
        self, work_queue: WorkQueue, work_queue_peer: WorkQueue
    ) -> None:
        """An ack and a cancel of one leased item at once: exactly one lands (done and the
        cancel answers it unchanged, or cancelled and the ack raises LeaseLostError)."""
        await work_queue.enqueue_many([_item("acme", f"job-{index}") for index in range(10)])
        leases = await work_queue.claim_batch("w1", lease_for=LEASE, limit=10)
        assert len(leases) == 10

        async def ack(lease_index: int) -> WorkItem | LeaseLostError:
            try:
                return await work_queue.ack(leases[lease_index])
            except LeaseLostError as exc:
                return exc

        outcomes = await asyncio.gather(
            *(ack(index) for index in range(10)),
            *(work_queue_peer.cancel("acme", lease.item.item_id) for lease in leases),
        )
        for lease, acked, cancelled in zip(leases, outcomes[:10], outcomes[10:], strict=True):
            stored = await work_queue.get_item("acme", lease.item.item_id)
            assert stored is not None and cancelled == stored
            if isinstance(acked, LeaseLostError):
                assert stored.status is ItemStatus.CANCELLED
            else:
                assert stored.status is ItemStatus.DONE and acked == stored

    async def test_cancel_of_a_finished_item_changes_nothing(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A done, dead or cancelled item is answered unchanged; a missing one is None."""
        await work_queue.enqueue_many([_item("acme", name) for name in ("done", "dead", "gone")])
        await work_queue.ack(await _claim(work_queue))
        await work_queue.fail(await _claim(work_queue), "poison", retryable=False)
        await work_queue.cancel("acme", "gone", reason="first")
        clock.advance(10)
        for item_id in ("done", "dead", "gone"):
            before = await work_queue.get_item("acme", item_id)
            assert before is not None
            assert await work_queue.cancel("acme", item_id, reason="again") == before
            assert await work_queue.get_item("acme", item_id) == before
        assert await work_queue.cancel("acme", "never") is None
        assert await work_queue.cancel("other", "done") is None

    async def test_cancel_many_answers_in_the_order_asked(self, work_queue: WorkQueue) -> None:
        """cancel_many answers each id in its place: the cancelled item, an unchanged
        finished one, or None."""
        await work_queue.enqueue_many([_item("acme", name) for name in ("a", "b", "c")])
        done = await work_queue.ack(await _claim(work_queue))
        assert done.item_id == "a"
        answers = await work_queue.cancel_many("acme", ["c", "missing", "a", "b"], reason="r")
        assert [item.item_id if item else None for item in answers] == ["c", None, "a", "b"]
        assert [item.status if item else None for item in answers] == [
            ItemStatus.CANCELLED,
            None,
            ItemStatus.DONE,
            ItemStatus.CANCELLED,
        ]
        assert answers[2] == done
        assert answers[0] is not None and answers[0].last_error == "r"

    async def test_a_cancelled_items_id_stays_taken(self, work_queue: WorkQueue) -> None:
        """enqueue of a cancelled item's id returns the cancelled item (item_id stays the
        idempotency key until the item is pruned)."""
        await work_queue.enqueue(_item("acme", "job-1"))
        cancelled = await work_queue.cancel("acme", "job-1")
        assert await work_queue.enqueue(_item("acme", "job-1", payload={"n": 2})) == cancelled

    async def test_cancel_refuses_bad_input_naming_the_field(self, work_queue: WorkQueue) -> None:
        """Bad ids, batches and reasons are refused naming the field; nothing is cancelled."""
        await work_queue.enqueue(_item("acme", "job-1"))
        bad: list[tuple[type[Exception], str, object]] = [
            (ValueError, "tenant", lambda: work_queue.cancel("", "job-1")),
            (ValueError, "item_id", lambda: work_queue.cancel("acme", "")),
            (TypeError, "item_id", lambda: work_queue.cancel("acme", 7)),  # type: ignore[arg-type]
            (TypeError, "reason", lambda: work_queue.cancel("acme", "job-1", reason=3)),  # type: ignore[arg-type]
            (ValueError, "item_ids", lambda: work_queue.cancel_many("acme", [])),
            (TypeError, "item_ids", lambda: work_queue.cancel_many("acme", "job-1")),
            (ValueError, r"item_ids\[1\]", lambda: work_queue.cancel_many("acme", ["job-1", ""])),
            (
                ValueError,
                r"item_ids\[1\]",
                lambda: work_queue.cancel_many("acme", ["job-1", "job-1"]),
            ),
            (ValueError, "item_ids", lambda: work_queue.cancel_many("acme", ["x"] * 1001)),
        ]
        for error, field, call in bad:
            with pytest.raises(error, match=field):
                await call()  # type: ignore[operator]
        stored = await work_queue.get_item("acme", "job-1")
        assert stored is not None and stored.status is ItemStatus.QUEUED

    async def test_a_watch_is_told_when_a_leased_item_is_cancelled(
        self, work_queue: WorkQueue, work_queue_peer: WorkQueue
    ) -> None:
        """watch(on_cancel=...) on one queue object hears, within a second, of a leased item
        cancelled through another: tenant, item id and the voided lease's token."""
        heard: list[tuple[str, str, int]] = []
        arrived = asyncio.Event()

        def on_cancel(tenant: str, item_id: str, token: int) -> None:
            heard.append((tenant, item_id, token))
            arrived.set()

        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        async with work_queue_peer.watch(on_cancel=on_cancel) as watch:
            while await watch.wait(0.05):  # the watch is listening once a wait returned
                pass
            await work_queue.cancel("acme", "job-1")
            await asyncio.wait_for(arrived.wait(), 1.0)
        assert heard == [("acme", "job-1", lease.token)]

    async def test_watch_refuses_an_on_cancel_that_is_not_callable(
        self, work_queue: WorkQueue
    ) -> None:
        """on_cancel must be callable; the refusal names it."""
        with pytest.raises(TypeError, match="on_cancel"):
            async with work_queue.watch(on_cancel="print"):  # type: ignore[arg-type]
                pass

    # -- release: snooze and shutdown ----------------------------------------------

    async def test_release_with_a_delay_is_due_later(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """release(delay=) makes the item due at now + delay, the attempt given back."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        clock.advance(2)
        released = await work_queue.release(lease, delay=timedelta(seconds=30))
        assert released.status is ItemStatus.QUEUED
        assert released.attempts == 0
        assert released.available_at == clock.now() + timedelta(seconds=30)
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        assert await work_queue.next_due() == released.available_at
        clock.advance(30)
        again = await _claim(work_queue)
        assert again.item.item_id == "job-1" and again.item.attempts == 1

    async def test_release_counting_the_attempt_keeps_it(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """release(count_attempt=True) keeps the attempt: an item released at every try
        still reaches the dead letter after max_attempts (3 in the suite's policy)."""
        await work_queue.enqueue(_item("acme", "hangs"))
        for attempt in (1, 2):
            lease = await _claim(work_queue)
            assert lease.item.attempts == attempt
            released = await work_queue.release(lease, count_attempt=True)
            assert released.attempts == attempt
            assert released.available_at == clock.now()
        last = await _claim(work_queue)
        assert last.item.attempts == 3
        dead = await work_queue.fail(last, "timed out")
        assert dead.status is ItemStatus.DEAD

    async def test_release_refuses_bad_arguments_naming_them(self, work_queue: WorkQueue) -> None:
        """A bad delay or count_attempt is refused naming it; the lease still holds."""
        await work_queue.enqueue(_item("acme", "job-1"))
        lease = await _claim(work_queue)
        with pytest.raises(ValueError, match="delay"):
            await work_queue.release(lease, delay=-1)
        with pytest.raises(ValueError, match="delay"):
            await work_queue.release(lease, delay=float("inf"))
        with pytest.raises(TypeError, match="count_attempt"):
            await work_queue.release(lease, count_attempt="yes")  # type: ignore[arg-type]
        assert (await work_queue.ack(lease)).status is ItemStatus.DONE

    # -- pause and resume ----------------------------------------------------------

    async def test_pause_stops_every_claim_until_resume(
        self, work_queue: WorkQueue, work_queue_peer: WorkQueue
    ) -> None:
        """While paused no claim or claim_batch of any queue object returns anything;
        after resume they do."""
        await work_queue.enqueue_many([_item("acme", f"job-{index}") for index in range(3)])
        assert await work_queue.paused() is False
        await work_queue.pause()
        assert await work_queue.paused() is True
        assert await work_queue_peer.paused() is True
        assert await work_queue.claim("w1", lease_for=LEASE) is None
        assert await work_queue_peer.claim("w2", lease_for=LEASE) is None
        assert await work_queue_peer.claim_batch("w2", lease_for=LEASE, limit=3) == []
        await work_queue_peer.resume()
        assert await work_queue.paused() is False
        assert len(await work_queue.claim_batch("w1", lease_for=LEASE, limit=3)) == 3

    async def test_a_paused_queue_still_takes_work_and_settles(self, work_queue: WorkQueue) -> None:
        """Pause stops claims only: leased items settle and heartbeat, enqueues land,
        cancel works, and pause and resume may be repeated."""
        await work_queue.enqueue_many([_item("acme", "a"), _item("acme", "b")])
        first = await _claim(work_queue)
        second = await _claim(work_queue)
        await work_queue.pause()
        await work_queue.pause()
        assert (await work_queue.heartbeat(first)).token > first.token
        await work_queue.release(second)
        await work_queue.enqueue(_item("acme", "c"))
        assert (await work_queue.cancel("acme", "c")) is not None
        assert (await work_queue.stats()).tenants == _stats(acme=(1, 1, 0, 1))
        await work_queue.resume()
        await work_queue.resume()
        assert (await _claim(work_queue)).item.item_id == "b"

    async def test_resume_wakes_a_watch(
        self, work_queue: WorkQueue, work_queue_peer: WorkQueue
    ) -> None:
        """resume wakes idle claimers as an enqueue does, so a paused worker claims again
        at once."""
        await work_queue.pause()
        await work_queue.enqueue(_item("acme", "job-1"))
        async with work_queue_peer.watch() as watch:
            await _woken_by(watch, work_queue.resume)
        assert (await _claim(work_queue_peer)).item.item_id == "job-1"
