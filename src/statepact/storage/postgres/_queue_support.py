"""What ``PostgresWorkQueue``'s methods share: the shapes of its executors and
connections, a stored row read back as a ``WorkItem``, the parameters several
statements take, and the prune loop.

Nothing here builds SQL (``_sql/queue/`` does) or decides a retry or the dead letter.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any, Protocol, TypeVar

from sqlalchemy.engine import RowMapping

from statepact._cancel import finish
from statepact._codec import decode_json, json_array, json_array_of_encoded
from statepact._limits import PRUNE_PAUSE
from statepact.clock import Clock, read_clock
from statepact.models import ItemStatus, WorkItem, stored
from statepact.storage.postgres._client import Executor
from statepact.storage.postgres._direct import Prepared
from statepact.storage.postgres._sql.queue import CoreStatement, QueueStatements

__all__ = [
    "PRUNE_LEASE",
    "Conn",
    "Statements",
    "batch_params",
    "cutoff_params",
    "item_of",
    "item_or_none",
    "optional_json",
    "prune",
]

#: How long a pruner's lease on a queue lasts past each batch: far above one batch, so
#: only a pruner that died leaves it to lapse.
PRUNE_LEASE = timedelta(seconds=60)

#: The statements a queue runs: Core expressions, or compiled once for the driver.
Statements = QueueStatements[CoreStatement] | QueueStatements[Prepared]

T = TypeVar("T")


class Conn(Protocol):
    """What a call's work runs its statements on: an ``AsyncConnection`` or ``AsyncSession``
    (Core statements) or the driver's connection (``_direct.Statements``, prepared ones)."""

    async def execute(self, statement: Any, parameters: Any = None) -> Any: ...


def item_or_none(row: RowMapping | None) -> WorkItem | None:
    return None if row is None else item_of(row)


def item_of(row: RowMapping) -> WorkItem:
    # Read from this queue's own table: every field is of its type already, built in the
    # model's order without validating it again.
    return stored(
        WorkItem,
        {
            "tenant": row["tenant"],
            "item_id": row["item_id"],
            "payload": decode_json(row["payload"]),
            "queue": row["queue"],
            "priority": row["priority"],
            "available_at": row["available_at"],
            "attempts": row["attempts"],
            "status": ItemStatus(row["status"]),
            "last_error": row["last_error"],
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
            "unique_key": row["unique_key"],
            "unique_for": row["unique_for"],
            "timeout": row["timeout"],
            "limit_key": row["limit_key"],
            "weight": row["weight"],
        },
    )


def cutoff_params(cutoffs: Mapping[ItemStatus, datetime]) -> dict[str, datetime | None]:
    """The per-status cutoffs of prune and its count; a status without one (kept
    forever) is NULL, which no ``updated_at`` is before."""
    return {
        "p_done_before": cutoffs.get(ItemStatus.DONE),
        "p_cancelled_before": cutoffs.get(ItemStatus.CANCELLED),
        "p_dead_before": cutoffs.get(ItemStatus.DEAD),
    }


def optional_json(values: Sequence[str | float | None]) -> str | None:
    """A batch's optional column as one JSON text, ``null`` where unset; ``None`` (no array
    to read: every item's is NULL) when none is set."""
    if values.count(None) == len(values):
        return None
    return json.dumps(values, allow_nan=False, separators=(",", ":"))


def _unless_all(values: list[int], default: int) -> str | None:
    """A batch's column of ints as one JSON text, ``None`` when each is ``default``."""
    return None if values.count(default) == len(values) else json_array(values)


def batch_params(
    batch: Sequence[tuple[WorkItem, bytes]], slots: Sequence[str | None]
) -> dict[str, Any]:
    """The parameters of ``enqueue_many`` and ``enqueue_new`` for ``batch`` (checked items,
    their unique slots): each column one JSON text, the rows in ``(tenant, item_id)``
    byte order, each with its place in ``batch``; each tenant's count and earliest due
    moment, for ``enqueue_new``. Column by column (``map``), never an object per item
    the collector would have to count."""
    count = len(batch)
    # A str's code point order is its UTF-8 bytes'; ids hold no NUL, so "tenant\0item_id"
    # sorts as the pair does.
    keys = [f"{item.tenant}\x00{item.item_id}" for item, _ in batch]
    order = sorted(range(count), key=keys.__getitem__)
    in_order = order == list(range(count))
    rows = batch if in_order else [batch[place] for place in order]
    items = [item for item, _ in rows]
    tenants = list(map(_TENANT, items))
    # Each moment once, each item naming its own by place (from 1): see _batch_insert.
    moments: dict[datetime, int] = dict.fromkeys(map(_AVAILABLE, items), 0)
    moments.update(dict.fromkeys(map(_CREATED, items), 0))
    for place, moment in enumerate(moments, 1):
        moments[moment] = place
    available = list(map(moments.__getitem__, map(_AVAILABLE, items)))
    created = list(map(moments.__getitem__, map(_CREATED, items)))
    turns = _turns(items, tenants, available)
    sent_slots = slots if in_order else [slots[place] for place in order]
    return {
        "p_count": count,
        "p_times": list(moments),
        # The latest clock reading of the batch (concurrent enqueues share one): turns.
        "p_now": max(map(_CREATED, items)),
        "p_tenants": json_array(tenants),
        "p_item_ids": json_array(list(map(_ITEM_ID, items))),
        "p_payloads": json_array_of_encoded([payload for _, payload in rows]),
        "p_priorities": _unless_all(list(map(_PRIORITY, items)), 0),
        "p_available": _unless_all(available, 1),
        "p_created": _unless_all(created, 1),
        # Optional columns (null where unset), of values the front checked.
        "p_unique_keys": optional_json(list(map(_UNIQUE_KEY, items))),
        "p_unique_fors": optional_json(
            [None if i.unique_for is None else i.unique_for.total_seconds() for i in items]
        ),
        "p_timeouts": optional_json(list(map(_TIMEOUT, items))),
        "p_slots": optional_json(sent_slots),
        "p_limit_keys": optional_json(list(map(_LIMIT_KEY, items))),
        "p_weights": _unless_all(list(map(_WEIGHT, items)), 1),
        "p_places": None if in_order else json_array([place + 1 for place in order]),
        "p_turn_tenants": json_array(list(turns)),
        "p_turn_counts": json_array([queued for queued, _ in turns.values()]),
        "p_turn_dues": json_array([due for _, due in turns.values()]),
    }


_TENANT = attrgetter("tenant")
_ITEM_ID = attrgetter("item_id")
_AVAILABLE = attrgetter("available_at")
_CREATED = attrgetter("created_at")
_PRIORITY = attrgetter("priority")
_UNIQUE_KEY = attrgetter("unique_key")
_TIMEOUT = attrgetter("timeout")
_LIMIT_KEY = attrgetter("limit_key")
_WEIGHT = attrgetter("weight")


def _turns(
    items: list[WorkItem], tenants: list[str], available: list[int]
) -> dict[str, tuple[int, int]]:
    """Each tenant's item count and earliest due moment (its place), in the rows' order."""
    if available.count(available[0]) == len(available):  # the usual batch: one moment
        return {tenant: (queued, available[0]) for tenant, queued in Counter(tenants).items()}
    turns: dict[str, tuple[int, int]] = {}
    earliest: dict[str, datetime] = {}
    for item, tenant, due in zip(items, tenants, available, strict=True):
        moment: datetime = item.available_at  # type: ignore[assignment]  # the front's
        queued, place = turns.get(tenant, (0, due))
        if tenant not in earliest or moment < earliest[tenant]:
            earliest[tenant], place = moment, due
        turns[tenant] = (queued + 1, place)
    return turns


async def prune(
    executor: Executor,
    sql: Statements,
    *,
    queue: str,
    clock: Clock,
    now: datetime,
    cutoffs: Mapping[ItemStatus, datetime],
    batch: int,
) -> int:
    """``PostgresWorkQueue._prune``: take the queue's pruner lease (0 at once when another
    pruner holds it), delete finished items past ``cutoffs`` a batch per statement until
    a batch comes back short or the lease is lost, and give the lease back, even when
    cancelled (if it cannot be, it lapses)."""
    pruner = uuid.uuid4().hex
    lease = {"p_queue": queue, "p_pruner": pruner}

    async def take(conn: Conn) -> bool:
        until = {**lease, "p_now": now, "p_until": now + PRUNE_LEASE}
        return (await conn.execute(sql.prune_lock, until)).first() is not None

    if not await executor.run(take, idempotent=False):
        return 0  # another process is pruning this queue
    pruned = 0
    try:
        params = {**lease, "p_batch": batch, **cutoff_params(cutoffs)}
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            # Each batch is its own statement (and transaction, outside a caller's):
            # the lease is extended from the clock's reading as it goes.
            step = {**params, "p_until": read_clock(clock) + PRUNE_LEASE}

            async def one(conn: Conn, step: dict[str, Any] = step) -> tuple[int, int]:
                row = (await conn.execute(sql.prune, step)).first()
                return int(row[0]), int(row[1])

            deleted, held = await executor.run(one, idempotent=True)
            pruned += deleted
            if not held or deleted < batch:
                return pruned
            await asyncio.sleep(PRUNE_PAUSE * (loop.time() - started))
    finally:

        async def give_back(conn: Conn) -> None:
            await conn.execute(sql.prune_unlock, lease)

        # Given back even when cancelled; if it cannot be, it lapses.
        await finish(executor.run(give_back, idempotent=True))
