"""How ``ScriptRunner`` puts a command on the wire, with no server: its RESP encoding is
byte for byte what redis-py's own packer sends, a large argument goes as a chunk of its own."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection

from statepact.storage.redis._scripts import _LARGE, _resp_command

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    "args",
    [
        (SHA, 0),
        (SHA, 2, b"k1", b"k2", 7, -3, b"", "t\u00e9nant", 2**63 - 1),
        (SHA, 1, b"x" * (_LARGE + 1), b"y"),
        (SHA, 1, b"x" * _LARGE, b"z" * (3 * _LARGE), b"w" * (_LARGE + 1)),
        (SHA, 1, b"a\r\n$3\r\nb"),
    ],
)
def test_a_command_is_what_redis_py_would_send(args: tuple[object, ...]) -> None:
    ours = _resp_command(b"EVALSHA", args)  # type: ignore[arg-type]
    assert b"".join(ours) == b"".join(Connection().pack_command("EVALSHA", *args))


def test_a_large_argument_is_not_copied() -> None:
    blob = b"b" * (_LARGE + 1)
    chunks = _resp_command(b"EVALSHA", [SHA, 1, b"key", blob])
    assert any(chunk is blob for chunk in chunks)
