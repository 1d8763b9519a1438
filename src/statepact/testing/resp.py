"""A few lines of RESP: one Redis command on a fresh socket, with no redis-py and no event loop.

What starts and watches test servers uses it (:mod:`statepact.testing.local_servers`,
:mod:`statepact.testing.cluster`), so it needs no optional dependency and can run in a
synchronous fixture. It must never bind or connect anywhere but the host it is given.
"""

from __future__ import annotations

import socket
from typing import BinaryIO

__all__ = ["RedisReplyError", "info_field", "read_reply", "redis_call", "redis_text"]

_LOOPBACK = "127.0.0.1"


class RedisReplyError(Exception):
    """The server answered with a RESP error (``-LOADING ...``, ``-ERR ...``)."""


def read_reply(reader: BinaryIO) -> str | list[str]:
    """One reply from ``reader``: text (simple string, integer, bulk string) or a list (array)."""
    head = reader.readline().decode(errors="replace").rstrip("\r\n")
    kind, rest = head[:1], head[1:]
    if kind == "-":
        raise RedisReplyError(rest)
    if kind in ("+", ":"):
        return rest
    if kind == "$":
        size = int(rest)
        return "" if size < 0 else reader.read(size + 2)[:size].decode(errors="replace")
    if kind == "*":
        return [str(read_reply(reader)) for _ in range(max(int(rest), 0))]
    raise RedisReplyError(f"unexpected reply {head[:40]!r}")


def redis_call(
    port: int, *args: str, host: str = _LOOPBACK, timeout: float = 1.0
) -> str | list[str]:
    """One command over RESP on a fresh connection; the reply as text (a list for an array)."""
    request = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
    with (
        socket.create_connection((host, port), timeout=timeout) as sock,
        sock.makefile("rb") as reader,
    ):
        sock.sendall(request.encode())
        return read_reply(reader)


def redis_text(port: int, *args: str, timeout: float = 1.0) -> str:
    """:func:`redis_call` for a command whose reply is text; an array raises RedisReplyError."""
    reply = redis_call(port, *args, timeout=timeout)
    if isinstance(reply, list):
        raise RedisReplyError(f"{args[0]}: expected text, got an array")
    return reply


def info_field(info: str, name: str) -> str | None:
    """The value of ``name:`` in an ``INFO`` reply, or None when it has no such line."""
    for line in info.splitlines():
        key, sep, value = line.partition(":")
        if sep and key == name:
            return value.strip()
    return None
