"""The one retry policy: bounded attempts, doubling delays with full jitter.

Used for waiting out a failover (connection errors only) and by
``TransactionManager.run`` between conflicting attempts. A write the failover
may send twice carries a call id (:func:`new_op_id`) that its script or
statement recognises, so a resend applies it once. Every worker that
started together retries together, so each delay is drawn uniformly from
``[0, min(max_delay, base_delay * 2**attempt))``.

Each retry is logged at WARNING on ``statepact.retry`` (what, which attempt, the
error's type, the delay) and the last failure at ERROR; a record names the
error's type only, never its text (a driver's message can quote a statement's
parameters). See docs/observability.md.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from statepact import _observe
from statepact._cancel import finish
from statepact.errors import StatepactError

__all__ = [
    "FAILOVER",
    "RetryPolicy",
    "Retrying",
    "UniqueIds",
    "call_with_failover",
    "new_op_id",
    "retry",
]

T = TypeVar("T")

_log = logging.getLogger("statepact.retry")


class UniqueIds:
    """Ids unique across processes and restarts: 64 random bits drawn once per process
    (again in a forked child), then a counter in hex. ``next(ids.ids)`` formats the
    next count in C (``%x``, quicker than ``str.format``), with no Python frame and no
    system call per id (``uuid4`` and ``secrets`` make one each). The call ids of
    resendable writes and the transaction ids come from here: they name call-id rows,
    replay records, lock rows and history entries on servers that many processes share."""

    def __init__(self) -> None:
        self._reseed()
        os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        # The prefix is hex digits: no ``%`` in it but the counter's.
        self.ids: Iterator[str] = map(f"{os.urandom(8).hex()}%x".__mod__, itertools.count(1))

    def __call__(self) -> str:
        return next(self.ids)


_op_ids = UniqueIds()


def new_op_id() -> str:
    """A call id for a write the failover may resend (:class:`UniqueIds`: 17 or more
    lowercase hex digits, never reused).

    The same id goes with every resend of one call; the Redis scripts and the
    PostgreSQL statements recognise their own first attempt by it.
    """
    return next(_op_ids.ids)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``attempts`` calls in all (the first included), with backoff between them."""

    attempts: int = 5
    base_delay: float = 0.05
    max_delay: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts: must be at least 1")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("base_delay/max_delay: must not be negative")

    def ceiling(self, attempt: int) -> float:
        """The largest delay after failed attempt number ``attempt`` (0-based)."""
        return float(min(self.max_delay, self.base_delay * (2 ** min(attempt, 62))))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        return (rng or random).uniform(0.0, self.ceiling(attempt))

    @property
    def budget(self) -> float:
        """The most time spent sleeping between attempts."""
        return sum(self.ceiling(i) for i in range(self.attempts - 1))


@dataclass(frozen=True, slots=True)
class Retrying:
    """How one kind of retry loop names itself and logs: ``reason`` (``failover``,
    ``conflict``) for :func:`statepact._observe.retried`, the logger, and the levels of
    a retry and of giving up. A connection error retried is news (WARNING, then ERROR);
    a conflict retried is the design working (DEBUG, then WARNING)."""

    reason: str
    log: logging.Logger
    retry_level: int
    give_up_level: int


FAILOVER = Retrying("failover", _log, logging.WARNING, logging.ERROR)


async def retry(
    attempt: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    retryable: Callable[[Exception], bool],
    how: Retrying,
    what: str,
    backing: str,
    give_up: Callable[[Exception], BaseException] | None = None,
) -> T:
    """The one retry loop: ``attempt()`` until it returns or raises an error that is not
    ``retryable``, at most ``policy.attempts`` times, sleeping ``policy.delay`` between.

    Past the budget the last error is raised (``give_up(error)`` instead, from it, when
    given). Every retry and the giving up are logged as ``how`` says, naming the error's
    type only, and reported to the installed observer. The sleeps are cancellable.
    """
    count = 0
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if not retryable(exc):
                raise
            count += 1
            fields = {
                "backing": backing,
                "operation": what,
                "attempt": count,
                "max_attempts": policy.attempts,
                "error_type": type(exc).__name__,
            }
            if count >= policy.attempts:
                how.log.log(
                    how.give_up_level,
                    "%s %s: gave up after %d attempt(s), the last failed with %s",
                    backing,
                    what,
                    count,
                    type(exc).__name__,
                    extra=fields,
                )
                if give_up is None:
                    raise
                raise give_up(exc) from exc
            delay = policy.delay(count - 1)
            how.log.log(
                how.retry_level,
                "%s %s: attempt %d of %d failed with %s; retrying in %.3f s",
                backing,
                what,
                count,
                policy.attempts,
                type(exc).__name__,
                delay,
                extra={**fields, "delay": delay},
            )
            _observe.retried(reason=how.reason, backing=backing, attempt=count, error=exc)
            await asyncio.sleep(delay)


async def call_with_failover(
    operation: Callable[[], Awaitable[T]],
    *,
    policy: RetryPolicy,
    is_transient: Callable[[BaseException], bool],
    give_up: Callable[[BaseException], StatepactError],
    translate: Callable[[BaseException], StatepactError | None] = lambda _exc: None,
    what: str = "a call",
    backing: str = "server",
    shield: bool = True,
) -> T:
    """Run ``operation``, retrying transient (connection) errors within ``policy``
    (:func:`retry`, logged on ``statepact.retry``).

    Each attempt runs to its end even if the caller is cancelled meanwhile
    (:func:`statepact._cancel.finish`); the caller then gets its
    ``CancelledError`` and no further attempt is made.

    ``shield=False`` drops that for an operation that may be abandoned (a read
    whose connection is closed, not reused, when its caller is cancelled).

    ``translate`` maps a non-transient driver error to its public error (or
    ``None`` to let it through). Past the budget, ``give_up(last_error)`` is
    raised from the last error. ``what`` (the call) and ``backing`` (``redis``,
    ``postgres``) name it in the log records.
    """

    async def attempt() -> T:
        try:
            # One attempt is one request to the server: once sent, it is answered before
            # a cancellation of the caller goes on (the sleeps between attempts stay
            # cancellable), so a driver never abandons a connection mid-reply and a
            # write has settled before whatever the caller does next.
            if shield:
                return await finish(operation())
            return await operation()
        except StatepactError:
            raise
        except Exception as exc:
            if not is_transient(exc):
                public = translate(exc)
                if public is not None:
                    raise public from exc
            raise

    return await retry(
        attempt,
        policy=policy,
        retryable=lambda exc: not isinstance(exc, StatepactError) and is_transient(exc),
        how=FAILOVER,
        what=what,
        backing=backing,
        give_up=give_up,
    )
