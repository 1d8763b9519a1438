"""The registry of the Redis backings' Lua scripts: one folder per protocol under ``lua/``.

A script is a file of ``lua/state/``, ``lua/queue/``, ``lua/tx/``, ``lua/adk/`` (the ADK
session service's) or ``lua/langgraph/`` (the LangGraph checkpoint store's); what is
sent is ``lua/_common.lua``, its folder's ``_prelude.lua``, then the file. The
registry is the folders' contents (a name in two folders is refused at
import), read once with :mod:`importlib.resources`, so the scripts ship in the
wheel. How scripts are written and run: docs/backings.md#scripts.

This module must never build keys or interpret replies: it turns a name into
a callable script.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from importlib.resources import files
from typing import Any, Literal

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from statepact._retry import RetryPolicy
from statepact.errors import StatepactError
from statepact.storage.redis._client import Failover, gate_of, pooled_connection

__all__ = [
    "ADK_SCRIPTS",
    "LANGGRAPH_SCRIPTS",
    "QUEUE_SCRIPTS",
    "STATE_SCRIPTS",
    "TX_SCRIPTS",
    "ScriptCalls",
    "ScriptRunner",
    "script_source",
]

Family = Literal["state", "queue", "tx", "adk", "langgraph"]

_LUA = files("statepact.storage.redis") / "lua"


def _scripts_in(family: Family) -> tuple[str, ...]:
    """The scripts of one folder: every ``.lua`` file but those starting with ``_``."""
    return tuple(
        sorted(
            entry.name.removesuffix(".lua")
            for entry in (_LUA / family).iterdir()
            if entry.name.endswith(".lua") and not entry.name.startswith("_")
        )
    )


STATE_SCRIPTS = _scripts_in("state")
QUEUE_SCRIPTS = _scripts_in("queue")
TX_SCRIPTS = _scripts_in("tx")
#: The Google ADK session service's (``statepact.integrations.adk``).
ADK_SCRIPTS = _scripts_in("adk")
#: The LangGraph checkpoint saver's (``statepact.integrations.langgraph``).
LANGGRAPH_SCRIPTS = _scripts_in("langgraph")


def _registry() -> dict[str, Family]:
    folders: dict[Family, tuple[str, ...]] = {
        "state": STATE_SCRIPTS,
        "queue": QUEUE_SCRIPTS,
        "tx": TX_SCRIPTS,
        "adk": ADK_SCRIPTS,
        "langgraph": LANGGRAPH_SCRIPTS,
    }
    families: dict[str, Family] = {}
    for family, names in folders.items():
        for name in names:
            if name in families:
                raise RuntimeError(f"lua/{families[name]}/ and lua/{family}/ both hold {name}.lua")
            families[name] = family
    return families


_FAMILY: dict[str, Family] = _registry()


@cache
def script_source(name: str) -> str:
    """The full text sent to Redis for script ``name``: the preludes, then the script."""
    family = _FAMILY.get(name)
    if family is None:
        raise KeyError(f"no Lua script named {name!r}")
    parts = (_LUA / "_common.lua", _LUA / family / "_prelude.lua", _LUA / family / f"{name}.lua")
    return "\n".join(part.read_text("utf-8") for part in parts)


class ScriptRunner:
    """The scripts of one family registered on one client, called by name."""

    def __init__(self, redis: Any, names: Sequence[str]) -> None:
        # redis-py's register_script takes either client kind and handles NOSCRIPT.
        self._redis = redis
        self._scripts = {name: redis.register_script(script_source(name)) for name in names}
        # A single-server client's pool, which an EVALSHA goes through directly (below).
        self._pool: Any = (
            redis.connection_pool
            if isinstance(redis, Redis) and not redis.single_connection_client
            else None
        )

    async def __call__(
        self, name: str, keys: Sequence[str], args: Sequence[str | int | bytes]
    ) -> Any:
        """Run script ``name``; keys and string args go as UTF-8 bytes whatever the client's
        encoding, because the key codec measures segments in UTF-8 bytes."""
        script = self._scripts[name]
        try:
            return await self._evalsha(script.sha, keys, args)
        except NoScriptError:
            pass  # not in this server's script cache (a restart, a failover): load it
        redis = self._redis
        try:
            script.sha = await redis.script_load(script.script)
            return await self._evalsha(script.sha, keys, args)
        except NoScriptError:
            # Still NOSCRIPT after loading it: on a cluster whose topology moved (a replica
            # promoted after a full resync has an empty script cache) the load went to the
            # old primaries. EVAL goes where the keys live and caches it there; NOSCRIPT
            # means nothing ran, so sending the source is safe.
            return await redis.eval(script.script, len(keys), *_utf8(keys), *_utf8(args))

    async def _evalsha(
        self, sha: str, keys: Sequence[str], args: Sequence[str | int | bytes]
    ) -> Any:
        """One ``EVALSHA``: on a single server, on a connection of the client's pool
        (sent and answered as the client does, with none of the client's per-command
        wrapping: the command's name, retry, reply callbacks, metrics, which cost as
        much as the round trip; an error drops the connection as the client's own
        call would); on a cluster through the client, which routes it."""
        pool = self._pool
        if pool is None:
            return await self._redis.evalsha(sha, len(keys), *_utf8(keys), *_utf8(args))
        command = _resp_command(b"EVALSHA", [sha, len(keys), *keys, *args])
        connection = await pooled_connection(pool)
        try:
            await connection.send_packed_command(command)
            return await connection.read_response()
        finally:
            await pool.release(connection)


class ScriptCalls:
    """A family's scripts called by name through one ``Failover``: how every Redis store
    (state, queue, transaction backend, an integration's) runs its scripts.

    ``unavailable(message)`` builds the store's public error for a server that
    cannot serve the call; ``label`` starts each call's name in messages
    (``"LangGraph "``); ``failover`` runs the store's other calls (a scan, a
    preflight) within the same budget and through the same gate.
    """

    def __init__(
        self,
        redis: Any,
        names: Sequence[str],
        policy: RetryPolicy,
        unavailable: Callable[[str], StatepactError],
        *,
        label: str = "",
    ) -> None:
        self._scripts = ScriptRunner(redis, names)
        self._label = label
        self.failover = Failover(policy, unavailable, gate_of(redis))

    async def __call__(
        self,
        what: str,
        name: str,
        keys: Sequence[str],
        args: Sequence[str | int | bytes],
        *,
        read: bool = False,
    ) -> Any:
        """Script ``name`` through the failover (``what`` names it in messages). A ``read``
        may be abandoned by a cancelled caller (redis-py drops its connection, so no
        reply is misread); a write runs to its answer first."""
        return await self.failover.run(
            self._label + what, lambda: self._scripts(name, keys, args), abandonable=read
        )


def _utf8(values: Sequence[str | int | bytes]) -> list[int | bytes]:
    """``str`` values as UTF-8 bytes, the rest as they are."""
    return [value.encode("utf-8") if isinstance(value, str) else value for value in values]


# An argument longer than this goes out as a chunk of its own rather than copied into one.
_LARGE = 16_384


def _resp_command(name: bytes, args: Sequence[bytes | str | int]) -> list[bytes]:
    """``name`` and ``args`` as one RESP command (an array of bulk strings), ready to send.

    A ``str`` goes as UTF-8, an ``int`` as its digits. Small parts are
    joined into one string; a large argument (a blob) is sent as is, not copied.
    """
    chunks: list[bytes] = []
    head = [b"*%d\r\n$%d\r\n%b\r\n" % (len(args) + 1, len(name), name)]
    for arg in args:
        if isinstance(arg, int):
            raw = b"%d" % arg
        elif isinstance(arg, str):
            raw = arg.encode("utf-8")
        else:
            raw = arg
        if len(raw) > _LARGE:
            head.append(b"$%d\r\n" % len(raw))
            chunks += (b"".join(head), raw)
            head = [b"\r\n"]
        else:
            head.append(b"$%d\r\n%b\r\n" % (len(raw), raw))
    chunks.append(b"".join(head))
    return chunks


async def load_scripts(redis: Any) -> None:
    """Load every packaged script into the server's script cache (``SCRIPT LOAD``), so a
    first call is one ``EVALSHA`` and never the ``NOSCRIPT`` retry."""
    for name in _FAMILY:
        await redis.script_load(script_source(name))
