"""The LangGraph checkpoint store on Redis, with no module: hashes, sorted sets, Lua.

Each call is one script of ``storage/redis/lua/langgraph/`` (layout in its
``_prelude.lua`` and ``LangGraphKeys``), every key of a tenant in one cluster
slot, run through the Redis backing's script registry and failover. A filtered
listing is the exception: it reads the metadata of a stretch of the index, keeps
what :func:`json_contains` admits, then fetches those checkpoints (two round
trips a stretch). Values are stored as the serde's bytes, so the client must
not decode responses.

This module must never format a key (``LangGraphKeys``, ``seg``, ``ref``) and
never let a redis-py exception out (``Failover``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from statepact._codec import decode_json
from statepact.clock import to_micros
from statepact.errors import StatePersistenceError
from statepact.integrations.langgraph._store import (
    CheckpointRow,
    ListQuery,
    StoredCheckpoint,
    WriteRow,
    json_contains,
)
from statepact.settings import RedisStoreSettings
from statepact.storage.redis import (
    LANGGRAPH_SCRIPTS,
    LangGraphKeys,
    ScriptCalls,
    parse_ref,
    ref,
    seg,
)

__all__ = ["RedisCheckpointStore"]

#: Index members a filtered listing reads per round trip.
_SCAN = 256
_SEP = "\x00"

# A bound of ZREVRANGEBYLEX as (text, inclusive); None is "+".
_Bound = tuple[str, bool] | None


def _unavailable(message: str) -> StatePersistenceError:
    return StatePersistenceError(message, reason="unavailable")


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _segments(raw: bytes, count: int) -> tuple[list[str], bytes]:
    """The first ``count`` length-prefixed segments of ``raw`` (as ``seg`` writes them), and
    the bytes after them."""
    out: list[str] = []
    at = 0
    for _ in range(count):
        colon = raw.index(b":", at)
        end = colon + 1 + int(raw[at:colon])
        out.append(raw[colon + 1 : end].decode("utf-8"))
        at = end
    return out, raw[at:]


def _lower(a: _Bound, b: _Bound) -> _Bound:
    """The tighter of two upper bounds: the lower text, exclusive before inclusive."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b, key=lambda bound: (bound[0], bound[1]))


class RedisCheckpointStore:
    """Checkpoints under ``<namespace>:lg:{<tenant>}:``; see the module docstring."""

    def __init__(self, redis: Any, *, settings: RedisStoreSettings) -> None:
        self._redis = redis
        self._keys = LangGraphKeys(settings.namespace)
        self._call = ScriptCalls(
            redis, LANGGRAPH_SCRIPTS, settings.retry_policy, _unavailable, label="LangGraph "
        )

    def __repr__(self) -> str:
        return f"RedisCheckpointStore(namespace={self._keys.namespace!r})"

    async def check(self) -> None:
        encoder = getattr(self._redis, "get_encoder", None)
        if encoder is not None and encoder().decode_responses:
            raise ValueError(
                "backing: its Redis client decodes responses (decode_responses=True); "
                "checkpoints are binary, so the saver needs a client that returns bytes"
            )

    async def put(self, tenant: str, row: CheckpointRow) -> None:
        keys = self._keys
        blobs: list[str | bytes] = []
        for blob in row.blobs:
            blobs += [ref(blob.channel, blob.version), seg(blob.kind).encode() + blob.data]
        await self._call(
            f"put of checkpoint {row.checkpoint_id!r} (tenant {tenant!r})",
            "lg_put",
            [
                keys.checkpoint(tenant, row.thread_id, row.checkpoint_ns, row.checkpoint_id),
                keys.blobs(tenant, row.thread_id, row.checkpoint_ns),
                keys.threads(tenant),
            ],
            [
                keys.prefix(tenant),
                row.thread_id,
                row.checkpoint_ns,
                row.checkpoint_id,
                row.parent_id or "",
                row.kind,
                row.data,
                row.metadata,
                row.run_id or "",
                to_micros(row.at),
                "".join(seg(ref(channel, version)) for channel, version in row.versions),
                *blobs,
            ],
        )

    async def put_writes(
        self,
        tenant: str,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[WriteRow],
    ) -> None:
        args: list[str | bytes] = [checkpoint_id + _SEP + checkpoint_ns]
        for write in writes:
            args += [
                ref(write.task_id, str(write.idx)),
                (seg(write.channel) + seg(write.kind) + seg(write.task_path)).encode() + write.data,
                "1" if write.idx < 0 else "0",
            ]
        await self._call(
            f"put_writes of checkpoint {checkpoint_id!r} (tenant {tenant!r})",
            "lg_put_writes",
            [
                self._keys.writes(tenant, thread_id, checkpoint_ns, checkpoint_id),
                self._keys.writes_of_thread(tenant, thread_id),
            ],
            args,
        )

    async def get(
        self, tenant: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> StoredCheckpoint | None:
        keys = self._keys
        reply = await self._call(
            f"get_tuple of thread {thread_id!r} (tenant {tenant!r})",
            "lg_get",
            [keys.in_namespace(tenant, thread_id, checkpoint_ns)],
            [keys.prefix(tenant), thread_id, checkpoint_ns, checkpoint_id or ""],
            read=True,
        )
        return None if reply is None else _record(thread_id, checkpoint_ns, reply)

    async def page(self, tenant: str, query: ListQuery) -> list[StoredCheckpoint]:
        keys = self._keys
        if query.thread_id is not None and query.checkpoint_ns is not None:
            which, index = "ns", keys.in_namespace(tenant, query.thread_id, query.checkpoint_ns)
        elif query.thread_id is not None:
            which, index = "thread", keys.in_thread(tenant, query.thread_id)
        else:
            which, index = "all", keys.in_tenant(tenant)
        high, low = _bounds(query, which)
        fixed = [keys.prefix(tenant), which, query.thread_id or "", query.checkpoint_ns or ""]
        what = f"list of tenant {tenant!r}"
        if query.metadata is None:
            reply = await self._call(
                what,
                "lg_page",
                [index],
                [*fixed, _bound_text(high), low, query.limit, "0"],
                read=True,
            )
            return [
                _record(*_place(which, query, _text(reply[i]))[:2], reply[i + 1])
                for i in range(0, len(reply), 2)
            ]
        found: list[StoredCheckpoint] = []
        while len(found) < query.limit:
            reply = await self._call(
                what, "lg_page", [index], [*fixed, _bound_text(high), low, _SCAN, "1"], read=True
            )
            members = [_text(reply[i]) for i in range(0, len(reply), 2)]
            places = [
                _place(which, query, member)
                for member, meta in zip(members, reply[1::2], strict=True)
                if meta is not None and json_contains(decode_json(meta), query.metadata)
            ][: query.limit - len(found)]
            if places:
                records = await self._call(
                    what,
                    "lg_fetch",
                    [keys.in_tenant(tenant)],
                    [keys.prefix(tenant), *(part for place in places for part in place)],
                    read=True,
                )
                found += [
                    _record(thread, ns, record)
                    for (thread, ns, _), record in zip(places, records, strict=True)
                    if record is not None
                ]
            if len(reply) < 2 * _SCAN:
                break
            high = (members[-1], False)
        return found

    async def delete_thread(self, tenant: str, thread_id: str) -> None:
        await self._delete_threads(tenant, [thread_id])

    async def _delete_threads(self, tenant: str, thread_ids: Sequence[str]) -> None:
        keys = self._keys
        await self._call(
            f"delete of {len(thread_ids)} thread(s) (tenant {tenant!r})",
            "lg_delete_threads",
            [keys.threads(tenant), keys.in_tenant(tenant)],
            [keys.prefix(tenant), *thread_ids],
        )

    async def delete_for_runs(self, tenant: str, run_ids: Sequence[str]) -> None:
        await self._call(
            f"delete_for_runs of {len(run_ids)} run(s) (tenant {tenant!r})",
            "lg_delete_runs",
            [self._keys.in_tenant(tenant)],
            [self._keys.prefix(tenant), *run_ids],
        )

    async def copy_thread(self, tenant: str, source: str, target: str, at: datetime) -> None:
        keys = self._keys
        await self._call(
            f"copy_thread of thread {source!r} (tenant {tenant!r})",
            "lg_copy",
            [keys.threads(tenant), keys.in_tenant(tenant)],
            [keys.prefix(tenant), source, target, to_micros(at)],
        )

    async def prune(self, tenant: str, thread_ids: Sequence[str], *, keep_latest: bool) -> None:
        if not keep_latest:
            await self._delete_threads(tenant, thread_ids)
            return
        await self._call(
            f"prune of {len(thread_ids)} thread(s) (tenant {tenant!r})",
            "lg_prune",
            [self._keys.in_tenant(tenant)],
            [self._keys.prefix(tenant), *thread_ids],
        )

    async def uses_delta_channels(self, tenant: str, thread_ids: Sequence[str]) -> list[str]:
        reply = await self._call(
            f"prune of {len(thread_ids)} thread(s) (tenant {tenant!r})",
            "lg_delta_threads",
            [self._keys.in_tenant(tenant)],
            [self._keys.prefix(tenant), *thread_ids],
            read=True,
        )
        return sorted(_text(thread) for thread in reply)

    async def sweep(self, tenant: str, cutoff: datetime, batch: int) -> int:
        keys = self._keys
        reply = await self._call(
            f"sweep of tenant {tenant!r}",
            "lg_sweep",
            [keys.threads(tenant), keys.in_tenant(tenant)],
            [keys.prefix(tenant), to_micros(cutoff), batch],
        )
        return int(reply)


def _bounds(query: ListQuery, which: str) -> tuple[_Bound, str]:
    """ZREVRANGEBYLEX's max (as a bound) and min for ``query`` on an index of ``which``."""
    high: _Bound = None
    low = "-"
    if query.checkpoint_id is not None:
        if which == "ns":
            high, low = (query.checkpoint_id, True), "[" + query.checkpoint_id
        else:
            high, low = (query.checkpoint_id + "\x01", False), "[" + query.checkpoint_id + _SEP
    if query.before is not None:
        high = _lower(high, (query.before, False))
    if query.below is not None:
        below = query.below
        member = {
            "ns": below.checkpoint_id,
            "thread": below.checkpoint_id + _SEP + below.checkpoint_ns,
            "all": _SEP.join(below.key()),
        }[which]
        high = _lower(high, (member, False))
    return high, low


def _bound_text(bound: _Bound) -> str:
    if bound is None:
        return "+"
    text, inclusive = bound
    return ("[" if inclusive else "(") + text


def _place(which: str, query: ListQuery, member: str) -> tuple[str, str, str]:
    """(thread, namespace, checkpoint id) of an index member."""
    if which == "ns":
        assert query.thread_id is not None and query.checkpoint_ns is not None
        return query.thread_id, query.checkpoint_ns, member
    parts = member.split(_SEP)
    if which == "thread":
        assert query.thread_id is not None
        return query.thread_id, parts[1], parts[0]
    return parts[1], parts[2], parts[0]


def _record(thread_id: str, checkpoint_ns: str, reply: Sequence[Any]) -> StoredCheckpoint:
    """A checkpoint from ``record()``'s reply (``lua/langgraph/_prelude.lua``)."""
    checkpoint_id, parent, kind, data, meta, blobs, writes = reply
    values = []
    for i in range(0, len(blobs), 2):
        channel, _version = parse_ref(blobs[i])
        (blob_kind,), blob = _segments(blobs[i + 1], 1)
        values.append((channel, blob_kind, blob))
    pending = []
    for i in range(0, len(writes), 2):
        task_id, idx = parse_ref(writes[i])
        (channel, write_kind, task_path), payload = _segments(writes[i + 1], 3)
        pending.append(WriteRow(task_id, int(idx), channel, write_kind, payload, task_path))
    return StoredCheckpoint(
        thread_id=thread_id,
        checkpoint_ns=checkpoint_ns,
        checkpoint_id=_text(checkpoint_id),
        parent_id=None if parent is None else _text(parent),
        kind=_text(kind),
        data=data,
        metadata=meta,
        values=tuple(values),
        writes=tuple(pending),
    )
