"""The queue front's checks of what a caller hands it, used by :mod:`statepact.queue`:
an item to enqueue, leases, error texts, the dead-letter cursor, and the watch's timeout.

Each raises naming the field; none reads the clock or calls a backing.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta

from statepact._codec import (
    check_size,
    plain_int,
    plain_json,
    require_count,
    require_id,
    require_seconds,
)
from statepact._limits import MAX_PRIORITY, MAX_WEIGHT
from statepact._queue_policy import WorkWatch
from statepact.models import ItemStatus, Lease, WorkItem, stored

__all__ = [
    "MAX_BATCH",
    "MAX_ERROR_CHARS",
    "CheckedWatch",
    "SleepWatch",
    "checked_unique_for",
    "dead_cursor",
    "error_text",
    "prepared_item",
    "require_lease",
]

MAX_ERROR_CHARS = 4096
MAX_BATCH = 1000


def error_text(text: str) -> str:
    """An error or reason as every backing can store it: no NUL, lone surrogates as "?"
    (UTF-8 cannot hold them), at most ``MAX_ERROR_CHARS``."""
    message = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return message[:MAX_ERROR_CHARS]


def checked_unique_for(field: str, item: WorkItem) -> timedelta | None:
    """The item's checked ``unique_for``, which only makes sense with a ``unique_key``."""
    period = item.unique_for
    if period is None:
        return None
    if item.unique_key is None:
        raise ValueError(f"{field}unique_for: is only meaningful with a unique_key")
    seconds = require_seconds(f"{field}unique_for", period)
    return period if isinstance(period, timedelta) else timedelta(seconds=seconds)


def dead_cursor(after: object) -> tuple[str, str]:
    """``dead_letters_all``'s ``after``: the ``next`` of a page, ``["tenant", "item_id"]``."""
    if not isinstance(after, str):
        raise TypeError(f"after: must be a str (a page's next), got {type(after).__name__}")
    try:
        tenant, item_id = json.loads(after)
        return require_id("after", tenant), require_id("after", item_id)
    except (ValueError, TypeError):
        raise ValueError("after: is not the next of a dead_letters_all page") from None


def require_lease(lease: object, field: str = "lease") -> Lease:
    """A lease whose fields a backing reads have the right types and ranges.

    A lease rebuilt with ``model_copy``/``model_construct`` skips pydantic's
    checks, so what the settle calls read is checked here, before anything is sent.
    """
    if not isinstance(lease, Lease):
        raise TypeError(f"{field}: must be a Lease, got {type(lease).__name__}")
    if not isinstance(lease.item, WorkItem):
        raise TypeError(f"{field}.item: must be a WorkItem, got {type(lease.item).__name__}")
    require_id(f"{field}.item.tenant", lease.item.tenant)
    require_id(f"{field}.item.item_id", lease.item.item_id)
    require_count(f"{field}.item.attempts", lease.item.attempts)
    token = lease.token
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"{field}.token: must be an int, got {type(token).__name__}")
    if not 0 <= token < 2**63:
        raise ValueError(f"{field}.token: {token} is not a token any queue issues")
    return lease


class CheckedWatch:
    """A backing's ``WorkWatch`` behind the front's check of ``timeout``."""

    __slots__ = ("_watch",)

    def __init__(self, watch: WorkWatch) -> None:
        self._watch = watch

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - the fallback poll
        return await self._watch.wait(require_seconds("timeout", timeout, allow_zero=True))


class SleepWatch:
    """Wake-ups with nothing to listen to (a queue on one caller's connection): the
    timeout only."""

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - the fallback poll
        await asyncio.sleep(timeout)
        return False


def prepared_item(
    field: str,
    item: object,
    now: datetime,
    available_at: datetime,
    *,
    queue: str,
    max_value_bytes: int,
) -> tuple[WorkItem, bytes]:
    """The checked, fresh record of ``item`` for queue ``queue`` and its encoded payload;
    errors name ``field``."""
    if not isinstance(item, WorkItem):
        raise TypeError(f"{field or 'item'}: must be a WorkItem, got {type(item).__name__}")
    tenant = require_id(f"{field}tenant", item.tenant)
    item_id = require_id(f"{field}item_id", item.item_id)
    if item.queue is not None and item.queue != queue:
        raise ValueError(f"{field}queue: the item names queue {item.queue!r}, this is {queue!r}")
    if isinstance(item.priority, bool) or not isinstance(item.priority, int):
        raise TypeError(f"{field}priority: must be an int, got {type(item.priority).__name__}")
    if not -MAX_PRIORITY <= item.priority <= MAX_PRIORITY:
        raise ValueError(f"{field}priority: must be between -{MAX_PRIORITY} and {MAX_PRIORITY}")
    priority = plain_int(item.priority)
    unique_key = (
        None if item.unique_key is None else require_id(f"{field}unique_key", item.unique_key)
    )
    unique_for = checked_unique_for(field, item)
    timeout = None if item.timeout is None else require_seconds(f"{field}timeout", item.timeout)
    limit_key = None if item.limit_key is None else require_id(f"{field}limit_key", item.limit_key)
    weight = item.weight
    if isinstance(weight, bool) or not isinstance(weight, int):
        raise TypeError(f"{field}weight: must be an int, got {type(weight).__name__}")
    if not 1 <= weight <= MAX_WEIGHT:
        raise ValueError(f"{field}weight: must be between 1 and {MAX_WEIGHT}, got {weight}")
    plain, payload = plain_json(f"{field}payload", item.payload)
    if len(payload) > max_value_bytes:
        check_size(f"{field}payload", len(payload), max_value_bytes, where=f"item {item_id!r}")
    # Every field is checked above and of its type: build the record without
    # validating it again (a fifth of model_construct's cost; the same record).
    fresh = stored(
        WorkItem,
        {
            "tenant": tenant,
            "item_id": item_id,
            "payload": plain,
            "queue": queue,
            "priority": priority,
            "available_at": available_at,
            "attempts": 0,
            "status": ItemStatus.QUEUED,
            "last_error": None,
            "created_at": now,
            "updated_at": now,
            "unique_key": unique_key,
            "unique_for": unique_for,
            "timeout": timeout,
            "limit_key": limit_key,
            "weight": plain_int(weight),
        },
    )
    return fresh, payload
