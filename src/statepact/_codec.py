"""Validation and encoding shared by every backing: ids, JSON, sizes, money, durations.

Everything a caller hands us passes through here before a backing sees it, so
each refusal is worded once and names the field. Nothing here does I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from statepact.errors import StatePersistenceError

__all__ = [
    "COST_SCALE",
    "MAX_DEPTH",
    "MAX_ID_BYTES",
    "check_size",
    "decode_json",
    "encode_json",
    "nanos_to_decimal",
    "require_count",
    "require_id",
    "require_seconds",
    "to_nanos",
]

MAX_ID_BYTES = 1024
MAX_DEPTH = 128
COST_SCALE = 1_000_000_000  # cost is kept exact to 1e-9 as integer nano-units


def require_id(field: str, value: object) -> str:
    """An identifier: a non-empty ``str`` of at most 1 KiB UTF-8, no NUL, no lone surrogate."""
    if not isinstance(value, str):
        raise TypeError(f"{field}: must be a str, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{field}: must not be empty")
    if "\x00" in value:
        raise ValueError(f"{field}: must not contain NUL characters")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(f"{field}: is not valid Unicode text ({exc.reason})") from exc
    if size > MAX_ID_BYTES:
        raise ValueError(f"{field}: is {size} bytes; at most {MAX_ID_BYTES} are allowed")
    return value


def _check_str(field: str, path: str, value: str) -> None:
    if "\x00" in value:
        raise ValueError(
            f"{field}{path}: NUL characters cannot be stored (PostgreSQL refuses them)"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{field}{path}: is not valid Unicode text ({exc.reason})") from exc


def _walk(field: str, root: object) -> None:
    """Refuse anything json.dumps would drop, coerce or choke on, naming where it is."""
    stack: list[tuple[object, str, int]] = [(root, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"{field}{path}: nested deeper than {MAX_DEPTH} levels")
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, int):
            if value.bit_length() > 128:
                raise ValueError(f"{field}{path}: integer is too large to store exactly")
            continue
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(f"{field}{path}: {value!r} is not a JSON number")
            continue
        if isinstance(value, str):
            _check_str(field, path, value)
            continue
        if isinstance(value, Mapping):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ValueError(
                        f"{field}{path}: key {key!r} is a {type(key).__name__}; "
                        "JSON object keys must be str"
                    )
                _check_str(field, f"{path}[{key!r}]", key)
                stack.append((item, f"{path}[{key!r}]", depth + 1))
            continue
        if isinstance(value, list | tuple):
            for index, item in enumerate(value):
                stack.append((item, f"{path}[{index}]", depth + 1))
            continue
        raise ValueError(f"{field}{path}: a {type(value).__name__} is not a JSON value")


def encode_json(field: str, value: object, *, sort_keys: bool = False) -> bytes:
    """Validate a JSON object and return its compact UTF-8 encoding."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{field}: must be a JSON object (a dict), got {type(value).__name__}")
    _walk(field, value)
    text = json.dumps(
        value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=sort_keys
    )
    return text.encode("utf-8")


def encode_json_value(field: str, value: object, *, sort_keys: bool = False) -> bytes:
    """Validate any JSON value (not only objects) and return its compact encoding."""
    _walk(field, value)
    return json.dumps(
        value, ensure_ascii=False, allow_nan=False, separators=(",", ":"), sort_keys=sort_keys
    ).encode()


def decode_json(data: bytes | str) -> Any:
    return json.loads(data)


def check_size(field: str, size: int, limit: int, *, where: str) -> None:
    """Refuse a value over ``max_value_bytes`` before anything is sent."""
    if size > limit:
        raise StatePersistenceError(
            f"{field} of {where} is {size} bytes serialized, over max_value_bytes={limit}; "
            "keep large values behind a claim check",
            reason="too_large",
        )


def to_nanos(field: str, value: object) -> int:
    """A non-negative money amount as integer nano-units, refusing more precision than 1e-9."""
    if isinstance(value, bool) or not isinstance(value, int | str | Decimal):
        raise TypeError(
            f"{field}: must be a Decimal, int or decimal str (floats are inexact), "
            f"got {type(value).__name__}"
        )
    try:
        amount = Decimal(value)
    except InvalidOperation as exc:
        raise ValueError(f"{field}: {value!r} is not a decimal number") from exc
    if not amount.is_finite():
        raise ValueError(f"{field}: {value!r} is not a finite number")
    if amount < 0:
        raise ValueError(f"{field}: must not be negative, got {amount}")
    scaled = amount * COST_SCALE
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{field}: {amount} has more precision than 1e-9")
    nanos = int(scaled)
    if nanos >= 2**62:
        raise ValueError(f"{field}: {amount} is too large")
    return nanos


def nanos_to_decimal(nanos: int) -> Decimal:
    return (Decimal(nanos) / COST_SCALE).quantize(Decimal("0.000000001"))


def require_count(field: str, value: object) -> int:
    """A non-negative integer delta (bool refused), small enough for a 64-bit counter."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field}: must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{field}: must not be negative, got {value}")
    if value >= 2**62:
        raise ValueError(f"{field}: {value} is too large")
    return value


def require_seconds(field: str, value: object, *, allow_zero: bool = False) -> float:
    """A positive duration given as seconds (int/float) or a ``timedelta``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"{field}: must be seconds or a timedelta, got {type(value).__name__}")
    if not math.isfinite(seconds):
        raise ValueError(f"{field}: must be finite")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValueError(f"{field}: must be positive, got {seconds:g} s")
    if seconds > 10 * 365 * 86_400:
        raise ValueError(f"{field}: {seconds:g} s is more than ten years")
    return seconds
