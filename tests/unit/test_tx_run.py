"""``TransactionManager.run``: which errors it re-runs, how it paces the re-runs, when it gives up.

The pacing is observed through the manager's own injection point, ``backoff``:
a ``RetryPolicy`` that records each delay it draws (and the attempt number it
was asked for), while the test measures the real time between attempts. The
conflicts are real ones, made by a rival commit on the memory backing.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass, field
from random import Random

import pytest

from statepact._retry import RetryPolicy
from statepact.clock import ManualClock
from statepact.errors import (
    ConflictError,
    DeadlockError,
    FencingError,
    LockTimeoutError,
    StatepactError,
)
from statepact.storage.memory import MemoryBackend
from statepact.tx import Transaction, TransactionManager

R = "orders"


@dataclass(frozen=True, slots=True)
class RecordingPolicy(RetryPolicy):
    """A ``RetryPolicy`` that records ``(attempt, delay)`` for every delay it draws.

    ``run`` copies the policy with ``attempts`` replaced; the copy shares ``drawn``.
    """

    drawn: list[tuple[int, float]] = field(default_factory=list, compare=False)

    def delay(self, attempt: int, rng: Random | None = None) -> float:
        value = RetryPolicy.delay(self, attempt, rng)
        self.drawn.append((attempt, value))
        return value


def manager_with(policy: RetryPolicy) -> TransactionManager:
    return TransactionManager(MemoryBackend(clock=ManualClock()), backoff=policy)


async def read_value(manager: TransactionManager, key: str) -> object:
    async with manager.transaction() as tx:
        return await tx.read(R, key)


class LosingBody:
    """A transaction body that loses a real conflict on its first ``losses`` attempts.

    Each losing attempt reads ``x``, lets a rival commit ``x``, then writes ``x``:
    first committer wins, so the commit raises ``ConflictError``. Every attempt's
    start time is recorded.
    """

    def __init__(self, manager: TransactionManager, losses: int) -> None:
        self.manager = manager
        self.losses = losses
        self.started: list[float] = []

    async def __call__(self, tx: Transaction) -> str:
        self.started.append(time.monotonic())
        attempt = len(self.started)
        await tx.read(R, "x")
        if attempt <= self.losses:
            async with self.manager.transaction() as rival:
                rival.write(R, "x", f"rival-{attempt}")
        tx.write(R, "x", f"mine-{attempt}")
        return f"mine-{attempt}"


async def test_run_backs_off_with_growing_jittered_bounded_delays() -> None:
    """Each re-run waits a delay drawn below a doubling, capped ceiling; the wait is real."""
    policy = RecordingPolicy(base_delay=0.004, max_delay=0.016)
    manager = manager_with(policy)
    body = LosingBody(manager, losses=5)
    assert await manager.run(body, retries=5) == "mine-6"
    assert await read_value(manager, "x") == "mine-6"
    assert len(body.started) == 6
    # The ceiling grows with the attempt number run asks for, up to max_delay.
    assert [attempt for attempt, _ in policy.drawn] == [0, 1, 2, 3, 4]
    ceilings = [policy.ceiling(attempt) for attempt, _ in policy.drawn]
    assert ceilings == [0.004, 0.008, 0.016, 0.016, 0.016]
    for (_, delay), ceiling in zip(policy.drawn, ceilings, strict=True):
        assert 0 <= delay < ceiling
    # run slept at least the delay it drew before each re-run.
    gaps = [later - earlier for earlier, later in itertools.pairwise(body.started)]
    for gap, (_, delay) in zip(gaps, policy.drawn, strict=True):
        assert gap >= delay - 0.001


async def test_run_delays_are_jittered_and_grow_on_average() -> None:
    """Delays vary from run to run (full jitter), and later attempts wait longer on average."""
    policy = RecordingPolicy(base_delay=0.001, max_delay=0.004)
    manager = manager_with(policy)
    for _ in range(40):
        await manager.run(LosingBody(manager, losses=3), retries=3)
    by_attempt: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for attempt, delay in policy.drawn:
        by_attempt[attempt].append(delay)
    assert [len(delays) for delays in by_attempt.values()] == [40, 40, 40]
    for attempt, delays in by_attempt.items():
        assert len(set(delays)) > 30  # drawn, not fixed
        assert max(delays) < policy.ceiling(attempt)
    means = [statistics.fmean(by_attempt[attempt]) for attempt in (0, 1, 2)]
    # Uniform on [0, 1 ms), [0, 2 ms), [0, 4 ms): means near 0.5, 1 and 2 ms.
    assert means[0] < means[1] < means[2]


async def test_run_gives_up_with_the_last_conflict_after_retries() -> None:
    """After ``retries`` re-runs, the last ConflictError is raised; the losing writes are absent."""
    policy = RecordingPolicy(base_delay=0.001, max_delay=0.002)
    manager = manager_with(policy)
    body = LosingBody(manager, losses=1_000)
    with pytest.raises(ConflictError) as caught:
        await manager.run(body, retries=3)
    assert len(body.started) == 4
    assert len(policy.drawn) == 3  # no sleep after the last attempt
    assert (caught.value.resource, caught.value.key) == (R, "x")
    assert "at version 4" in str(caught.value)  # the fourth rival's commit: the last error
    assert await read_value(manager, "x") == "rival-4"
    assert sum(delay for _, delay in policy.drawn) <= RetryPolicy(4, 0.001, 0.002).budget


async def test_run_with_no_retries_tries_once() -> None:
    """retries=0: one attempt, no pause, the conflict propagates."""
    policy = RecordingPolicy()
    manager = manager_with(policy)
    body = LosingBody(manager, losses=1)
    with pytest.raises(ConflictError):
        await manager.run(body, retries=0)
    assert len(body.started) == 1 and policy.drawn == []


@pytest.mark.parametrize(
    "error",
    [
        DeadlockError(resource=R, key="x"),
        LockTimeoutError(resource=R, key="x", timeout=0.0),
        ConflictError("raised by the body", resource=R, key="x"),
    ],
)
async def test_run_retries_each_retried_error_raised_in_the_body(error: StatepactError) -> None:
    """DeadlockError, LockTimeoutError and ConflictError raised by fn are re-run like conflicts."""
    policy = RecordingPolicy(base_delay=0.001, max_delay=0.001)
    manager = manager_with(policy)
    calls = 0

    async def body(tx: Transaction) -> int:
        nonlocal calls
        calls += 1
        tx.write(R, "x", calls)
        if calls < 3:
            raise error
        return calls

    assert await manager.run(body, retries=5) == 3
    assert [attempt for attempt, _ in policy.drawn] == [0, 1]
    assert await read_value(manager, "x") == 3  # the failed attempts' writes were rolled back


async def test_run_retries_a_real_lock_timeout() -> None:
    """A lock another transaction holds times out in fn; run re-runs it, then gives up."""
    policy = RecordingPolicy(base_delay=0.001, max_delay=0.001)
    manager = manager_with(policy)
    holder = await manager.begin()
    await holder.lock(R, "x")
    calls = 0

    async def body(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        await tx.lock(R, "x", timeout=0.01)
        tx.write(R, "x", "locked write")

    with pytest.raises(LockTimeoutError):
        await manager.run(body, retries=2)
    assert calls == 3 and len(policy.drawn) == 2
    await holder.rollback()
    await manager.run(body, retries=0)  # the lock is free now
    assert await read_value(manager, "x") == "locked write"


async def test_run_does_not_retry_other_errors() -> None:
    """A FencingError or any non-conflict error propagates at once: one attempt, no pause."""
    policy = RecordingPolicy()
    clock = ManualClock()
    manager = TransactionManager(MemoryBackend(clock=clock), backoff=policy)
    old = await manager.acquire_lease("job", "w1", 10)
    assert old is not None
    clock.advance(11)
    assert await manager.acquire_lease("job", "w2", 10) is not None
    calls = 0

    async def fenced(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        tx.write(R, "x", "late")

    with pytest.raises(FencingError):
        await manager.run(fenced, fencing=old, retries=5)
    assert calls == 1

    async def broken(tx: Transaction) -> None:
        nonlocal calls
        calls += 1
        tx.write(R, "x", "half")
        raise KeyError("not a conflict")

    with pytest.raises(KeyError):
        await manager.run(broken, retries=5)
    assert calls == 2
    assert policy.drawn == []
    assert await read_value(manager, "x") is None
