"""The LangGraph checkpoint store in this process: the semantic reference of the three.

Dictionaries per tenant; every call runs to its end in one step of the event
loop (nothing awaits inside one), so each is atomic. Kept bytes are the ones
the saver sent, so a caller can change nothing it was given back.

This module must never await inside a call, and never import a driver.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from statepact._codec import decode_json
from statepact.integrations.langgraph._store import (
    CheckpointRow,
    ListQuery,
    StoredCheckpoint,
    WriteRow,
    json_contains,
)

__all__ = ["MemoryCheckpointStore"]

# A checkpoint's place in a namespace, a thread and a tenant (sorted lists of these).
_Key = tuple[str, str, str]  # (checkpoint_id, thread_id, checkpoint_ns)


@dataclass(slots=True)
class _Checkpoint:
    row: CheckpointRow
    parent_id: str | None
    metadata: Any  # decoded once, for the filter
    writes: dict[tuple[str, int], WriteRow] = field(default_factory=dict)


@dataclass(slots=True)
class _Tenant:
    checkpoints: dict[_Key, _Checkpoint] = field(default_factory=dict)
    # Every checkpoint's key in listing order (ascending; listings walk it backwards).
    order: list[_Key] = field(default_factory=list)
    # (thread, namespace, channel, version) -> (kind, data)
    blobs: dict[tuple[str, str, str, str], tuple[str, bytes]] = field(default_factory=dict)
    # thread -> the injected clock's reading at its last put
    written: dict[str, datetime] = field(default_factory=dict)

    def keys_of(self, thread_id: str) -> list[_Key]:
        return [key for key in self.order if key[1] == thread_id]

    def drop(self, key: _Key) -> _Checkpoint:
        self.order.pop(bisect.bisect_left(self.order, key))
        return self.checkpoints.pop(key)

    def drop_blobs(self, gone: Iterable[_Checkpoint]) -> None:
        """Delete the blobs of ``gone`` that no checkpoint left in their namespace reads."""
        freed = {
            (c.row.thread_id, c.row.checkpoint_ns, channel, version)
            for c in gone
            for channel, version in c.row.versions
        }
        spaces = {(thread, ns) for thread, ns, _, _ in freed}
        for key, kept in self.checkpoints.items():
            if (key[1], key[2]) in spaces:
                for channel, version in kept.row.versions:
                    freed.discard((key[1], key[2], channel, version))
        for blob in freed:
            self.blobs.pop(blob, None)

    def drop_thread(self, thread_id: str) -> None:
        for key in self.keys_of(thread_id):
            self.drop(key)
        for blob in [blob for blob in self.blobs if blob[0] == thread_id]:
            del self.blobs[blob]
        self.written.pop(thread_id, None)


class MemoryCheckpointStore:
    """Checkpoints in dictionaries, one set per tenant; see the module docstring."""

    def __init__(self) -> None:
        self._tenants: dict[str, _Tenant] = {}

    def __repr__(self) -> str:
        return "MemoryCheckpointStore()"

    def _tenant(self, tenant: str) -> _Tenant:
        found = self._tenants.get(tenant)
        if found is None:
            found = self._tenants[tenant] = _Tenant()
        return found

    async def check(self) -> None:
        return None

    async def put(self, tenant: str, row: CheckpointRow) -> None:
        space = self._tenant(tenant)
        key = (row.checkpoint_id, row.thread_id, row.checkpoint_ns)
        for blob in row.blobs:
            space.blobs.setdefault(
                (row.thread_id, row.checkpoint_ns, blob.channel, blob.version),
                (blob.kind, blob.data),
            )
        existing = space.checkpoints.get(key)
        if existing is None:
            bisect.insort(space.order, key)
            space.checkpoints[key] = _Checkpoint(row, row.parent_id, decode_json(row.metadata))
        else:
            existing.row, existing.parent_id = row, row.parent_id
            existing.metadata = decode_json(row.metadata)
        last = space.written.get(row.thread_id)
        space.written[row.thread_id] = row.at if last is None else max(last, row.at)

    async def put_writes(
        self,
        tenant: str,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[WriteRow],
    ) -> None:
        space = self._tenant(tenant)
        key = (checkpoint_id, thread_id, checkpoint_ns)
        checkpoint = space.checkpoints.get(key)
        if checkpoint is None:
            # Writes may come before their checkpoint (a run saves them in the background);
            # keep them under a placeholder no listing or read sees until the put lands.
            checkpoint = _pending(space, key)
        for write in writes:
            slot = (write.task_id, write.idx)
            if write.idx >= 0 and slot in checkpoint.writes:
                continue
            checkpoint.writes[slot] = write

    async def get(
        self, tenant: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> StoredCheckpoint | None:
        space = self._tenant(tenant)
        if checkpoint_id is not None:
            found = space.checkpoints.get((checkpoint_id, thread_id, checkpoint_ns))
            return None if found is None or _is_pending(found) else _stored(space, found)
        for key in reversed(space.order):
            if key[1] == thread_id and key[2] == checkpoint_ns:
                found = space.checkpoints[key]
                if not _is_pending(found):
                    return _stored(space, found)
        return None

    async def page(self, tenant: str, query: ListQuery) -> list[StoredCheckpoint]:
        space = self._tenant(tenant)
        page: list[StoredCheckpoint] = []
        for key in reversed(space.order):
            if len(page) >= query.limit:
                break
            checkpoint = space.checkpoints[key]
            if _is_pending(checkpoint) or not query.admits(key):
                continue
            if query.metadata is not None and not json_contains(
                checkpoint.metadata, query.metadata
            ):
                continue
            page.append(_stored(space, checkpoint))
        return page

    async def delete_thread(self, tenant: str, thread_id: str) -> None:
        self._tenant(tenant).drop_thread(thread_id)

    async def delete_for_runs(self, tenant: str, run_ids: Sequence[str]) -> None:
        space = self._tenant(tenant)
        runs = set(run_ids)
        doomed = [key for key, c in space.checkpoints.items() if c.row.run_id in runs]
        space.drop_blobs([space.drop(key) for key in doomed])

    async def copy_thread(self, tenant: str, source: str, target: str, at: datetime) -> None:
        space = self._tenant(tenant)
        copied = False
        for key in space.keys_of(source):
            checkpoint = space.checkpoints[key]
            if _is_pending(checkpoint):
                continue
            copied = True
            new_key = (key[0], target, key[2])
            row = checkpoint.row
            clone = CheckpointRow(**{**_fields(row), "thread_id": target, "blobs": (), "at": at})
            existing = space.checkpoints.get(new_key)
            if existing is None:
                bisect.insort(space.order, new_key)
            # A target write of the same (task, idx) is replaced, the target's others kept.
            writes = {} if existing is None else existing.writes
            writes.update(checkpoint.writes)
            space.checkpoints[new_key] = _Checkpoint(
                clone, checkpoint.parent_id, checkpoint.metadata, writes
            )
        for (thread, ns, channel, version), blob in list(space.blobs.items()):
            if thread == source:
                space.blobs.setdefault((target, ns, channel, version), blob)
        if copied:
            space.written[target] = at

    async def prune(self, tenant: str, thread_ids: Sequence[str], *, keep_latest: bool) -> None:
        space = self._tenant(tenant)
        for thread_id in thread_ids:
            if not keep_latest:
                space.drop_thread(thread_id)
                continue
            newest: dict[str, _Key] = {}
            for key in space.keys_of(thread_id):
                if not _is_pending(space.checkpoints[key]):
                    newest[key[2]] = key  # ascending: the last one seen is the newest
            kept = set(newest.values())
            gone = [space.drop(key) for key in space.keys_of(thread_id) if key not in kept]
            gone_ids = {(c.row.checkpoint_ns, c.row.checkpoint_id) for c in gone}
            for key in kept:
                checkpoint = space.checkpoints[key]
                if (key[2], checkpoint.parent_id) in gone_ids:
                    checkpoint.parent_id = None
            space.drop_blobs(gone)

    async def uses_delta_channels(self, tenant: str, thread_ids: Sequence[str]) -> list[str]:
        space = self._tenant(tenant)
        wanted = set(thread_ids)
        return sorted(
            {
                key[1]
                for key, c in space.checkpoints.items()
                if key[1] in wanted
                and isinstance(c.metadata, dict)
                and "counters_since_delta_snapshot" in c.metadata
            }
        )

    async def sweep(self, tenant: str, cutoff: datetime, batch: int) -> int:
        space = self._tenant(tenant)
        idle = sorted((at, thread) for thread, at in space.written.items() if at < cutoff)
        for _at, thread in idle[:batch]:
            space.drop_thread(thread)
        return len(idle[:batch])


def _fields(row: CheckpointRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in CheckpointRow.__slots__}


def _pending(space: _Tenant, key: _Key) -> _Checkpoint:
    """A placeholder holding writes that came before their checkpoint (``row.kind == ""``)."""
    checkpoint_id, thread_id, checkpoint_ns = key
    placeholder = CheckpointRow(
        thread_id=thread_id,
        checkpoint_ns=checkpoint_ns,
        checkpoint_id=checkpoint_id,
        parent_id=None,
        kind="",
        data=b"",
        metadata=b"{}",
        run_id=None,
        versions=(),
        blobs=(),
        at=datetime.min.replace(tzinfo=UTC),
    )
    checkpoint = _Checkpoint(placeholder, None, {})
    bisect.insort(space.order, key)
    space.checkpoints[key] = checkpoint
    return checkpoint


def _is_pending(checkpoint: _Checkpoint) -> bool:
    return checkpoint.row.kind == ""


def _stored(space: _Tenant, checkpoint: _Checkpoint) -> StoredCheckpoint:
    row = checkpoint.row
    values = []
    for channel, version in row.versions:
        blob = space.blobs.get((row.thread_id, row.checkpoint_ns, channel, version))
        if blob is not None:
            values.append((channel, blob[0], blob[1]))
    return StoredCheckpoint(
        thread_id=row.thread_id,
        checkpoint_ns=row.checkpoint_ns,
        checkpoint_id=row.checkpoint_id,
        parent_id=checkpoint.parent_id,
        kind=row.kind,
        data=row.data,
        metadata=row.metadata,
        values=tuple(values),
        writes=tuple(checkpoint.writes.values()),
    )
