"""The Lua scripts of the Redis backings, loaded from ``lua/*.lua`` beside this module.

Each script file starts with a header listing its KEYS, ARGV, return value and
the keys it touches. Files whose name starts with ``_`` are preludes, not
scripts: ``_common.lua`` goes in front of every script, then ``_state.lua``,
``_queue.lua`` or ``_tx.lua`` by the script's family, so shared helpers exist once.

Scripts run through redis-py's ``Script`` objects (``register_script``): the
first call is an EVALSHA, and a ``NOSCRIPT`` (a restarted or failed-over
server, ``SCRIPT FLUSH``) loads the script and runs it again, on a single
server and on a cluster alike; should the node that serves the keys still
lack it (a cluster whose topology moved under the client), the source goes
once with EVAL, which caches it there. The source is read once per process with
:mod:`importlib.resources`, so the scripts ship inside the wheel.

This module must never build keys or interpret replies; it only turns a name
into a callable script.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from importlib.resources import files
from typing import Any, Literal

from redis.exceptions import NoScriptError

__all__ = ["QUEUE_SCRIPTS", "STATE_SCRIPTS", "TX_SCRIPTS", "ScriptRunner", "script_source"]

Family = Literal["state", "queue", "tx"]

STATE_SCRIPTS = (
    "delete_run",
    "get_run",
    "get_session",
    "list_runs",
    "list_sessions",
    "patch_run",
    "put_run",
    "put_session",
)
QUEUE_SCRIPTS = (
    "ack_many",
    "claim",
    "claimed",
    "dead_letters",
    "enqueue",
    "enqueue_many",
    "heartbeat",
    "purge_dead",
    "reap",
    "requeue",
    "settle",
    "stats",
)
# RedisBackend (the transaction backing); prelude lua/_tx.lua.
TX_SCRIPTS = (
    "tx_begin_read",
    "tx_commit",
    "tx_lease_acquire",
    "tx_lease_release",
    "tx_lease_renew",
    "tx_lock",
    "tx_read",
    "tx_register",
    "tx_unlock",
)
_FAMILY: dict[str, Family] = {
    **dict.fromkeys(STATE_SCRIPTS, "state"),
    **dict.fromkeys(QUEUE_SCRIPTS, "queue"),
    **dict.fromkeys(TX_SCRIPTS, "tx"),
}


def _read(name: str) -> str:
    return (files("statepact.storage.redis") / "lua" / f"{name}.lua").read_text("utf-8")


@cache
def script_source(name: str) -> str:
    """The full text sent to Redis for script ``name``: preludes, then the script."""
    family = _FAMILY.get(name)
    if family is None:
        raise KeyError(f"no Lua script named {name!r}")
    return "\n".join((_read("_common"), _read(f"_{family}"), _read(name)))


class ScriptRunner:
    """The scripts of one family registered on one client, called by name."""

    def __init__(self, redis: Any, names: Sequence[str]) -> None:
        # redis-py's register_script takes either client kind and handles NOSCRIPT.
        self._redis = redis
        self._scripts = {name: redis.register_script(script_source(name)) for name in names}

    async def __call__(
        self, name: str, keys: Sequence[str], args: Sequence[str | int | bytes]
    ) -> Any:
        """Run script ``name``; keys and string args go as UTF-8 bytes whatever the client's
        encoding, because the key codec measures segments in UTF-8 bytes."""
        encoded_keys = [key.encode("utf-8") for key in keys]
        encoded_args = [arg.encode("utf-8") if isinstance(arg, str) else arg for arg in args]
        script = self._scripts[name]
        try:
            return await script(keys=encoded_keys, args=encoded_args)
        except NoScriptError:
            # Still NOSCRIPT after redis-py loaded it: on a cluster whose topology moved
            # (a replica promoted after a full resync has an empty script cache) the load
            # went to the old primaries. EVAL goes where the keys live and caches it there;
            # NOSCRIPT means nothing ran, so sending the source is safe.
            return await self._redis.eval(
                script.script, len(encoded_keys), *encoded_keys, *encoded_args
            )


async def load_scripts(redis: Any) -> None:
    """Load every packaged script into the server's script cache (``SCRIPT LOAD``), so a
    first call is one ``EVALSHA`` and never the ``NOSCRIPT`` retry."""
    for name in _FAMILY:
        await redis.script_load(script_source(name))
