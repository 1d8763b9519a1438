"""``QueuePolicy`` and the rules of a queue every backing applies alike.

Retries, backoff, the dead letter and retention (``QueuePolicy``), what it
decided (``FailOutcome``, ``LapseOutcome``), the one rule of unique keys
(``unique_slot``, ``holds_unique_slot``) and the shapes a watch takes
(``WorkWatch``, ``OnCancel``). ``statepact.queue`` re-exports every name: import
them from there. This module must never reach a backing or do I/O.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from statepact._codec import require_seconds
from statepact._limits import LEASE_EXPIRED
from statepact.models import ItemStatus, WorkItem

__all__ = [
    "FailOutcome",
    "LapseOutcome",
    "OnCancel",
    "QueuePolicy",
    "WorkWatch",
    "holds_unique_slot",
    "unique_slot",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: What ``watch(on_cancel=...)`` calls when a leased item is cancelled anywhere:
#: ``on_cancel(tenant, item_id, token)``, ``token`` being the voided lease's.
OnCancel: TypeAlias = Callable[[str, str, int], None]


def unique_slot(item: WorkItem, now: datetime) -> str | None:
    """The slot an item enqueued at ``now`` holds: the one rule of unique keys, every backing's.

    ``None`` without a ``unique_key``; the key itself without ``unique_for`` (held
    while the item is queued or leased, delayed included); with ``unique_for``,
    ``"<key>@<bucket>"``, bucket being ``floor(epoch seconds / unique_for seconds)``
    of ``now`` (held while queued, leased or done: "at most once per period").
    Two items of one tenant holding one slot never exist together.
    """
    key = item.unique_key
    if key is None:
        return None
    if item.unique_for is None:
        return key
    return f"{key}@{(now - _EPOCH) // item.unique_for}"


def holds_unique_slot(status: ItemStatus, *, by_period: bool) -> bool:
    """Whether an item in ``status`` keeps its unique slot (``by_period``: it has
    ``unique_for``); leaving these states frees the slot for good (a requeued dead item
    holds none)."""
    if status is ItemStatus.QUEUED or status is ItemStatus.LEASED:
        return True
    return by_period and status is ItemStatus.DONE


class QueuePolicy(BaseModel):
    """Retries, backoff and the dead letter, decided once for every backing.

    An attempt is counted when an item is claimed (``release`` gives it back).
    After a failure with ``attempts < max_attempts`` the item is retried after
    ``min(backoff_cap, backoff_base * 2**(attempts-1))`` seconds, shortened by up
    to ``jitter`` of itself at random; otherwise, or when the failure is not
    retryable, it is dead-lettered with its last error kept. A lease that lapses
    is treated as a retryable failure without backoff.

    ``keep_done``, ``keep_cancelled`` and ``keep_dead`` are how long a finished item
    stays after it finished (its ``updated_at``) before ``prune`` deletes it;
    ``None`` keeps it forever.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(default=5, ge=1, le=10_000)
    backoff_base: float = Field(default=1.0, gt=0, le=86_400)
    backoff_cap: float = Field(default=600.0, gt=0, le=30 * 86_400)
    jitter: float = Field(default=0.1, ge=0, le=1)
    keep_done: timedelta | None = timedelta(days=1)
    keep_cancelled: timedelta | None = timedelta(days=1)
    keep_dead: timedelta | None = timedelta(days=7)

    @field_validator("keep_done", "keep_cancelled", "keep_dead")
    @classmethod
    def _retention(cls, value: timedelta | None, info: ValidationInfo) -> timedelta | None:
        if value is not None:
            require_seconds(str(info.field_name), value, allow_zero=True)
        return value

    @model_validator(mode="after")
    def _cap_above_base(self) -> QueuePolicy:
        if self.backoff_cap < self.backoff_base:
            raise ValueError("backoff_cap: must not be below backoff_base")
        return self

    def retry_delay(self, attempts: int, *, rand: float | None = None) -> timedelta:
        """The wait before the next try, after ``attempts`` tries (1-based)."""
        exponent = min(max(attempts - 1, 0), 62)
        ceiling = min(self.backoff_cap, self.backoff_base * (2.0**exponent))
        draw = random.random() if rand is None else rand
        return timedelta(seconds=ceiling * (1.0 - self.jitter * draw))

    def after_failure(
        self, attempts: int, now: datetime, *, retryable: bool, rand: float | None = None
    ) -> FailOutcome:
        if not retryable or attempts >= self.max_attempts:
            return FailOutcome(dead=True, available_at=now)
        return FailOutcome(dead=False, available_at=now + self.retry_delay(attempts, rand=rand))

    def after_lapse(self) -> LapseOutcome:
        """What ``reap`` does with an item whose lease lapsed (see :class:`LapseOutcome`)."""
        return LapseOutcome(dead_at=self.max_attempts, error=LEASE_EXPIRED)

    def lapse_is_dead(self, attempts: int) -> bool:
        """Whether an item whose lease lapsed after ``attempts`` tries goes to the dead letter."""
        return self.after_lapse().is_dead(attempts)

    def prune_cutoffs(self, now: datetime) -> dict[ItemStatus, datetime]:
        """Per finished status kept for a while: items that finished before this go."""
        keep = {
            ItemStatus.DONE: self.keep_done,
            ItemStatus.CANCELLED: self.keep_cancelled,
            ItemStatus.DEAD: self.keep_dead,
        }
        return {status: now - kept for status, kept in keep.items() if kept is not None}


@dataclass(frozen=True, slots=True)
class FailOutcome:
    """What ``QueuePolicy`` decided for a failed item."""

    dead: bool
    available_at: datetime


@dataclass(frozen=True, slots=True)
class LapseOutcome:
    """What ``QueuePolicy`` decided for the items ``reap`` moves, handed to the backing.

    An item claimed ``dead_at`` times or more goes to the dead letter, any other
    back to the queue, due now; each gets ``last_error = error``.
    """

    dead_at: int
    error: str

    def is_dead(self, attempts: int) -> bool:
        return attempts >= self.dead_at


class WorkWatch(Protocol):
    """What ``WorkQueue.watch()`` yields."""

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - the fallback poll
        """Until work may have arrived (True) or ``timeout`` seconds passed (False)."""
        ...
