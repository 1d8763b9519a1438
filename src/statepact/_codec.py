"""Validation and encoding shared by every backing: ids, JSON, sizes, money, durations.

Everything a caller hands us passes through here before a backing sees it, so
each refusal is worded once and names the field. Nothing here does I/O.

Decimals: every conversion and every piece of arithmetic on a ``Decimal`` in the
package runs in :data:`DECIMAL_CONTEXT` (through :func:`decimal_context`), never in the
caller's: a caller's low precision, trapped ``Inexact`` or tiny ``Emax`` must not round
or refuse a cost, which is exact to 1e-9 on every backing.
"""

from __future__ import annotations

import json
import json.scanner
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from contextlib import AbstractContextManager
from datetime import timedelta
from decimal import (
    ROUND_HALF_EVEN,
    Context,
    Decimal,
    DecimalException,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
    localcontext,
)
from fractions import Fraction
from typing import Any

from statepact.errors import StatePersistenceError

__all__ = [
    "COST_SCALE",
    "DECIMAL_CONTEXT",
    "MAX_DEPTH",
    "MAX_ID_BYTES",
    "MAX_SECONDS",
    "check_size",
    "decimal_context",
    "decimal_to_nanos",
    "decode_json",
    "encode_json",
    "encode_json_value",
    "flat_json",
    "json_array",
    "json_array_of_encoded",
    "nanos_to_decimal",
    "plain_int",
    "plain_str",
    "require_count",
    "require_id",
    "require_limit",
    "require_seconds",
    "require_token",
    "to_nanos",
    "utf8_size",
]

MAX_ID_BYTES = 1024
#: The longest duration ``require_seconds`` takes unless told a shorter one: ten years.
MAX_SECONDS = 10 * 365 * 86_400.0
MAX_DEPTH = 128
COST_SCALE = 1_000_000_000  # cost is kept exact to 1e-9 as integer nano-units
_COST_PLACES = 9
_MAX_WHOLE_COST = -(-(2**62) // COST_SCALE)  # the least whole amount past 2**62 nano-units
_ZERO_COST = Decimal("0.000000000")

_log = logging.getLogger("statepact.limits")
# A cost of 1e10 or more is past 2**62 nano-units (about 4.6e9): refused before any arithmetic.
_COST_DIGITS = 10

#: The one decimal context of the package. Forty digits hold any cost with room to spare
#: (a counter is at most 19 digits of nano-units); Inexact is trapped so that a digit that
#: would be lost raises instead, and the exponent range is the default's, whatever the
#: caller set. Used only through copies (``decimal_context()``), so its flags never change.
DECIMAL_CONTEXT = Context(
    prec=40,
    rounding=ROUND_HALF_EVEN,
    Emin=-999_999,
    Emax=999_999,
    capitals=1,
    clamp=0,
    flags=[],
    traps=[InvalidOperation, DivisionByZero, Overflow, Inexact],
)


def decimal_context() -> AbstractContextManager[Context]:
    """``with decimal_context():`` runs the block's Decimal work in a copy of DECIMAL_CONTEXT."""
    return localcontext(DECIMAL_CONTEXT)


def require_id(field: str, value: object) -> str:
    """An identifier: a non-empty ``str`` of at most 1 KiB UTF-8, no NUL, no lone surrogate."""
    if (
        type(value) is str
        and value.isascii()
        and 0 < len(value) <= MAX_ID_BYTES
        and "\x00" not in value
    ):
        return value  # the usual id: one byte a character, nothing to encode to know
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
    return plain_str(value)


def plain_str(value: str) -> str:
    """A ``str`` subclass (a ``StrEnum`` member) as the exact ``str`` of its text.

    A backing formats ids into keys and statements; a subclass's ``__str__`` or
    ``__format__`` must not change what it stores.
    """
    return value if type(value) is str else str.__str__(value)


def plain_int(value: int) -> int:
    """An ``int`` subclass (an ``IntEnum`` member) as the exact ``int`` of its value."""
    return value if type(value) is int else int.__int__(value)


# Where a value sits in the tree _plain walks, built only when a refusal names it:
# ``None`` for the root, else (the parent's path, the key or index that leads here).
_Path = tuple[Any, str | int] | None


def _render(path: _Path) -> str:
    """A path as the messages show it: ``['a'][0]``."""
    steps: list[str] = []
    while path is not None:
        path, step = path
        steps.append(f"[{step}]" if isinstance(step, int) else f"[{step!r}]")
    return "".join(reversed(steps))


def _fine_text(text: str) -> bool:
    """Whether ``text`` may be stored: no NUL, no lone surrogate (the one rule for text;
    ``_check_str`` says which part of it a refused text breaks)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True  # ASCII text encodes: no lone surrogate in it
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_str(field: str, path: _Path, value: str) -> None:
    if _fine_text(value):
        return
    if "\x00" in value:
        raise ValueError(
            f"{field}{_render(path)}: NUL characters cannot be stored (PostgreSQL refuses them)"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{field}{_render(path)}: is not valid Unicode text ({exc.reason})"
        ) from exc


def _refusal(field: str, path: str, value: object) -> ValueError:
    """Why a value that is none of JSON's types is refused, with what to pass instead."""
    kind = type(value).__name__
    if isinstance(value, bytes | bytearray | memoryview):
        hint = "binary is not JSON text; encode it (base64, say) into a str"
    elif isinstance(value, AbstractSet):
        hint = "a set has no order; pass a sorted list"
    elif isinstance(value, Decimal | Fraction):
        hint = "pass str(value) to keep it exact, or float(value)"
    elif isinstance(value, Iterable):
        hint = "only a list or a tuple is a JSON array; pass list(value)"
    else:
        hint = "convert it to a str, number, bool, None, list or dict first"
    return ValueError(f"{field}{path}: a {kind} is not a JSON value; {hint}")


# What _leaf answers for a value that is not a leaf (a container, or no JSON value at all).
_BRANCH = object()


def _leaf(field: str, path: _Path, value: object) -> Any:
    """``value`` as a plain JSON leaf (``None``, a bool, a ``str``, an ``int``, a finite
    ``float``), checked; ``_BRANCH`` for anything else."""
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        text = plain_str(value)
        _check_str(field, path, text)
        return text
    if isinstance(value, int):
        number = plain_int(value)
        if number.bit_length() > 128:
            raise ValueError(
                f"{field}{_render(path)}: integer is too large to store exactly (at most 128 bits)"
            )
        return number
    if isinstance(value, float):
        real = value if type(value) is float else float.__float__(value)
        if not math.isfinite(real):
            raise ValueError(f"{field}{_render(path)}: {real!r} is not a JSON number")
        return real
    return _BRANCH


def _plain(field: str, root: object) -> Any:
    """A copy of ``root`` holding only what ``json.loads`` makes, or a ``ValueError`` naming
    where it holds something else (the rule: docs/state-store.md, "What a JSON value may be").

    Any ``Mapping`` with ``str`` keys becomes a ``dict``, a ``list`` or ``tuple`` a ``list``,
    a ``str``/``int``/``float`` subclass (an enum member) its plain value. The copy, not the
    caller's object, is what gets encoded: what was checked is exactly what is stored, and a
    subclass's ``__str__``/``__repr__`` or a mapping's ``items`` is read once. A container's
    leaves are checked as it is walked; its containers wait on the stack.
    """
    if type(root) is dict:
        flat = _flat(root)  # the usual payload, in one pass
        if flat is not None:
            return flat
    holder: list[Any] = [None]
    # (value, its path, its depth, the container it goes in, its slot there)
    stack: list[tuple[object, _Path, int, Any, Any]] = [(root, None, 0, holder, 0)]
    while stack:
        value, path, depth, parent, slot = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"{field}{_render(path)}: nested deeper than {MAX_DEPTH} levels")
        leaf = _leaf(field, path, value)
        if leaf is not _BRANCH:
            parent[slot] = leaf
            continue
        # A child one level down is checked here if that level is allowed; else it goes on
        # the stack, whose depth check refuses it.
        inline = depth < MAX_DEPTH
        children: list[tuple[object, _Path, int, Any, Any]] = []
        if isinstance(value, Mapping):
            obj: dict[str, Any] = {}
            parent[slot] = obj
            for key, item in value.items():
                if not isinstance(key, str):
                    raise ValueError(
                        f"{field}{_render(path)}: key {key!r} is a {type(key).__name__}; "
                        "JSON object keys must be str"
                    )
                name = plain_str(key)
                here: _Path = (path, name)
                _check_str(field, here, name)
                if name in obj:
                    raise ValueError(
                        f"{field}{_render(path)}: key {name!r} appears twice; a JSON object "
                        "holds it once"
                    )
                leaf = _leaf(field, here, item) if inline else _BRANCH
                obj[name] = None if leaf is _BRANCH else leaf  # keeps the mapping's order
                if leaf is _BRANCH:
                    children.append((item, here, depth + 1, obj, name))
        elif isinstance(value, list | tuple):
            array: list[Any] = [None] * len(value)
            parent[slot] = array
            for index, item in enumerate(value):
                at: _Path = (path, index)
                leaf = _leaf(field, at, item) if inline else _BRANCH
                if leaf is _BRANCH:
                    children.append((item, at, depth + 1, array, index))
                else:
                    array[index] = leaf
        else:
            raise _refusal(field, _render(path), value)
        stack.extend(reversed(children))
    return holder[0]


# The encoders of _dumps, built once (json.dumps builds one per call for these options).
_ENCODERS = {
    sort_keys: json.JSONEncoder(
        ensure_ascii=False,
        allow_nan=False,
        check_circular=False,
        separators=(",", ":"),
        sort_keys=sort_keys,
    )
    for sort_keys in (False, True)
}


def _c_encoder(encoder: json.JSONEncoder) -> Callable[[Any, int], Any] | None:
    """json's C encoder for ``encoder``'s options, built once: ``JSONEncoder.encode`` builds
    it again on every call. ``None`` where there is none (then ``encode`` is used)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        built: Callable[[Any, int], Any] = make(
            None,  # no markers: check_circular is off
            encoder.default,
            json.encoder.encode_basestring,  # ensure_ascii=False
            None,  # no indent
            encoder.key_separator,
            encoder.item_separator,
            encoder.sort_keys,
            encoder.skipkeys,
            encoder.allow_nan,
        )
    except TypeError:  # another signature than the one known: keep json's own path
        return None
    sample = {"b": [1, 2.5, None, True, "é\n"], "a": {}}
    if "".join(built(sample, 0)) != encoder.encode(sample):
        return None
    return built


_C_ENCODERS = {sort_keys: _c_encoder(encoder) for sort_keys, encoder in _ENCODERS.items()}


def _dumps_text(value: Any, sort_keys: bool) -> str:
    # The value is a fresh tree of plain types (_plain): no cycle to look for.
    encode = _C_ENCODERS[sort_keys]
    if encode is None:
        return _ENCODERS[sort_keys].encode(value)
    return "".join(encode(value, 0))


def _dumps(value: Any, sort_keys: bool) -> bytes:
    return _dumps_text(value, sort_keys).encode("utf-8")


def encode_json(field: str, value: object, *, sort_keys: bool = False) -> bytes:
    """Validate a JSON object (any ``Mapping``) and return its compact UTF-8 encoding."""
    return plain_json(field, value, sort_keys=sort_keys)[1]


def plain_json(field: str, value: object, *, sort_keys: bool = False) -> tuple[Any, bytes]:
    """``encode_json``, also giving the plain tree it encoded (what a read would return)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{field}: must be a JSON object (a dict), got {type(value).__name__}")
    plain = _plain(field, value)
    return plain, _dumps(plain, sort_keys)


def flat_json(value: object) -> tuple[dict[str, Any], bytes] | None:
    """:func:`plain_json` of the usual payload (a ``dict`` of plain keys and scalars), with
    no field name to refuse with: ``None`` for anything else, which ``plain_json`` then
    checks, naming what it refuses."""
    if type(value) is not dict:
        return None
    flat = _flat(value)
    return None if flat is None else (flat, _dumps(flat, False))


def _flat(value: dict[Any, Any]) -> dict[str, Any] | None:
    """``_plain`` of the usual payload, a ``dict`` of exact ``str`` keys and exact
    ``str``/``int``/``float``/``bool``/``None`` values, each passing ``_plain``'s checks,
    in one pass without paths; ``None`` for anything else, which ``_plain`` then walks
    (and refuses, naming where, if it must)."""
    copy: dict[str, Any] = {}
    for key, item in value.items():
        if type(key) is not str or not _fine_text(key):
            return None
        kind = type(item)
        if kind is str:
            if not _fine_text(item):
                return None
        elif kind is int:
            if item.bit_length() > 128:
                return None
        elif kind is float:
            if not math.isfinite(item):
                return None
        elif item is not None and kind is not bool:
            return None
        copy[key] = item
    return copy


def encode_json_value(field: str, value: object, *, sort_keys: bool = False) -> str:
    """Validate any JSON value (not only objects) and return its compact encoding, as text
    (what a transaction buffers; :func:`utf8_size` is its size in bytes)."""
    return _dumps_text(_plain(field, value), sort_keys)


def json_array(values: list[str] | list[int]) -> str:
    """A JSON array of ids or ints already checked (``require_id``, ``plain_int``), as a
    statement sends a batch's column: one text, which the driver passes as it is."""
    return _dumps_text(values, False)


def json_array_of_encoded(encoded: Iterable[bytes]) -> str:
    """A JSON array of values each already encoded (``encode_json``), as one text."""
    return (b"[" + b",".join(encoded) + b"]").decode("utf-8")


def utf8_size(text: str) -> int:
    """``len(text.encode("utf-8"))``, without encoding an ASCII text (most JSON)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


# json's own scanner: ``json.loads`` minus its whitespace and encoding detection, which a
# document encode_json wrote (compact UTF-8) never needs.
_SCAN: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder()  # type: ignore[arg-type]  # typeshed types it as taking itself
)


def decode_json(data: bytes | str) -> Any:
    """What ``encode_json`` wrote (UTF-8, or text), decoded."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        end = -1
    if end != len(text):
        return json.loads(text)  # not one compact document: json says what it is
    return value


def check_size(field: str, size: int, limit: int, *, where: str) -> None:
    """Refuse a value over ``max_value_bytes`` before anything is sent (logged on
    ``statepact.limits`` at WARNING)."""
    if size > limit:
        _log.warning(
            "refused %s of %s: %d bytes serialized, over max_value_bytes=%d; nothing was sent",
            field,
            where,
            size,
            limit,
            extra={"field": field, "size": size, "limit": limit},
        )
        raise StatePersistenceError(
            f"{field} of {where} is {size} bytes serialized, over max_value_bytes={limit}; "
            "keep large values behind a claim check",
            reason="too_large",
        )


def to_nanos(field: str, value: object) -> int:
    """A non-negative money amount as integer nano-units, refusing more precision than 1e-9."""
    if type(value) is int and 0 <= value < _MAX_WHOLE_COST:
        return value * COST_SCALE  # a plain whole amount in range: exact, nothing to check
    if isinstance(value, bool) or not isinstance(value, int | str | Decimal):
        raise TypeError(
            f"{field}: must be a Decimal, int or decimal str (floats are inexact), "
            f"got {type(value).__name__}"
        )
    with decimal_context():
        shown = _shown(value)
        try:
            amount = Decimal(value)
        except InvalidOperation as exc:
            raise ValueError(
                f"{field}: {shown!r} is not a decimal number (or its exponent is out of range)"
            ) from exc
        if not amount.is_finite():
            raise ValueError(f"{field}: {shown!r} is not a finite number")
        if amount.is_zero():
            return 0  # however it is spelt: -0, 0E+999999999
        if amount < 0:
            raise ValueError(f"{field}: must not be negative, got {shown}")
        if amount.adjusted() >= _COST_DIGITS:
            raise ValueError(f"{field}: {shown} is too large (at most 2**62 - 1 nano-units)")
        try:
            nanos = int(amount.scaleb(_COST_PLACES).to_integral_exact())
        except DecimalException as exc:  # Inexact: a digit below 1e-9 (or past 40 digits)
            raise ValueError(f"{field}: {shown} has more precision than 1e-9") from exc
    if nanos >= 2**62:
        raise ValueError(f"{field}: {shown} is too large (at most 2**62 - 1 nano-units)")
    return nanos


def _shown(value: object) -> str:
    """A caller's amount as an error message shows it: its own digits, cut short past 60."""
    text = str(value)
    return text if len(text) <= 60 else f"{text[:40]}...({len(text)} characters)"


def decimal_to_nanos(value: Decimal) -> int:
    """A stored cost (a ``Decimal`` with at most nine places) as integer nano-units, exactly."""
    with decimal_context():
        return int(value.scaleb(_COST_PLACES).to_integral_exact())


def nanos_to_decimal(nanos: int) -> Decimal:
    """Nano-units as a ``Decimal`` with nine places.

    Built from its digits, which the ``Decimal`` constructor takes exactly in any context:
    no division, so no caller's precision can round it.
    """
    if nanos == 0:
        return _ZERO_COST  # the cost of most runs; a Decimal is immutable, so one is shared
    units, fraction = divmod(abs(nanos), COST_SCALE)
    sign = "-" if nanos < 0 else ""
    return Decimal(f"{sign}{units}.{fraction:09d}")


def require_count(field: str, value: object) -> int:
    """A non-negative integer delta (bool refused), small enough for a 64-bit counter."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field}: must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{field}: must not be negative, got {value}")
    if value >= 2**62:
        raise ValueError(f"{field}: {value} is too large")
    return plain_int(value)


def require_limit(value: object, most: int, *, field: str = "limit") -> int:
    """A ``limit`` (a page or batch size, a queue's cap): an int from 1 to ``most``, bool
    refused; ``field`` names it in the refusal."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field}: must be an int, got {type(value).__name__}")
    if not 1 <= value <= most:
        raise ValueError(f"{field}: must be between 1 and {most}, got {value}")
    return plain_int(value)


def require_token(field: str, value: object, issuer: str) -> int:
    """A fencing token read back from a lease the caller built: an int from 0 to 2**63 - 1
    (what every backing issues), bool refused; ``issuer`` ("queue") names who issues it
    in the refusal."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field}: must be an int, got {type(value).__name__}")
    if not 0 <= value < 2**63:
        raise ValueError(f"{field}: {value} is not a token any {issuer} issues")
    return value


def require_seconds(
    field: str, value: object, *, allow_zero: bool = False, most: float = MAX_SECONDS
) -> float:
    """A duration given as seconds (int/float) or a ``timedelta``: above 0 (or 0 too, with
    ``allow_zero``), finite, at most ``most`` seconds (ten years unless a caller's rule is
    tighter, such as ``MAX_RETRY_DELAY``). Every duration statepact takes is read here, so
    a setting and the call it feeds refuse the same values with the same words."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"{field}: must be seconds or a timedelta, got {type(value).__name__}")
    if not math.isfinite(seconds):
        raise ValueError(f"{field}: must be finite")
    if seconds < 0:
        bound = "must not be negative" if allow_zero else "must be positive"
        raise ValueError(f"{field}: {bound}, got {seconds:g} s")
    if seconds == 0 and not allow_zero:
        raise ValueError(f"{field}: must be positive, got {seconds:g} s")
    if seconds > most:
        raise ValueError(
            f"{field}: {seconds:g} s is more than the {most:g} s ({most / 86_400:g} days) allowed"
        )
    return seconds
