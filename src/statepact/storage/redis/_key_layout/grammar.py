"""The grammar every Redis key follows: length-prefixed segments (``seg``), an item's
reference (``ref``, read back by ``parse_ref``), and a segment escaped for a SCAN
pattern. ``lua/_common.lua`` follows the same grammar; docs/backings.md#key-layout.
"""

from __future__ import annotations

__all__ = ["glob_escape", "parse_ref", "ref", "seg", "take"]


def seg(value: str) -> str:
    """One length-prefixed segment: ``acme`` becomes ``4:acme`` (length in UTF-8 bytes)."""
    return f"{len(value.encode('utf-8'))}:{value}"


def ref(tenant: str, item_id: str) -> str:
    """An item's queue-wide reference, ``seg(tenant):seg(item_id)``; members of queue-wide sets."""
    return f"{seg(tenant)}:{seg(item_id)}"


def take(text: bytes, start: int) -> tuple[str, int]:
    """Read one segment of ``text`` at ``start``; return it and where the next one begins."""
    colon = text.index(b":", start)
    digits = text[start:colon]
    if not digits.isdigit():
        raise ValueError(f"no segment length at {start}")
    length = int(digits)
    end = colon + 1 + length
    if end > len(text):
        raise ValueError(f"segment at {start} runs past the end")
    return text[colon + 1 : end].decode("utf-8"), end


def parse_ref(value: str | bytes) -> tuple[str, str]:
    """The inverse of :func:`ref`: ``(tenant, item_id)``."""
    raw = value.encode("utf-8") if isinstance(value, str) else value
    tenant, end = take(raw, 0)
    if raw[end : end + 1] != b":":
        raise ValueError(f"{value!r} is not an item reference")
    item_id, end = take(raw, end + 1)
    if end != len(raw):
        raise ValueError(f"{value!r} is not an item reference")
    return tenant, item_id


def glob_escape(value: str) -> str:
    """``value`` as a literal in a SCAN ``MATCH`` pattern.

    Redis glob treats ``* ? [ ] \\`` as special; braces are not, but a backslash
    before any character matches it literally, so they are escaped too (a hash
    tag's braces then never depend on the glob dialect).
    """
    return "".join("\\" + ch if ch in "*?[]\\{}" else ch for ch in value)
