"""``WorkQueueConformance``'s part: the error history (``error_history``).

Every write of ``last_error`` (fail, reap, cancel with a reason) appends one entry in
the same atomic write, the newest ``MAX_ERROR_HISTORY`` kept; the read belongs to
statepact's own queues (``BaseWorkQueue``): a queue without it skips these tests.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from statepact._limits import LEASE_EXPIRED, MAX_ERROR_HISTORY
from statepact.clock import ManualClock
from statepact.errors import LeaseLostError
from statepact.models import AttemptError, ItemStatus
from statepact.queue import QueuePolicy, WorkQueue
from statepact.testing.queue_suite._common import LEASE, SuiteBase, _claim, _item
from statepact.testing.queue_suite.operator import _operator

__all__ = ["ErrorHistoryConformance"]


def _entry(attempt: int, error: str, at: datetime, kind: str = "failed") -> AttemptError:
    return AttemptError(attempt=attempt, error=error, at=at, kind=kind)


class ErrorHistoryConformance(SuiteBase):
    """Each failure, reaped lease and cancel with a reason leaves an entry, oldest first."""

    async def test_failures_are_kept_in_order_with_their_attempts(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """Fail twice then ack: two entries, attempts 1 and 2 in order, with their errors
        and the clock's time of each failure; the ack adds nothing."""
        queue = _operator(work_queue)
        await queue.enqueue(_item("acme", "job-1"))
        first_at = clock.now()
        await queue.fail(await _claim(queue), "boom 1", retry_in=0)
        clock.advance(5)
        second_at = clock.now()
        await queue.fail(await _claim(queue), "Ошибка ✗\nline 2", retry_in=0)
        clock.advance(5)
        done = await queue.ack(await _claim(queue))
        assert done.status is ItemStatus.DONE and done.last_error == "Ошибка ✗\nline 2"
        assert await queue.error_history("acme", "job-1") == [
            _entry(1, "boom 1", first_at),
            _entry(2, "Ошибка ✗\nline 2", second_at),
        ]

    async def test_a_reaped_lease_appends_an_entry(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """reap appends the lapse (kind lease_expired, the attempt it ended) to what the
        failures before it left; a dead letter by fail appends too, and requeue keeps it."""
        queue = _operator(work_queue)
        await queue.enqueue(_item("acme", "job-1"))
        failed_at = clock.now()
        await queue.fail(await _claim(queue), "boom", retry_in=0)
        await _claim(queue)
        clock.advance(LEASE)
        (moved,) = await queue.reap()
        reaped_at = clock.now()
        assert moved.last_error == LEASE_EXPIRED
        dead = await queue.fail(await _claim(queue), "poison", retryable=False)
        assert dead.status is ItemStatus.DEAD
        history = [
            _entry(1, "boom", failed_at),
            _entry(2, LEASE_EXPIRED, reaped_at, "lease_expired"),
            _entry(3, "poison", reaped_at),
        ]
        assert await queue.error_history("acme", "job-1") == history
        await queue.requeue(dead)
        assert await queue.error_history("acme", "job-1") == history

    async def test_a_cancel_with_a_reason_appends_an_entry(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """cancel with a reason appends it (kind cancelled, the attempts made so far); a
        cancel without one appends nothing."""
        queue = _operator(work_queue)
        await queue.enqueue_many([_item("acme", "running"), _item("acme", "waiting")])
        await queue.enqueue(_item("acme", "quiet"))
        lease = await _claim(queue)
        assert lease.item.item_id == "running"
        clock.advance(3)
        await queue.cancel_many("acme", ["running", "waiting"], reason="no longer wanted")
        await queue.cancel("acme", "quiet")
        assert await queue.error_history("acme", "running") == [
            _entry(1, "no longer wanted", clock.now(), "cancelled")
        ]
        assert await queue.error_history("acme", "waiting") == [
            _entry(0, "no longer wanted", clock.now(), "cancelled")
        ]
        assert await queue.error_history("acme", "quiet") == []

    @pytest.mark.parametrize(
        "queue_policy",
        [QueuePolicy(max_attempts=MAX_ERROR_HISTORY + 5, backoff_base=1, jitter=0)],
    )
    async def test_the_history_keeps_the_newest_entries_up_to_the_cap(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """More failures than MAX_ERROR_HISTORY keep the newest MAX_ERROR_HISTORY, oldest
        first."""
        queue = _operator(work_queue)
        await queue.enqueue(_item("acme", "job-1"))
        failures = MAX_ERROR_HISTORY + 3
        for attempt in range(1, failures + 1):
            await queue.fail(await _claim(queue), f"boom {attempt}", retry_in=0)
            clock.advance(1)
        history = await queue.error_history("acme", "job-1")
        assert history is not None and len(history) == MAX_ERROR_HISTORY
        assert [entry.attempt for entry in history] == list(range(4, failures + 1))
        assert history[-1].error == f"boom {failures}"

    async def test_a_missing_item_has_none_and_a_fresh_one_an_empty_history(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """error_history is None for a missing item, [] for one that never failed, and
        refuses a bad id naming it."""
        queue = _operator(work_queue)
        assert await queue.error_history("acme", "nothing") is None
        await queue.enqueue(_item("acme", "job-1"))
        assert await queue.error_history("acme", "job-1") == []
        await queue.ack(await _claim(queue))
        assert await queue.error_history("acme", "job-1") == []
        with pytest.raises(ValueError, match="item_id"):
            await queue.error_history("acme", "")
        with pytest.raises(ValueError, match="tenant"):
            await queue.error_history("", "job-1")

    async def test_a_failure_with_a_lost_lease_appends_nothing(
        self, work_queue: WorkQueue, clock: ManualClock
    ) -> None:
        """A fail with a stale lease (a heartbeat moved the token on, or reap moved the item
        on) raises LeaseLostError and appends nothing."""
        queue = _operator(work_queue)
        await queue.enqueue(_item("acme", "job-1"))
        stale = await _claim(queue)
        await queue.heartbeat(stale)
        with pytest.raises(LeaseLostError):
            await queue.fail(stale, "too late")
        assert await queue.error_history("acme", "job-1") == []
        clock.advance(LEASE)
        await queue.reap()
        with pytest.raises(LeaseLostError):
            await queue.fail(stale, "too late")
        assert await queue.error_history("acme", "job-1") == [
            _entry(1, LEASE_EXPIRED, clock.now(), "lease_expired")
        ]
