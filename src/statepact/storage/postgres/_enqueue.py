"""``PostgresWorkQueue``'s enqueues: one item, or a batch in one statement, and the
stored item an insert conflicted with (by id, then by unique slot).

Every item arrives checked and built by the front (its ``queue`` is this queue's);
nothing here builds SQL (``_sql/queue/enqueue.py`` does) or retries a call.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from operator import attrgetter
from typing import Any

from statepact._codec import json_array, json_array_of_encoded
from statepact.errors import QueueUnavailableError
from statepact.models import WorkItem
from statepact.queue import unique_slot
from statepact.storage.postgres._client import is_unique_violation
from statepact.storage.postgres._queue_support import Conn, Statements, item_of, optional_json

__all__ = ["batch_params", "store_many", "store_one"]

# Inserts of one item whose conflicting holder was gone when read (pruned, or its slot
# freed in between) before the enqueue gives up: each try needs another writer between
# its two statements.
_HOLDER_TRIES = 5


def _key(item: WorkItem) -> dict[str, Any]:
    return {"p_queue": item.queue, "p_tenant": item.tenant, "p_item_id": item.item_id}


async def store_one(
    conn: Conn, sql: Statements, channel: str, item: WorkItem, payload: bytes
) -> WorkItem:
    """Insert one item, or answer the stored item its id or unique slot names."""
    slot = unique_slot(item, item.created_at)  # type: ignore[arg-type]
    params = {
        **_key(item),
        "p_channel": channel,
        "p_payload": payload.decode("utf-8"),
        "p_priority": item.priority,
        "p_available_at": item.available_at,
        "p_now": item.created_at,
        "p_unique_key": item.unique_key,
        "p_unique_for": item.unique_for,
        "p_timeout": item.timeout,
        "p_unique_slot": slot,
        "p_limit_key": item.limit_key,
        "p_weight": item.weight,
    }
    for _ in range(_HOLDER_TRIES):
        inserted = (await conn.execute(sql.enqueue, params)).scalar()
        if inserted:
            return item  # stored as sent: the front built the record
        found = await _holder(conn, sql, item, slot)
        if found is not None:
            return found
    raise QueueUnavailableError(
        f"enqueue of item {item.item_id!r}: its id or unique slot was held, and the "
        f"holder gone when read, {_HOLDER_TRIES} times"
    )


async def _holder(conn: Conn, sql: Statements, item: WorkItem, slot: str | None) -> WorkItem | None:
    """The stored item an insert conflicted with: the item itself (its id is the
    idempotency key, checked first), else the holder of its unique slot; ``None``
    when neither is there any more (pruned, or the slot freed: insert again)."""
    key = _key(item)
    row = (await conn.execute(sql.get_item, key)).mappings().first()
    if row is None and slot is not None:
        holder = {**key, "p_unique_slot": slot}
        row = (await conn.execute(sql.slot_holder, holder)).mappings().first()
    return None if row is None else item_of(row)


def _unless_all(values: list[int], default: int) -> str | None:
    """A batch's column of ints as one JSON text, ``None`` when each is ``default``."""
    return None if values.count(default) == len(values) else json_array(values)


def batch_params(
    queue: str, channel: str, batch: list[tuple[WorkItem, bytes]]
) -> tuple[dict[str, Any], list[str | None]]:
    """The parameters of ``enqueue_many`` and ``enqueue_new`` for ``batch``, and each
    item's unique slot (in ``batch`` order): each column one JSON text, the rows in
    ``(tenant, item_id)`` byte order, each with its place in ``batch``; each tenant's
    count and earliest due moment, for ``enqueue_new``. Column by column (``map``), never
    an object per item the collector would have to count."""
    slots = [unique_slot(item, item.created_at) for item, _ in batch]  # type: ignore[arg-type]
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
    params = {
        "p_queue": queue,
        "p_channel": channel,
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
    return params, slots


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


async def store_many(
    conn: Conn,
    sql: Statements,
    channel: str,
    batch: list[tuple[WorkItem, bytes]],
    *,
    params: dict[str, Any],
    slots: list[str | None],
    new_first: bool,
) -> list[WorkItem]:
    """Store every new item of ``batch`` (``batch_params``' ``params`` and ``slots``); with
    ``new_first``, try the insert without ON CONFLICT first. The answer is in ``batch``
    order: an item already stored is returned as it is."""
    answer = [item for item, _ in batch]
    if new_first:
        # A bulk load is usually all new: insert it without ON CONFLICT's probe of
        # every row. An item stored already fails that statement, which writes
        # nothing; the batch then goes as enqueue_many.
        try:
            await conn.execute(sql.enqueue_new, params)
            return answer
        except Exception as exc:
            if not is_unique_violation(exc):
                raise
    # Only the items the insert skipped come back; every other one was stored as sent.
    rows = (await conn.execute(sql.enqueue_many, params)).mappings().all()
    for row in rows:
        if row["ord"] is None:  # the notify's own row: nothing skipped
            continue
        place = row["ord"] - 1
        if row["status"] is not None:
            answer[place] = item_of(row)
            continue
        # Inserted after this statement's snapshot (by a concurrent enqueue, or by
        # this batch: two items of one unique slot), or gone since (then stored
        # again, alone).
        item, payload = batch[place]
        found = await _holder(conn, sql, item, slots[place])
        answer[place] = found or await store_one(conn, sql, channel, item, payload)
    return answer
