"""``preflight()``: refuse a Redis server that would lose runs, leases or queued work.

It reads the configuration (``CONFIG GET``, else ``INFO`` where ``CONFIG`` is
disabled; every primary of a cluster) and refuses, listing every reason at
once, an eviction policy that drops records and, with ``durable=True``,
persistence that forgets acknowledged writes on a crash. What each setting
keeps: docs/backings.md#what-redis-refuses-and-why and docs/operations.md.

This module reads and refuses; it must never set a configuration value.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redis import exceptions as rex

from statepact._retry import RetryPolicy
from statepact.errors import PreflightError, StatePersistenceError
from statepact.storage.redis._client import Failover, as_text

__all__ = ["ServerConfig", "preflight", "refusals"]

_log = logging.getLogger("statepact.redis")

_EVICTING = ("allkeys-", "volatile-ttl")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What preflight learned about one server; ``None`` where it could not tell.

    ``source`` is ``"CONFIG"`` or ``"INFO"``. From INFO, ``save`` and
    ``appendfsync`` are unknown.
    """

    server: str
    source: str
    maxmemory_policy: str | None
    appendonly: bool | None
    save: str | None
    appendfsync: str | None = None


_NOT_DURABLE = "pass durable=False for data that can be recreated"


def _persistence_refusals(config: ServerConfig) -> list[str]:
    """Why ``config`` would lose acknowledged writes on a restart (empty: it would not)."""
    if config.source != "CONFIG":
        if config.appendonly:
            return []  # appendfsync is not in INFO: taken on trust
        return [
            "CONFIG is not available and INFO persistence shows aof_enabled:0: without an "
            "append-only file a restart forgets every write since its last snapshot, if it "
            f"took any; enable AOF (appendonly yes), or {_NOT_DURABLE}"
        ]
    if config.appendonly is True:
        if config.appendfsync == "no":
            return [
                "appendfsync is 'no': the kernel decides when the append-only file reaches the "
                "disk, so an OS crash or power loss loses tens of seconds of acknowledged "
                "writes; use appendfsync everysec (at most about a second) or always "
                f"(nothing), or {_NOT_DURABLE}"
            ]
        return []
    if config.appendonly is False and config.save == "":
        return [
            "appendonly is 'no' and save is '': the server keeps nothing on disk, so "
            f"a restart loses every run and lease; enable AOF (appendonly yes), or {_NOT_DURABLE}"
        ]
    if config.appendonly is False and config.save:
        return [
            f"appendonly is 'no' and save is {config.save!r}: RDB snapshots alone forget "
            "every write since the last snapshot on a crash or restart (runs and counters "
            "go back, settled work comes back, idempotency records vanish); enable AOF "
            f"(appendonly yes), or {_NOT_DURABLE}"
        ]
    return [
        "appendonly/save could not be read with CONFIG GET, so persistence "
        f"cannot be confirmed; {_NOT_DURABLE}"
    ]


def refusals(config: ServerConfig, *, durable: bool = True) -> list[str]:
    """Every reason ``config`` is unfit to hold statepact's data (empty: fit)."""
    reasons: list[str] = []
    policy = config.maxmemory_policy
    if policy is None:
        reasons.append(
            "maxmemory-policy could not be read (neither CONFIG GET nor INFO memory shows "
            "it), so eviction cannot be ruled out"
        )
    elif policy.startswith(_EVICTING):
        reasons.append(
            f"maxmemory-policy is {policy!r}: the server evicts keys under memory pressure, "
            "and an evicted run or lease reads as one that never existed; use noeviction"
        )
    if durable:
        reasons.extend(_persistence_refusals(config))
    return reasons


def _node_reply(reply: Mapping[Any, Any]) -> dict[str, Any]:
    """A mapping reply as ``{text key: value}``, unwrapped when a cluster answers
    ``{node: reply}`` for the one node it asked."""
    items = {as_text(key): value for key, value in reply.items()}
    if len(items) == 1:
        (only,) = items.values()
        if isinstance(only, Mapping):
            return _node_reply(only)
    return items


def _flat(reply: Any) -> dict[str, str]:
    """A CONFIG GET reply as ``{name: value}`` (a flat list or a mapping, maybe per node)."""
    if isinstance(reply, Mapping):
        return {
            key: as_text(value) for key, value in _node_reply(reply).items() if value is not None
        }
    if isinstance(reply, list | tuple):
        return {as_text(reply[i]): as_text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}
    return {}


def _info_section(reply: Any) -> dict[str, Any]:
    """An INFO section's reply as ``{field: value}`` (maybe per node)."""
    return _node_reply(reply) if isinstance(reply, Mapping) else {}


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


async def _read_config(redis: Any, server: str, **target: Any) -> ServerConfig:
    try:
        reply = await redis.config_get(
            "maxmemory-policy", "appendonly", "save", "appendfsync", **target
        )
    except rex.ResponseError:
        # CONFIG renamed away or not permitted (managed Redis): read INFO instead.
        reply = None
    config = _flat(reply) if reply is not None else {}
    if reply is not None and "maxmemory-policy" in config and "appendonly" in config:
        fsync = config.get("appendfsync")
        return ServerConfig(
            server=server,
            source="CONFIG",
            maxmemory_policy=config["maxmemory-policy"],
            appendonly=config["appendonly"].strip().lower() == "yes",
            save=config.get("save", "").strip() if "save" in config else None,
            appendfsync=None if fsync is None else fsync.strip().lower(),
        )
    memory = _info_section(await redis.info("memory", **target))
    persistence = _info_section(await redis.info("persistence", **target))
    policy = memory.get("maxmemory_policy")
    aof = persistence.get("aof_enabled")
    return ServerConfig(
        server=server,
        source="INFO",
        maxmemory_policy=None if policy is None else as_text(policy),
        appendonly=None if aof is None else _int(aof, 0) == 1,
        save=None,
    )


async def read_server_configs(redis: Any) -> list[ServerConfig]:
    """The configuration of the server, or of every primary of a cluster."""
    get_primaries = getattr(redis, "get_primaries", None)
    if get_primaries is None:
        return [await _read_config(redis, "Redis")]
    # A cluster client learns its nodes on first use; preflight may be that use.
    await redis.initialize()
    configs = []
    for node in get_primaries():
        configs.append(await _read_config(redis, f"Redis node {node.name}", target_nodes=node))
    return configs


async def check(redis: Any, *, durable: bool, failover: Failover) -> None:
    """Preflight through a store's own failover (so a down server raises its error)."""
    configs = await failover.run("preflight", lambda: read_server_configs(redis))
    reasons: list[str] = [] if configs else ["the cluster client knows no primary node to check"]
    for config in configs:
        prefix = "" if len(configs) == 1 else f"{config.server}: "
        reasons.extend(prefix + reason for reason in refusals(config, durable=durable))
    if reasons:
        _log.warning(
            "Redis preflight refused the server: %s",
            "; ".join(reasons),
            extra={"backing": "redis", "reasons": reasons},
        )
        raise PreflightError(reasons, server="Redis")


async def preflight(redis: Any, *, durable: bool = True) -> None:
    """Refuse a server (or any cluster primary) that could lose data; read-only.

    Raises ``PreflightError`` listing every reason. A server that stays
    unreachable past the default failover budget raises
    ``StatePersistenceError(reason="unavailable")``.
    """

    def unavailable(message: str) -> StatePersistenceError:
        return StatePersistenceError(message, reason="unavailable")

    await check(redis, durable=durable, failover=Failover(RetryPolicy(), unavailable))
