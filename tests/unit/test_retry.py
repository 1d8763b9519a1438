"""The one retry policy (``statepact._retry``): doubling ceilings, full jitter, a bounded budget,
and ``call_with_failover`` retrying transient errors only.

``call_with_failover`` sleeps with ``asyncio.sleep`` and takes no sleep to inject, so its
tests use policies whose delays are a millisecond or two.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from statepact._retry import RetryPolicy, UniqueIds, call_with_failover, new_op_id
from statepact.errors import QueueUnavailableError, StatepactError, StatePersistenceError

# Whole budget of a few milliseconds: retrying tests never wait for long.
TINY = RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.002)


class Transient(ConnectionError):
    """Stands for a dropped connection."""


class Permanent(ValueError):
    """Stands for an error waiting cannot fix."""


def _is_transient(exc: BaseException) -> bool:
    return isinstance(exc, Transient)


def _give_up(exc: BaseException) -> StatepactError:
    return StatePersistenceError(f"gave up after {type(exc).__name__}", reason="unavailable")


class Flaky:
    """An operation that raises each of ``failures`` in turn, then returns ``"done"``."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "done"


# -- ceilings, jitter, budget -----------------------------------------------------------


def test_ceilings_double_from_the_base_up_to_the_cap() -> None:
    """The ceiling after failed attempt n is base * 2**n, never above max_delay."""
    policy = RetryPolicy(attempts=10, base_delay=0.05, max_delay=2.0)
    assert [policy.ceiling(n) for n in range(8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    # Far past the cap (and past any float overflow of 2**n) it stays at the cap.
    assert policy.ceiling(100) == 2.0
    assert policy.ceiling(10_000) == 2.0


def test_every_delay_falls_below_its_ceiling_and_the_delays_vary() -> None:
    """Full jitter: each delay is drawn from [0, ceiling), and the draws spread over it."""
    policy = RetryPolicy(attempts=10, base_delay=0.05, max_delay=2.0)
    rng = random.Random(20260101)
    for attempt in range(8):
        ceiling = policy.ceiling(attempt)
        delays = [policy.delay(attempt, rng) for _ in range(500)]
        assert all(0.0 <= d < ceiling for d in delays), (attempt, ceiling)
        assert len(set(delays)) > 450, "the delays do not vary"
        # Full jitter, not "ceiling minus a little": draws reach both ends of the range.
        assert min(delays) < 0.1 * ceiling
        assert max(delays) > 0.9 * ceiling


def test_the_same_seed_draws_the_same_delays() -> None:
    """A seeded RNG makes the jitter reproducible; the module RNG is used without one."""
    policy = RetryPolicy()
    first = [policy.delay(n, random.Random(7)) for n in range(4)]
    second = [policy.delay(n, random.Random(7)) for n in range(4)]
    assert first == second
    unseeded = {policy.delay(3) for _ in range(50)}
    assert len(unseeded) > 40
    assert all(0.0 <= d < policy.ceiling(3) for d in unseeded)


@pytest.mark.parametrize(
    ("policy", "budget"),
    [
        # Four sleeps between five attempts: 0.05 + 0.1 + 0.2 + 0.4.
        (RetryPolicy(), 0.75),
        # One attempt: nothing to sleep between.
        (RetryPolicy(attempts=1), 0.0),
        # Capped: 0.1 + 0.2 + 0.4, then six sleeps at 0.5.
        (RetryPolicy(attempts=10, base_delay=0.1, max_delay=0.5), 3.7),
        (RetryPolicy(attempts=3, base_delay=0.0, max_delay=1.0), 0.0),
    ],
)
def test_the_budget_is_the_most_time_spent_sleeping(policy: RetryPolicy, budget: float) -> None:
    """The budget sums the ceilings of the attempts - 1 sleeps: no run of delays exceeds it."""
    assert policy.budget == pytest.approx(budget)
    rng = random.Random(1)
    for _ in range(200):
        slept = sum(policy.delay(n, rng) for n in range(policy.attempts - 1))
        assert slept <= policy.budget


@pytest.mark.parametrize(
    "kwargs",
    [{"attempts": 0}, {"base_delay": -0.1}, {"max_delay": -1.0}],
)
def test_a_nonsensical_policy_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


# -- call_with_failover -----------------------------------------------------------------


async def test_a_call_that_succeeds_is_made_once() -> None:
    """No error: one call, its result returned."""
    operation = Flaky()
    assert (
        await call_with_failover(
            operation, policy=TINY, is_transient=_is_transient, give_up=_give_up
        )
        == "done"
    )
    assert operation.calls == 1


async def test_a_non_transient_error_is_never_retried() -> None:
    """A non-transient error ends the call at once, as itself when translate passes it on."""
    operation = Flaky(Permanent("bad"), Permanent("bad"))
    with pytest.raises(Permanent):
        await call_with_failover(
            operation, policy=TINY, is_transient=_is_transient, give_up=_give_up
        )
    assert operation.calls == 1


async def test_a_non_transient_error_is_translated_after_one_call() -> None:
    """translate's public error is raised from the driver's error, still after one call."""
    operation = Flaky(Permanent("bad"))
    with pytest.raises(QueueUnavailableError) as caught:
        await call_with_failover(
            operation,
            policy=TINY,
            is_transient=_is_transient,
            give_up=_give_up,
            translate=lambda exc: QueueUnavailableError(f"translated {type(exc).__name__}"),
        )
    assert operation.calls == 1
    assert isinstance(caught.value.__cause__, Permanent)


async def test_a_statepact_error_passes_through_unretried() -> None:
    """An error already public (even one is_transient would accept) is not retried."""
    operation = Flaky(QueueUnavailableError("already public"))
    with pytest.raises(QueueUnavailableError, match="already public"):
        await call_with_failover(
            operation, policy=TINY, is_transient=lambda _exc: True, give_up=_give_up
        )
    assert operation.calls == 1


async def test_a_transient_error_is_retried_up_to_attempts_then_given_up() -> None:
    """A transient error that never clears: exactly ``attempts`` calls, then give_up's error
    raised from the last one, after no more than the budget of sleeping."""
    operation = Flaky(*(Transient(f"down {n}") for n in range(10)))
    began = time.monotonic()
    with pytest.raises(StatePersistenceError) as caught:
        await call_with_failover(
            operation, policy=TINY, is_transient=_is_transient, give_up=_give_up
        )
    elapsed = time.monotonic() - began
    assert operation.calls == TINY.attempts == 4
    assert caught.value.reason == "unavailable"
    assert str(caught.value) == "gave up after Transient"
    assert isinstance(caught.value.__cause__, Transient)
    assert str(caught.value.__cause__) == "down 3"
    # A generous margin: the machine is shared and noisy.
    assert elapsed < TINY.budget + 1.0


async def test_one_attempt_means_no_retry() -> None:
    """attempts=1: a transient error is given up on after the single call."""
    operation = Flaky(Transient("down"))
    with pytest.raises(StatePersistenceError):
        await call_with_failover(
            operation,
            policy=RetryPolicy(attempts=1),
            is_transient=_is_transient,
            give_up=_give_up,
        )
    assert operation.calls == 1


async def test_the_first_success_ends_the_retries() -> None:
    """Two transient errors, then success: three calls, the result returned, no fourth."""
    operation = Flaky(Transient("down"), Transient("still down"))
    result = await call_with_failover(
        operation, policy=TINY, is_transient=_is_transient, give_up=_give_up
    )
    assert result == "done"
    assert operation.calls == 3


async def test_a_non_transient_error_after_transient_ones_stops_the_retries() -> None:
    """Transient, then a permanent error: two calls, the permanent error raised."""
    operation = Flaky(Transient("down"), Permanent("bad"), Transient("down"))
    with pytest.raises(Permanent):
        await call_with_failover(
            operation, policy=TINY, is_transient=_is_transient, give_up=_give_up
        )
    assert operation.calls == 2


def test_call_ids_are_never_reused_and_fit_a_key_segment() -> None:
    ids = [new_op_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) >= 17 and set(i) <= set("0123456789abcdef") for i in ids)


def test_two_generators_draw_different_prefixes() -> None:
    # Two processes (or a process and its restart) share no ids even at the same count.
    first, second = UniqueIds(), UniqueIds()
    assert [first() for _ in range(3)] != [second() for _ in range(3)]


def test_a_forked_child_draws_new_ids() -> None:
    ids = UniqueIds()
    ids()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: new bits, and its count starts again
        os.write(write, ids().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = ids()
    assert child.endswith("1") and parent.endswith("2")
    assert child[:-1] != parent[:-1]  # not the parent's prefix
