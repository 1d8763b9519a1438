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

from collections.abc import Callable, Mapping
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

__all__ = ["ItemInput", "fresh_item"]

#: What ``enqueue_many`` takes for each item.
ItemInput: TypeAlias = WorkItem | Mapping[str, Any]

_FIELDS = frozenset(WorkItem.model_fields)
# The defaults a mapping leaves out: WorkItem's own.
_PAYLOAD, _QUEUE, _PRIORITY, _WEIGHT = "payload", "queue", "priority", "weight"
# The fields whose exact values WorkItem(**mapping) keeps as they are (str, int, dict, None):
# a mapping of only these, so typed, needs no pydantic pass to be what the item would be.
_PLAIN_FIELDS = frozenset(
    {"tenant", "item_id", _PAYLOAD, _QUEUE, _PRIORITY, "unique_key", "limit_key", _WEIGHT}
)
_REQUIRED = frozenset({"tenant", "item_id"})
_PLAIN_TYPES: dict[str, tuple[type, ...]] = {
    "tenant": (str,),
    "item_id": (str,),
    _PAYLOAD: (dict,),
    _QUEUE: (str, type(None)),
    _PRIORITY: (int,),
    "unique_key": (str, type(None)),
    "limit_key": (str, type(None)),
    _WEIGHT: (int,),
}


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


def _usual_id(value: object) -> bool:
    """``require_id``'s common case, without the field name it would need to refuse."""
    return (
        type(value) is str
        and 0 < len(value) <= MAX_ID_BYTES
        and value.isascii()
        and "\x00" not in value
    )


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
    if isinstance(item, WorkItem):
        fields = _Fields(item, getattr)
    elif mappings and isinstance(item, Mapping):
        fields = _mapping_fields(field, item, queue, max_value_bytes)
    else:
        kind = "a WorkItem or a mapping of its fields" if mappings else "a WorkItem"
        raise TypeError(f"{field[:-1] or 'item'}: must be {kind}, got {type(item).__name__}")
    return _checked(
        field,
        fields,
        queue=queue,
        max_value_bytes=max_value_bytes,
        now=now,
        available_at=available_at,
    )


def _mapping_fields(
    field: str, item: Mapping[Any, Any], queue: str, max_value_bytes: int
) -> _Fields:
    """The fields of a mapping, as ``WorkItem(**item)`` would hold them; refused (naming
    the field) where that item would be."""
    values = item if type(item) is dict else dict(item.items())  # read a mapping once
    for key in values:
        if key not in _FIELDS:
            raise ValueError(f"{field}{key}: is not a field of WorkItem")
    if _REQUIRED <= values.keys() <= _PLAIN_FIELDS and all(
        type(value) in _PLAIN_TYPES[key] for key, value in values.items()
    ):
        return _Fields(values, dict.get)
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


def _checked(
    field: str,
    item: _Fields,
    *,
    queue: str,
    max_value_bytes: int,
    now: datetime,
    available_at: datetime,
) -> tuple[WorkItem, bytes]:
    """The record and payload of ``item``: the usual one in one pass, anything else through
    the worded checks (which refuse it, or check it field by field)."""
    tenant, item_id, priority, weight = item.tenant, item.item_id, item.priority, item.weight
    encoded = None
    if (
        _usual_id(tenant)
        and _usual_id(item_id)
        and (item.queue is None or (type(item.queue) is str and item.queue == queue))
        and type(priority) is int
        and -MAX_PRIORITY <= priority <= MAX_PRIORITY
        and type(weight) is int
        and 1 <= weight <= MAX_WEIGHT
        and item.unique_key is None
        and item.unique_for is None
        and item.timeout is None
        and item.limit_key is None
    ):
        encoded = flat_json(item.payload)
    if encoded is None or len(encoded[1]) > max_value_bytes:
        checked = _worded(field, item, queue, max_value_bytes)
    else:
        checked = _Checked(tenant, item_id, priority, None, None, None, None, weight, *encoded)
    # Every field is checked and of its type: build the record without validating it
    # again (a fifth of model_construct's cost; the same record).
    fresh = stored(
        WorkItem,
        {
            "tenant": checked.tenant,
            "item_id": checked.item_id,
            "payload": checked.plain,
            "queue": queue,
            "priority": checked.priority,
            "available_at": available_at,
            "attempts": 0,
            "status": ItemStatus.QUEUED,
            "last_error": None,
            "created_at": now,
            "updated_at": now,
            "unique_key": checked.unique_key,
            "unique_for": checked.unique_for,
            "timeout": checked.timeout,
            "limit_key": checked.limit_key,
            "weight": checked.weight,
        },
    )
    return fresh, checked.payload


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
