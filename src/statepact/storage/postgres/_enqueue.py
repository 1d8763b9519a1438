"""``PostgresWorkQueue``'s enqueues: one item, or a batch in one statement, and the
stored item an insert conflicted with (by id, then by unique slot).

Every item arrives checked and built by the front (its ``queue`` is this queue's);
nothing here builds SQL (``_sql/queue/enqueue.py`` does) or retries a call.
"""

from __future__ import annotations

from datetime import datetime
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


def batch_params(
    queue: str, channel: str, batch: list[tuple[WorkItem, bytes]]
) -> tuple[dict[str, Any], list[str | None]]:
    """The parameters of ``enqueue_many`` (and ``enqueue_new``) for ``batch``, and each
    item's unique slot."""
    # Each moment once, each item naming its own by place (from 1): see _batch_insert.
    slots = [unique_slot(item, item.created_at) for item, _ in batch]  # type: ignore[arg-type]
    places: dict[datetime | None, int] = {}
    available = [places.setdefault(item.available_at, len(places) + 1) for item, _ in batch]
    created = [places.setdefault(item.created_at, len(places) + 1) for item, _ in batch]
    times = list(places)
    params = {
        "p_queue": queue,
        "p_channel": channel,
        # The latest clock reading of the batch (concurrent enqueues share one): turns.
        "p_now": max(item.created_at for item, _ in batch),  # type: ignore[type-var]
        # Each column one JSON text (see _sql.queue._batch_insert).
        "p_tenants": json_array([item.tenant for item, _ in batch]),
        "p_item_ids": json_array([item.item_id for item, _ in batch]),
        "p_payloads": json_array_of_encoded([payload for _, payload in batch]),
        "p_priorities": json_array([item.priority for item, _ in batch]),
        "p_times": times,
        "p_available": json_array(available),
        "p_created": json_array(created),
        # Optional columns (null where unset), of values the front checked.
        "p_unique_keys": optional_json([item.unique_key for item, _ in batch]),
        "p_unique_fors": optional_json(
            [None if i.unique_for is None else i.unique_for.total_seconds() for i, _ in batch]
        ),
        "p_timeouts": optional_json([item.timeout for item, _ in batch]),
        "p_slots": optional_json(slots),
        "p_limit_keys": optional_json([item.limit_key for item, _ in batch]),
        "p_weights": json_array([item.weight for item, _ in batch]),
    }
    return params, slots


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
