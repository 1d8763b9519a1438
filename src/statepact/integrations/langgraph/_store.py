"""The small storage protocol under ``StatepactCheckpointSaver``: checked, encoded records.

The saver (``saver.py``) validates LangGraph's configs, serializes every value
with the saver's serde, checks sizes and reads the clock; a store (one module
per backing: ``_memory.py``, ``_redis.py``, ``_postgres.py``) only keeps what it
is handed, atomically, and answers with the bytes it kept. Every call names the
tenant the saver was opened for. What each call costs on each backing:
docs/agent-frameworks.md.

This module must never import LangGraph, a driver or a backing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

__all__ = [
    "Blob",
    "CheckpointRow",
    "CheckpointStore",
    "ListQuery",
    "Position",
    "StoredCheckpoint",
    "WriteRow",
    "json_contains",
]


@dataclass(frozen=True, slots=True)
class Blob:
    """One channel's value at one version: ``kind`` and ``data`` are the serde's
    ``dumps_typed`` (``kind == "empty"``: the channel had no value at that version)."""

    channel: str
    version: str
    kind: str
    data: bytes


@dataclass(frozen=True, slots=True)
class WriteRow:
    """One pending write of a task. ``idx`` is its place in the task's writes, or the
    negative index LangGraph gives a special channel (an error, an interrupt)."""

    task_id: str
    idx: int
    channel: str
    kind: str
    data: bytes
    task_path: str


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """What ``put`` stores.

    ``kind``/``data`` are the checkpoint without its channel values;
    ``versions`` the ``(channel, version)`` pairs whose blobs make up its
    values; ``blobs`` the new blobs this put brings (the channels in its
    ``new_versions``); ``metadata`` the encoded JSON object and ``run_id``
    its ``run_id`` when that is a string; ``at`` the injected clock's reading.
    """

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    kind: str
    data: bytes
    metadata: bytes
    run_id: str | None
    versions: tuple[tuple[str, str], ...]
    blobs: tuple[Blob, ...]
    at: datetime


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as a store gives it back: its values as ``(channel, kind, data)`` (the
    blobs of its versions that exist, ``empty`` ones included) and its pending writes in
    no particular order (the saver sorts them)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    kind: str
    data: bytes
    metadata: bytes
    values: tuple[tuple[str, str, bytes], ...]
    writes: tuple[WriteRow, ...]


@dataclass(frozen=True, slots=True)
class Position:
    """A place in a listing, which goes by ``(checkpoint_id, thread_id, checkpoint_ns)``
    descending: the next page starts strictly below it."""

    checkpoint_id: str
    thread_id: str
    checkpoint_ns: str

    def key(self) -> tuple[str, str, str]:
        return (self.checkpoint_id, self.thread_id, self.checkpoint_ns)


@dataclass(frozen=True, slots=True)
class ListQuery:
    """One page of ``list``: the tenant's checkpoints, newest id first.

    ``thread_id``/``checkpoint_ns``/``checkpoint_id``: only those (None: any).
    ``before``: only ids below it. ``below``: only positions below it (the
    previous page's last). ``metadata``: only checkpoints whose metadata
    contains it (:func:`json_contains`), ``metadata_json`` its encoding; None
    for no filter. ``limit``: the page's size.
    """

    thread_id: str | None
    checkpoint_ns: str | None
    checkpoint_id: str | None
    before: str | None
    below: Position | None
    metadata: Mapping[str, Any] | None
    metadata_json: bytes | None
    limit: int

    def admits(self, position: tuple[str, str, str]) -> bool:
        """Whether a checkpoint at ``position`` (id, thread, namespace) is in the query's
        range (the metadata filter aside)."""
        checkpoint_id, thread_id, checkpoint_ns = position
        return (
            (self.thread_id is None or thread_id == self.thread_id)
            and (self.checkpoint_ns is None or checkpoint_ns == self.checkpoint_ns)
            and (self.checkpoint_id is None or checkpoint_id == self.checkpoint_id)
            and (self.before is None or checkpoint_id < self.before)
            and (self.below is None or position < self.below.key())
        )


def json_contains(document: Any, query: Any) -> bool:
    """Whether the JSON value ``document`` contains ``query``, as PostgreSQL's ``jsonb @>``
    decides it (the one rule of every backing's metadata filter).

    An object contains an object whose every key it holds with a value containing
    that key's value; an array contains an array each of whose elements one of its
    own contains; anything else only an equal value of the same JSON type (numbers
    compare by value, so ``1`` and ``1.0`` match; ``true`` is not ``1``).
    """
    if isinstance(query, dict):
        return isinstance(document, dict) and all(
            key in document and json_contains(document[key], value) for key, value in query.items()
        )
    if isinstance(query, list):
        return isinstance(document, list) and all(
            any(json_contains(element, wanted) for element in document) for wanted in query
        )
    if isinstance(query, bool) or isinstance(document, bool):
        return type(query) is type(document) and query == document
    if isinstance(query, int | float):
        return isinstance(document, int | float) and query == document
    if query is None:
        return document is None
    return isinstance(document, str) and query == document


class CheckpointStore(Protocol):
    """Where a ``StatepactCheckpointSaver`` keeps its checkpoints, one implementation per
    backing. Every call is atomic on its backing (one script, one statement or one step
    of the event loop), sent again safely by the backing's failover (each is idempotent),
    and raises only ``statepact.errors``."""

    async def check(self) -> None:
        """Refuse (``SchemaVersionError``) a backing the store cannot run on."""
        ...

    async def put(self, tenant: str, row: CheckpointRow) -> None:
        """Store the checkpoint (replacing one of the same id), the blobs it brings (a blob
        already stored is kept), and note the thread as written at ``row.at``."""
        ...

    async def put_writes(
        self,
        tenant: str,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[WriteRow],
    ) -> None:
        """Store pending writes of a checkpoint: a write whose ``(task_id, idx)`` is stored
        already is kept as it is when ``idx >= 0`` and replaced when ``idx < 0``."""
        ...

    async def get(
        self, tenant: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None
    ) -> StoredCheckpoint | None:
        """The checkpoint of that id, or the namespace's newest when ``checkpoint_id`` is
        None; None if there is none."""
        ...

    async def page(self, tenant: str, query: ListQuery) -> list[StoredCheckpoint]:
        """Up to ``query.limit`` checkpoints matching ``query``, by ``(checkpoint_id,
        thread_id, checkpoint_ns)`` descending."""
        ...

    async def delete_thread(self, tenant: str, thread_id: str) -> None:
        """Delete every checkpoint, blob and write of the thread, in every namespace."""
        ...

    async def delete_for_runs(self, tenant: str, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints whose metadata names one of ``run_ids``, their writes,
        and the blobs no checkpoint left in their namespace uses."""
        ...

    async def copy_thread(self, tenant: str, source: str, target: str, at: datetime) -> None:
        """Copy every checkpoint, blob and write of ``source`` onto ``target``."""
        ...

    async def prune(self, tenant: str, thread_ids: Sequence[str], *, keep_latest: bool) -> None:
        """Delete the threads' checkpoints, all of them or all but each namespace's newest
        (``keep_latest``: the kept one loses its ``parent_id`` when its parent goes), with
        their writes and the blobs no kept checkpoint uses."""
        ...

    async def uses_delta_channels(self, tenant: str, thread_ids: Sequence[str]) -> list[str]:
        """The threads among ``thread_ids`` with a checkpoint whose metadata has
        ``counters_since_delta_snapshot`` (a ``DeltaChannel`` graph)."""
        ...

    async def sweep(self, tenant: str, cutoff: datetime, batch: int) -> int:
        """Delete up to ``batch`` threads last written before ``cutoff`` (oldest first),
        whole; return how many went."""
        ...
