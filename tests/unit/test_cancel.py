"""``statepact._cancel.finish``: work that has started runs to its end whatever cancels the
caller, and the caller's cancellation is always re-raised, never swallowed.

Each test cancels the way asyncio code does in practice: ``task.cancel()`` (once and
twice), ``asyncio.wait_for`` and ``asyncio.timeout`` running out, and a ``TaskGroup``
cancelling its other children when one fails.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from statepact._cancel import finish
from statepact._retry import RetryPolicy, call_with_failover
from statepact.errors import StatePersistenceError


class Work:
    """A piece of work that takes ``seconds`` and says whether it ran to its end."""

    def __init__(self, seconds: float = 0.05, error: BaseException | None = None) -> None:
        self.seconds = seconds
        self.error = error
        self.started = asyncio.Event()
        self.finished = False

    async def __call__(self) -> str:
        self.started.set()
        await asyncio.sleep(self.seconds)
        self.finished = True
        if self.error is not None:
            raise self.error
        return "done"


def _unhandled(loop: asyncio.AbstractEventLoop) -> list[dict[str, Any]]:
    """Collects what the loop would report as never retrieved."""
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    return seen


async def test_uncancelled_it_is_a_plain_await() -> None:
    """Without a cancellation, the work's result and errors come through unchanged."""
    assert await finish(Work(0)()) == "done"
    with pytest.raises(KeyError):
        await finish(Work(0, KeyError("k"))())


async def test_a_cancelled_caller_waits_for_the_work_then_gets_its_cancellation() -> None:
    """A cancel while the work runs: the work finishes, then the caller gets CancelledError."""
    work = Work()
    caller = asyncio.ensure_future(finish(work()))
    await work.started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert work.finished
    assert caller.cancelled()


async def test_a_second_cancel_does_not_abandon_the_work() -> None:
    """Cancelled again and again while it waits, the caller still waits for the work."""
    work = Work(0.1)
    caller = asyncio.ensure_future(finish(work()))
    await work.started.wait()
    for _ in range(3):
        caller.cancel()
        await asyncio.sleep(0.01)
    assert not caller.done()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert work.finished


async def test_wait_for_and_timeout_still_time_out() -> None:
    """asyncio.wait_for and asyncio.timeout turn the re-raised cancellation into TimeoutError,
    after the work has finished."""
    work = Work()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(finish(work()), 0.01)
    assert work.finished
    work = Work()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await finish(work())
    assert work.finished
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_a_task_group_waits_for_the_work_of_a_cancelled_child() -> None:
    """A sibling's failure cancels the child; its work still ends before the group raises."""
    work = Work()

    async def fails() -> None:
        await work.started.wait()
        raise LookupError("sibling")

    with pytest.raises(ExceptionGroup) as caught:
        async with asyncio.TaskGroup() as group:
            group.create_task(finish(work()))
            group.create_task(fails())
    assert caught.group_contains(LookupError)
    assert work.finished


async def test_an_error_after_the_cancel_is_dropped_quietly() -> None:
    """The work fails after the caller was cancelled: CancelledError wins, and the error is
    not reported as never retrieved."""
    seen = _unhandled(asyncio.get_running_loop())
    work = Work(0.02, RuntimeError("late"))
    caller = asyncio.ensure_future(finish(work()))
    await work.started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    del caller
    await asyncio.sleep(0)
    assert work.finished
    assert seen == []


async def test_a_cancel_as_the_work_ends_is_raised_and_its_error_retrieved() -> None:
    """The caller cancelled after the work ended but before the caller resumed: the caller
    gets its CancelledError, and the work's error is not reported as never retrieved."""
    seen = _unhandled(asyncio.get_running_loop())
    work = asyncio.ensure_future(Work(0.02, RuntimeError("late"))())
    caller = asyncio.ensure_future(finish(work))
    await asyncio.sleep(0)  # finish() is waiting on the work
    # Runs after finish()'s own callback on the work's end, before the caller resumes.
    cancel_caller = caller.cancel
    work.add_done_callback(lambda _work: cancel_caller())
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert work.done()
    del caller, work
    gc.collect()
    await asyncio.sleep(0)
    assert seen == []


async def test_cancelling_the_work_itself_ends_the_wait() -> None:
    """The work's own task cancelled (the loop shutting down) ends the caller's wait too."""
    work = Work(10)
    task = asyncio.ensure_future(work())
    caller = asyncio.ensure_future(finish(task))
    await work.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert not work.finished


async def test_call_with_failover_answers_the_attempt_in_flight_then_stops() -> None:
    """A cancel during an attempt lets that attempt finish and makes no further attempt;
    a cancel during the backoff between attempts stops at once."""
    attempts: list[Work] = []
    sent = asyncio.Event()

    async def operation() -> str:
        work = Work(0.05, ConnectionError("dropped"))
        attempts.append(work)
        sent.set()
        return await work()

    policy = RetryPolicy(attempts=5, base_delay=0.5, max_delay=0.5)

    def give_up(exc: BaseException) -> StatePersistenceError:
        return StatePersistenceError("gone", reason="unavailable")

    caller = asyncio.ensure_future(
        call_with_failover(operation, policy=policy, is_transient=lambda _e: True, give_up=give_up)
    )
    await sent.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert len(attempts) == 1
    assert attempts[0].finished


async def test_a_timeout_inside_the_work_still_fires() -> None:
    """The work's own ``asyncio.timeout`` cancels the task the work runs in: ``finish`` must
    let that through, or a stalled server call would wait forever instead of timing out."""

    async def bounded() -> str:
        try:
            async with asyncio.timeout(0.05):
                await asyncio.sleep(10)
        except TimeoutError:
            return "timed out"
        return "slept"

    assert await asyncio.wait_for(finish(bounded()), 2.0) == "timed out"


async def test_work_nested_in_finished_work_is_protected_once() -> None:
    """finish() inside work that finish() already protects awaits directly (no second task),
    and the outer caller's cancellation still waits for the inner work to end."""
    inner = Work(0.05)
    tasks_seen: list[asyncio.Task[Any] | None] = []

    async def outer() -> str:
        tasks_seen.append(asyncio.current_task())
        return await finish(_in_current_task(inner, tasks_seen))

    caller = asyncio.ensure_future(finish(outer()))
    await inner.started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert inner.finished
    assert tasks_seen[0] is tasks_seen[1]  # the inner work ran in the outer work's task


async def _in_current_task(work: Work, seen: list[asyncio.Task[Any] | None]) -> str:
    seen.append(asyncio.current_task())
    return await work()
