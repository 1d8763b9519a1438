"""What the queue front enqueues: a ``WorkItem``, or (``enqueue_many``) a plain mapping of
its fields, checked once into the fresh record a backing stores and its encoded payload.

A mapping is taken as ``WorkItem(**mapping)`` would take it (pydantic's coercions
included) and then checked as that item would be, so it is refused exactly when the
item would be, with the same words (each naming ``items[i].field``); a field the
``WorkItem`` itself refuses (a key it has no field for, ``attempts=-1``) is named the
same way. The usual item (plain ids, a flat payload, the defaults) is checked in one
pass without a field name built; anything else takes the worded checks, which raise.

Nothing here does I/O or reads the clock (docs/work-queue.md#enqueueing-a-batch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeAlias

from pydantic import ValidationError

from statepact._codec import (
    MAX_ID_BYTES,
    check_size,
    flat_json,
    plain_int,
    plain_json,
    require_id,
    require_seconds,
)
from statepact._limits import MAX_PRIORITY, MAX_WEIGHT
from statepact.models import ItemStatus, WorkItem, stored

__all__ = ["ItemInput", "fresh_batch", "fresh_item"]

#: What ``enqueue_many`` takes for each item.
ItemInput: TypeAlias = WorkItem | Mapping[str, Any]

_FIELDS = frozenset(WorkItem.model_fields)
# The defaults a mapping leaves out: WorkItem's own.
_PAYLOAD, _QUEUE, _PRIORITY, _WEIGHT = "payload", "queue", "priority", "weight"
# The fields the usual item's checks read: a mapping of only these (the ids among them)
# takes the one-pass check.
_REQUIRED = frozenset({"tenant", "item_id"})
_USUAL_FIELDS = frozenset(
    {
        "tenant",
        "item_id",
        _PAYLOAD,
        _QUEUE,
        _PRIORITY,
        "unique_key",
        "unique_for",
        "timeout",
        "limit_key",
        _WEIGHT,
    }
)
_EMPTY: dict[str, Any] = {}  # the default payload; flat_json copies it


class _Fields:
    """The fields the front reads of an item to enqueue, from a ``WorkItem`` or a mapping."""

    __slots__ = (
        "item_id",
        "limit_key",
        "payload",
        "priority",
        "queue",
        "tenant",
        "timeout",
        "unique_for",
        "unique_key",
        "weight",
    )

    def __init__(self, source: Any, get: Callable[[Any, str, Any], Any]) -> None:
        # ``get``: ``getattr`` for a WorkItem, ``dict.get`` for a mapping; the defaults
        # are WorkItem's (a record built without validation may lack a field).
        self.tenant = get(source, "tenant", None)
        self.item_id = get(source, "item_id", None)
        self.payload = get(source, _PAYLOAD, {})
        self.queue = get(source, _QUEUE, None)
        self.priority = get(source, _PRIORITY, 0)
        self.unique_key = get(source, "unique_key", None)
        self.unique_for = get(source, "unique_for", None)
        self.timeout = get(source, "timeout", None)
        self.limit_key = get(source, "limit_key", None)
        self.weight = get(source, _WEIGHT, 1)


def fresh_batch(
    items: Sequence[object],
    *,
    queue: str,
    max_value_bytes: int,
    now: datetime,
    available_at: datetime,
) -> list[tuple[WorkItem, bytes]]:
    """``enqueue_many``'s items, each checked as :func:`fresh_item` checks it (errors name
    ``items[i].field``), and no ``(tenant, item_id)`` twice."""
    batch: list[tuple[WorkItem, bytes]] = []
    # Each tenant's ids, and their place: no key tuple per item (a batch of 10,000 is
    # 10,000 objects fewer for the collector to count).
    seen: dict[str, dict[str, int]] = {}
    for index, item in enumerate(items):
        entry = _usual(item, queue, max_value_bytes, now, available_at) or fresh_item(
            f"items[{index}].",
            item,
            queue=queue,
            max_value_bytes=max_value_bytes,
            now=now,
            available_at=available_at,
            mappings=True,
        )
        fresh = entry[0]
        ids = seen.get(fresh.tenant)
        if ids is None:
            ids = seen[fresh.tenant] = {}
        first = ids.setdefault(fresh.item_id, index)
        if first != index:
            raise ValueError(
                f"items[{index}].item_id: item {fresh.item_id!r} of tenant "
                f"{fresh.tenant!r} is already items[{first}] of this batch"
            )
        batch.append(entry)
    return batch


def fresh_item(
    field: str,
    item: object,
    *,
    queue: str,
    max_value_bytes: int,
    now: datetime,
    available_at: datetime,
    mappings: bool = False,
) -> tuple[WorkItem, bytes]:
    """The checked, fresh record of ``item`` (a ``WorkItem``; with ``mappings``, a mapping of
    its fields too) and its encoded payload; errors name ``field`` (``"items[3]."``)."""
    take = mappings or type(item) is WorkItem  # enqueue takes no mapping
    usual = _usual(item, queue, max_value_bytes, now, available_at) if take else None
    if usual is not None:
        return usual
    if isinstance(item, WorkItem):
        fields = _Fields(item, getattr)
    elif mappings and isinstance(item, Mapping):
        fields = _mapping_fields(field, item, queue, max_value_bytes)
    else:
        kind = "a WorkItem or a mapping of its fields" if mappings else "a WorkItem"
        raise TypeError(f"{field[:-1] or 'item'}: must be {kind}, got {type(item).__name__}")
    checked = _worded(field, fields, queue, max_value_bytes)
    return _record(checked, queue=queue, now=now, available_at=available_at)


def _usual(
    item: object, queue: str, max_value_bytes: int, now: datetime, available_at: datetime
) -> tuple[WorkItem, bytes] | None:
    """The record and payload of the usual item (plain ids, a flat payload, no unique key,
    timeout or limit key) in one pass, with no field name built; ``None`` for any other,
    which :func:`fresh_item` checks field by field (and refuses, naming the field)."""
    if type(item) is dict:
        # A mapping of only these, so typed, is what WorkItem(**item) would hold as it is.
        if not _REQUIRED <= item.keys() <= _USUAL_FIELDS:
            return None
        values: dict[str, Any] = item
    elif type(item) is WorkItem:
        values = item.__dict__
    else:
        return None
    get = values.get
    tenant, item_id, named = get("tenant"), get("item_id"), get(_QUEUE)
    priority, weight = get(_PRIORITY, 0), get(_WEIGHT, 1)
    if not (
        type(tenant) is str
        and type(item_id) is str
        and 0 < len(tenant) <= MAX_ID_BYTES
        and 0 < len(item_id) <= MAX_ID_BYTES
        and tenant.isascii()
        and item_id.isascii()
        and "\x00" not in tenant
        and "\x00" not in item_id
        and (named is None or (type(named) is str and named == queue))
        and type(priority) is int
        and -MAX_PRIORITY <= priority <= MAX_PRIORITY
        and type(weight) is int
        and 1 <= weight <= MAX_WEIGHT
        and get("unique_key") is None
        and get("unique_for") is None
        and get("timeout") is None
        and get("limit_key") is None
    ):
        return None
    encoded = flat_json(get(_PAYLOAD, _EMPTY))
    if encoded is None or len(encoded[1]) > max_value_bytes:
        return None
    plain, payload = encoded
    checked = (tenant, item_id, priority, None, None, None, None, weight, plain, payload)
    return _record(checked, queue=queue, now=now, available_at=available_at)


def _record(
    checked: tuple[
        str, str, int, str | None, timedelta | None, float | None, str | None, int, Any, bytes
    ],
    *,
    queue: str,
    now: datetime,
    available_at: datetime,
) -> tuple[WorkItem, bytes]:
    """The fresh record of checked fields (laid out as :class:`_Checked`) and the payload,
    built without validating it again (a fifth of model_construct's cost; the same record)."""
    (
        tenant,
        item_id,
        priority,
        unique_key,
        unique_for,
        timeout,
        limit_key,
        weight,
        plain,
        payload,
    ) = checked
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
            "weight": weight,
        },
    )
    return fresh, payload


def _mapping_fields(
    field: str, item: Mapping[Any, Any], queue: str, max_value_bytes: int
) -> _Fields:
    """The fields of a mapping, as ``WorkItem(**item)`` would hold them; refused (naming
    the field) where that item would be."""
    values = item if type(item) is dict else dict(item.items())  # read a mapping once
    for key in values:
        if key not in _FIELDS:
            raise ValueError(f"{field}{key}: is not a field of WorkItem")
    try:
        return _Fields(WorkItem(**values), getattr)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    first = errors[0]
    where = f"{field}{'.'.join(str(part) for part in first['loc'])}"
    if first["type"] != "missing":
        # A field the front checks too is refused in the front's words, as an item built
        # without validation (model_construct) would be; the rest in pydantic's.
        _worded(field, _Fields(values, dict.get), queue, max_value_bytes)
    refusal = TypeError if first["type"].endswith("_type") else ValueError
    raise refusal(f"{where}: {first['msg']}")


class _Checked(NamedTuple):
    tenant: str
    item_id: str
    priority: int
    unique_key: str | None
    unique_for: timedelta | None
    timeout: float | None
    limit_key: str | None
    weight: int
    plain: dict[str, Any]
    payload: bytes


def _worded(field: str, item: _Fields, queue: str, max_value_bytes: int) -> _Checked:
    """Every check, field by field, each refusal naming ``field``."""
    tenant = require_id(f"{field}tenant", item.tenant)
    item_id = require_id(f"{field}item_id", item.item_id)
    if item.queue is not None and item.queue != queue:
        raise ValueError(f"{field}queue: the item names queue {item.queue!r}, this is {queue!r}")
    if isinstance(item.priority, bool) or not isinstance(item.priority, int):
        raise TypeError(f"{field}priority: must be an int, got {type(item.priority).__name__}")
    if not -MAX_PRIORITY <= item.priority <= MAX_PRIORITY:
        raise ValueError(f"{field}priority: must be between -{MAX_PRIORITY} and {MAX_PRIORITY}")
    unique_key = (
        None if item.unique_key is None else require_id(f"{field}unique_key", item.unique_key)
    )
    unique_for = _unique_for(field, item)
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
    return _Checked(
        tenant,
        item_id,
        plain_int(item.priority),
        unique_key,
        unique_for,
        timeout,
        limit_key,
        plain_int(weight),
        plain,
        payload,
    )


def _unique_for(field: str, item: _Fields) -> timedelta | None:
    """The item's checked ``unique_for``, which only makes sense with a ``unique_key``."""
    period = item.unique_for
    if period is None:
        return None
    if item.unique_key is None:
        raise ValueError(f"{field}unique_for: is only meaningful with a unique_key")
    seconds = require_seconds(f"{field}unique_for", period)
    return period if isinstance(period, timedelta) else timedelta(seconds=seconds)
