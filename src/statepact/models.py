"""The records that cross the protocols: runs, sessions, pages, work items, leases.

Every model is a frozen pydantic model, so a record handed out by one call
cannot be mutated under another; use ``model_copy(update=...)`` to change one.
Models validate shape only; the fronts in ``state.py`` and ``queue.py`` validate
content (ids, JSON, sizes) before anything reaches a backing.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AttemptError",
    "ItemStatus",
    "Lease",
    "Page",
    "QueueStats",
    "RunRecord",
    "RunStatus",
    "RunTotals",
    "SessionRecord",
    "TenantQueueStats",
    "WorkItem",
]

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

_FROZEN = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class RunStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class RunRecord(BaseModel):
    """One agent run: what a worker last wrote (``data``) plus five accumulating counters.

    ``version`` is 0 for a run that has not been stored yet. ``put_run`` writes
    ``data``, ``status`` and ``session_id`` only; the counters move through
    ``patch_run`` alone. ``seq`` is assigned by the store at creation and never
    rewritten; listings page by it.
    """

    model_config = _FROZEN

    tenant: str
    run_id: str
    session_id: str | None = None
    status: RunStatus = RunStatus.PENDING
    data: dict[str, Any] = Field(default_factory=dict)
    version: int = Field(default=0, ge=0)
    input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cost: Decimal = Field(default=Decimal(0), ge=0)
    iterations: int = Field(default=0, ge=0)
    cursor: int = Field(default=0, ge=0)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    seq: int | None = None


class RunTotals(BaseModel):
    """A tenant's runs created at or after ``since`` (``StateStore.run_totals``): how many,
    how many of each status, and their counters summed, exactly."""

    model_config = _FROZEN

    tenant: str
    since: datetime
    runs: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)
    iterations: int = 0
    by_status: dict[str, int] = Field(default_factory=dict)


class SessionRecord(BaseModel):
    """A session: a JSON blob, versioned like a run, that indexes its runs."""

    model_config = _FROZEN

    tenant: str
    session_id: str
    data: dict[str, Any] = Field(default_factory=dict)
    version: int = Field(default=0, ge=0)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    seq: int | None = None


class Page(BaseModel, Generic[T]):
    """One page of a listing; pass ``next`` as ``after`` to get the following page."""

    model_config = ConfigDict(frozen=True)

    items: list[T]
    next: str | None = None


class ItemStatus(StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"


class WorkItem(BaseModel):
    """A unit of work. ``(queue, tenant, item_id)`` identifies it; enqueue is idempotent on it.

    Within a tenant, due items are claimed highest ``priority`` first, then in
    enqueue order. ``queue`` may be left ``None``: enqueue fills in the queue's
    own name.

    ``unique_key`` makes the item one of a kind in its tenant while it is queued or
    leased (with ``unique_for``, also while done, until the period it was enqueued
    in ends): an enqueue of another item with the key returns that item instead
    (see ``statepact.queue.unique_slot``). ``timeout`` is the seconds a worker gives
    its handler before cancelling it (the worker's default when ``None``).

    ``limit_key`` names what the item spends (e.g. ``"openai:gpt-4o"``) and ``weight``
    how much of it (e.g. the tokens it expects; 1 by default): the queue's
    ``QueueLimits`` cap and rate-limit claims by them (docs/work-queue.md#flow-control).
    """

    model_config = _FROZEN

    tenant: str
    item_id: str
    payload: dict[str, Any] = Field(default_factory=dict)
    queue: str | None = None
    priority: int = 0
    available_at: datetime | None = None
    attempts: int = Field(default=0, ge=0)
    status: ItemStatus = ItemStatus.QUEUED
    last_error: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    unique_key: str | None = None
    unique_for: timedelta | None = None
    timeout: float | None = None
    limit_key: str | None = None
    weight: int = Field(default=1, ge=1)


class AttemptError(BaseModel):
    """One entry of an item's error history (``error_history``), oldest first.

    ``attempt`` is the attempt the error ended (the item's ``attempts`` then: for a
    cancel of a queued item, the attempts made so far, 0 if it never ran); ``at`` is the
    queue's clock when it was written; ``error`` is the text ``last_error`` got then.
    ``kind`` says which write it was: ``failed`` (``fail``, a worker's timeouts and
    handler errors included), ``lease_expired`` (``reap`` moved the lapsed lease on) or
    ``cancelled`` (``cancel`` with a reason).
    """

    model_config = _FROZEN

    attempt: int = Field(ge=0)
    error: str
    at: datetime
    kind: Literal["failed", "lease_expired", "cancelled"] = "failed"


class Lease(BaseModel):
    """A claim on one work item, fenced by ``token``.

    ``token`` changes on every claim and heartbeat; a settle or heartbeat that
    presents a token the item no longer carries raises ``LeaseLostError`` and
    writes nothing. ``lease_seconds`` is the duration a heartbeat extends by.
    """

    model_config = _FROZEN

    item: WorkItem
    worker_id: str
    token: int
    expires_at: datetime
    lease_seconds: float


class TenantQueueStats(BaseModel):
    model_config = _FROZEN

    queued: int = 0
    leased: int = 0
    dead: int = 0
    cancelled: int = 0


class QueueStats(BaseModel):
    """Counts per tenant; tenants with nothing queued, leased, dead or cancelled are left
    out. Done items are not counted (a count that grows with finished work would cost
    what it counts)."""

    model_config = _FROZEN

    queue: str
    tenants: dict[str, TenantQueueStats] = Field(default_factory=dict)

    @property
    def queued(self) -> int:
        return sum(t.queued for t in self.tenants.values())

    @property
    def leased(self) -> int:
        return sum(t.leased for t in self.tenants.values())

    @property
    def dead(self) -> int:
        return sum(t.dead for t in self.tenants.values())

    @property
    def cancelled(self) -> int:
        return sum(t.cancelled for t in self.tenants.values())


def stored(model: type[M], fields: dict[str, Any]) -> M:
    """A ``model`` a backing rebuilt from its own server's reply (or a front built from
    fields it checked one by one), not validated again.

    Only for values the backing decoded (or the front checked) itself, each already of
    its field's type (an enum member, a timezone-aware ``datetime``, a ``Decimal``, a
    ``dict`` fresh from ``json.loads``), with every field named, in declaration order: the record
    then equals, dumps and prints as the validated one would (``tests/unit/test_models.py``
    holds the two side by side), at a fifth of the cost. Never for a caller's input as given.
    """
    record = model.__new__(model)
    object.__setattr__(record, "__dict__", fields)
    object.__setattr__(record, "__pydantic_fields_set__", set(fields))
    object.__setattr__(record, "__pydantic_extra__", None)
    object.__setattr__(record, "__pydantic_private__", None)
    return record


def stored_lease(
    item: WorkItem, worker_id: str, token: int, expires_at: datetime, seconds: float
) -> Lease:
    """A lease a queue built from its own reply (``item`` from its own store, ``worker_id``
    checked by the front), without validating it again: :func:`stored` for ``Lease``."""
    return stored(
        Lease,
        {
            "item": item,
            "worker_id": worker_id,
            "token": token,
            "expires_at": expires_at,
            "lease_seconds": seconds,
        },
    )
