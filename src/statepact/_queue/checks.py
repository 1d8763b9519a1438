"""The queue front's checks of what a caller hands it, used by :mod:`statepact.queue`:
leases, error texts, the dead-letter cursor, and the watch's timeout (an item to
enqueue: :mod:`statepact._queue.items`).

Each raises naming the field; none reads the clock or calls a backing.
"""

from __future__ import annotations

import asyncio
import json

from statepact._codec import (
    require_count,
    require_id,
    require_seconds,
    require_token,
)
from statepact._queue_policy import WorkWatch
from statepact.models import Lease, WorkItem

__all__ = [
    "MAX_BATCH",
    "MAX_ERROR_CHARS",
    "CheckedWatch",
    "SleepWatch",
    "dead_cursor",
    "error_text",
    "require_lease",
]

MAX_ERROR_CHARS = 4096
MAX_BATCH = 1000


def error_text(text: str) -> str:
    """An error or reason as every backing can store it: no NUL, lone surrogates as "?"
    (UTF-8 cannot hold them), at most ``MAX_ERROR_CHARS``."""
    message = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return message[:MAX_ERROR_CHARS]


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
    require_token(f"{field}.token", lease.token, "queue")
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
