"""``StatepactCheckpointSaver``: LangGraph's ``BaseCheckpointSaver`` on a statepact ``Backing``.

The framework-facing half: it reads LangGraph's configs, validates every id
once, serializes with the saver's serde (LangGraph's ``JsonPlusSerializer`` by
default), checks each value against ``max_value_bytes`` before anything is sent
and reads the injected clock; then one call of its ``CheckpointStore``
(``_store.py``) does the storing, on memory, Redis or PostgreSQL alike.
Set-up, costs, retention and the Redis layout: docs/agent-frameworks.md.

This module must never import a driver or a backing's module at import time:
the store of the backing it is given is imported when ``open()`` meets it.
"""

from __future__ import annotations

import random
import sys
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, NoReturn, Self

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from statepact._codec import (
    check_size,
    decode_json,
    plain_json,
    require_id,
    require_limit,
    require_seconds,
)
from statepact.clock import Clock, read_clock
from statepact.integrations.langgraph._configs import (
    config_for,
    configurable_of,
    ids_of,
    limit_of,
    mapping_of,
    namespace_of,
    thread_id_of,
    version_text,
)
from statepact.integrations.langgraph._store import (
    Blob,
    CheckpointRow,
    CheckpointStore,
    ListQuery,
    Position,
    StoredCheckpoint,
    WriteRow,
)
from statepact.storage import Backing

__all__ = ["PRUNE_STRATEGIES", "StatepactCheckpointSaver"]

#: What ``aprune`` accepts as ``strategy``.
PRUNE_STRATEGIES = ("keep_latest", "delete")
#: Checkpoints read per round trip while ``alist`` walks a listing with no ``limit``.
_PAGE = 100
#: The most threads one round trip of ``sweep`` deletes.
_MAX_SWEEP_BATCH = 1000

_EMPTY = "empty"

# One memory store per memory Backing, so every saver opened on it sees the same threads.
_MEMORY_STORES: weakref.WeakKeyDictionary[Backing[Any, Any, Any], CheckpointStore] = (
    weakref.WeakKeyDictionary()
)


class StatepactCheckpointSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoints on memory, Redis or PostgreSQL; build it with :meth:`open`.

    Every call is asynchronous (``aput``, ``aget_tuple``, ``alist``, ...): run
    graphs with ``ainvoke``/``astream``. The synchronous methods raise
    ``NotImplementedError`` naming the async method to call instead: statepact
    does all I/O on the event loop, and a synchronous call made there would block
    the loop it needs.

    One saver serves one ``tenant`` (the Redis hash tag and the first column of
    every PostgreSQL key): LangGraph's ``thread_id`` and ``checkpoint_ns`` live
    inside it, so two tenants' threads of the same id never meet.
    :meth:`for_tenant` gives a saver of another tenant on the same store.
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        tenant: str = "default",
        clock: Clock,
        max_value_bytes: int,
        ttl: float | timedelta | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self._store = store
        self._tenant = require_id("tenant", tenant)
        self._clock = clock
        self._max_value_bytes = max_value_bytes
        self._ttl = None if ttl is None else timedelta(seconds=require_seconds("ttl", ttl))

    @classmethod
    async def open(
        cls,
        backing: Backing[Any, Any, Any],
        *,
        tenant: str = "default",
        ttl: float | timedelta | None = None,
        serde: SerializerProtocol | None = None,
    ) -> Self:
        """A saver on ``backing`` (from a backing package's ``open_backing``), for ``tenant``.

        It uses the backing's client, clock and settings (``max_value_bytes``, the
        failover budget, the Redis ``namespace``). On PostgreSQL its tables must
        exist: they come with statepact's Alembic revisions (``alembic upgrade head``
        or ``statepact db upgrade``), never from the saver; without them this raises
        ``SchemaVersionError``. ``ttl`` (seconds or a ``timedelta``) is how long a
        thread is kept after its last checkpoint, for :meth:`sweep`; ``serde`` is
        LangGraph's serializer (default ``JsonPlusSerializer``).
        """
        tenant = require_id("tenant", tenant)
        store = await _open_store(backing)
        await store.check()
        settings = backing.backend.settings
        return cls(
            store,
            tenant=tenant,
            clock=backing.state.clock,
            max_value_bytes=settings.max_value_bytes,
            ttl=ttl,
            serde=serde,
        )

    @property
    def tenant(self) -> str:
        return self._tenant

    @property
    def ttl(self) -> timedelta | None:
        return self._ttl

    def for_tenant(self, tenant: str) -> StatepactCheckpointSaver:
        """A saver of ``tenant`` on this saver's store, clock, serde and ``ttl``."""
        return StatepactCheckpointSaver(
            self._store,
            tenant=tenant,
            clock=self._clock,
            max_value_bytes=self._max_value_bytes,
            ttl=self._ttl,
            serde=self.serde,
        )

    def __repr__(self) -> str:
        return f"StatepactCheckpointSaver(tenant={self._tenant!r}, store={self._store!r})"

    # -- writing -------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` as the child of the config's ``checkpoint_id`` (if any):
        its metadata, and one blob per channel in ``new_versions`` (the other channels'
        values are the blobs of earlier checkpoints)."""
        configurable = configurable_of(config)
        thread_id = thread_id_of(configurable.get("thread_id"))
        checkpoint_ns = namespace_of(configurable.get("checkpoint_ns", ""))
        parent = configurable.get("checkpoint_id")
        parent_id = None if parent is None else require_id("config checkpoint_id", parent)
        if not isinstance(checkpoint, Mapping):
            raise TypeError(f"checkpoint: must be a Checkpoint dict, got {type(checkpoint)}")
        checkpoint_id = require_id("checkpoint id", checkpoint.get("id"))
        where = self._where(thread_id, checkpoint_id)
        values = mapping_of("checkpoint channel_values", checkpoint.get("channel_values", {}))
        versions = mapping_of("checkpoint channel_versions", checkpoint.get("channel_versions", {}))
        blobs = []
        for channel, version in mapping_of("new_versions", new_versions).items():
            name = require_id("new_versions channel", channel)
            kind, data = (
                self.serde.dumps_typed(values[channel]) if channel in values else (_EMPTY, b"")
            )
            self._check(f"the value of channel {name!r}", data, where)
            blobs.append(Blob(name, version_text(version), kind, data))
        skeleton = {key: value for key, value in checkpoint.items() if key != "channel_values"}
        kind, data = self.serde.dumps_typed(skeleton)
        self._check("the checkpoint", data, where)
        plain, encoded = plain_json(
            "metadata", get_serializable_checkpoint_metadata(config, metadata)
        )
        self._check("the metadata", encoded, where)
        run_id = plain.get("run_id")
        await self._store.put(
            self._tenant,
            CheckpointRow(
                thread_id=thread_id,
                checkpoint_ns=checkpoint_ns,
                checkpoint_id=checkpoint_id,
                parent_id=parent_id,
                kind=kind,
                data=data,
                metadata=encoded,
                run_id=run_id if isinstance(run_id, str) and run_id else None,
                versions=tuple(
                    (require_id("channel_versions channel", channel), version_text(version))
                    for channel, version in versions.items()
                ),
                blobs=tuple(blobs),
                at=read_clock(self._clock),
            ),
        )
        return config_for(thread_id, checkpoint_ns, checkpoint_id)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes on the config's checkpoint. Idempotent: a write
        whose ``(task_id, index)`` is stored is kept, except the special channels
        (errors, interrupts, resumes), whose latest write wins."""
        configurable = configurable_of(config)
        thread_id = thread_id_of(configurable.get("thread_id"))
        checkpoint_ns = namespace_of(configurable.get("checkpoint_ns", ""))
        checkpoint_id = require_id("config checkpoint_id", configurable.get("checkpoint_id"))
        task_id = require_id("task_id", task_id)
        task_path = namespace_of(task_path, field="task_path")
        where = self._where(thread_id, checkpoint_id)
        rows: dict[int, WriteRow] = {}
        for index, write in enumerate(writes):
            channel, value = write
            channel = require_id("writes channel", channel)
            kind, data = self.serde.dumps_typed(value)
            self._check(f"the write of task {task_id!r} to {channel!r}", data, where)
            # Two writes of one special channel in a call share its index: the last wins.
            idx = WRITES_IDX_MAP.get(channel, index)
            rows[idx] = WriteRow(task_id, idx, channel, kind, data, task_path)
        if rows:
            await self._store.put_writes(
                self._tenant, thread_id, checkpoint_ns, checkpoint_id, list(rows.values())
            )

    # -- reading -------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The config's checkpoint (its ``checkpoint_id``, else the namespace's newest),
        with its values, metadata, parent and pending writes; None if there is none."""
        configurable = configurable_of(config)
        thread_id = thread_id_of(configurable.get("thread_id"))
        checkpoint_ns = namespace_of(configurable.get("checkpoint_ns", ""))
        wanted = configurable.get("checkpoint_id")
        checkpoint_id = None if wanted is None else require_id("config checkpoint_id", wanted)
        stored = await self._store.get(self._tenant, thread_id, checkpoint_ns, checkpoint_id)
        return None if stored is None else self._tuple(stored)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """The tenant's checkpoints, newest first: of the config's thread (and namespace,
        when it names one; and only its ``checkpoint_id``, when it names one), or of
        every thread when ``config`` is None; ``filter``: only those whose metadata
        contains it (JSON containment, PostgreSQL's ``@>``); ``before``: only those with
        an id below its ``checkpoint_id``; at most ``limit``. Read a page at a time."""
        query = self._query(config, filter, before)
        remaining = limit_of(limit)
        below: Position | None = None
        while remaining is None or remaining > 0:
            size = _PAGE if remaining is None else min(remaining, _PAGE)
            page = await self._store.page(
                self._tenant, ListQuery(**{**query, "below": below, "limit": size})
            )
            for stored in page:
                yield self._tuple(stored)
            if len(page) < size:
                return
            last = page[-1]
            below = Position(last.checkpoint_id, last.thread_id, last.checkpoint_ns)
            if remaining is not None:
                remaining -= len(page)

    def _query(
        self,
        config: RunnableConfig | None,
        filter: Mapping[str, Any] | None,
        before: RunnableConfig | None,
    ) -> dict[str, Any]:
        thread_id = checkpoint_ns = checkpoint_id = None
        if config is not None:
            configurable = configurable_of(config)
            thread_id = thread_id_of(configurable.get("thread_id"))
            ns = configurable.get("checkpoint_ns")
            checkpoint_ns = None if ns is None else namespace_of(ns)
            wanted = configurable.get("checkpoint_id")
            checkpoint_id = None if wanted is None else require_id("config checkpoint_id", wanted)
        before_id = None
        if before is not None:
            bound = configurable_of(before, field="before").get("checkpoint_id")
            before_id = None if bound is None else require_id("before checkpoint_id", bound)
        metadata: Any = None
        encoded = None
        if filter is not None:
            if not isinstance(filter, Mapping):
                raise TypeError(f"filter: must be a dict, got {type(filter).__name__}")
            if filter:
                metadata, encoded = plain_json("filter", filter, sort_keys=True)
        return {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
            "before": before_id,
            "metadata": metadata,
            "metadata_json": encoded,
        }

    # -- deleting and copying -------------------------------------------------

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, blob and write of the thread, in every namespace."""
        await self._store.delete_thread(self._tenant, thread_id_of(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints written by these runs (their metadata's ``run_id``), their
        writes, and the blobs no other checkpoint of their namespace uses."""
        runs = ids_of("run_ids", run_ids)
        if runs:
            await self._store.delete_for_runs(self._tenant, runs)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, blob and write of one thread onto another (same ids,
        same parents, every namespace); the target's own checkpoints of the same ids are
        replaced."""
        source = thread_id_of(source_thread_id, field="source_thread_id")
        target = thread_id_of(target_thread_id, field="target_thread_id")
        if source != target:
            await self._store.copy_thread(self._tenant, source, target, read_clock(self._clock))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: keep each namespace's newest checkpoint (and its writes) of
        every thread named, delete the rest; ``"delete"``: delete the threads.

        ``keep_latest`` refuses (``NotImplementedError``, nothing deleted) a thread
        whose graph uses a ``DeltaChannel``: its newest checkpoint needs the
        ancestors back to the channel's last snapshot.
        """
        if strategy not in PRUNE_STRATEGIES:
            raise ValueError(f"strategy: must be one of {PRUNE_STRATEGIES}, got {strategy!r}")
        threads = ids_of("thread_ids", thread_ids, convert=thread_id_of)
        if not threads:
            return
        keep_latest = strategy == "keep_latest"
        if keep_latest:
            delta = await self._store.uses_delta_channels(self._tenant, threads)
            if delta:
                raise NotImplementedError(
                    "strategy: keep_latest cannot prune threads whose graph uses a "
                    f"DeltaChannel ({', '.join(sorted(delta))}); nothing was deleted"
                )
        await self._store.prune(self._tenant, threads, keep_latest=keep_latest)

    async def sweep(self, *, older_than: float | timedelta | None = None, batch: int = 100) -> int:
        """Delete the tenant's threads whose last checkpoint was written more than
        ``older_than`` ago (default: the saver's ``ttl``), by the injected clock, oldest
        first, ``batch`` threads per round trip, until none is left; return how many.

        Call it on an interval (a periodic job of a ``Worker``, a cron): it holds no
        lock, and two sweeps at once delete each thread once.
        """
        age = (
            self._ttl
            if older_than is None
            else timedelta(seconds=require_seconds("older_than", older_than))
        )
        if age is None:
            raise ValueError("older_than: give an age, or open the saver with ttl=")
        size = require_limit(batch, _MAX_SWEEP_BATCH)
        cutoff = read_clock(self._clock) - age
        total = 0
        while True:
            deleted = await self._store.sweep(self._tenant, cutoff, size)
            total += deleted
            if deleted < size:
                return total

    # -- versions --------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A zero-padded counter, then a random fraction: versions sort as strings, and two
        forks of one checkpoint that write the same channel write different blobs."""
        if current is None:
            count = 0
        elif isinstance(current, int):
            count = current
        else:
            count = int(str(current).split(".", 1)[0])
        return f"{count + 1:032d}.{random.random():.16f}"

    # -- the synchronous interface: refused ----------------------------------

    def get_tuple(self, config: RunnableConfig) -> NoReturn:
        _sync_refused("get_tuple")

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        _sync_refused("list")

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> NoReturn:
        _sync_refused("put")

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> NoReturn:
        _sync_refused("put_writes")

    def delete_thread(self, thread_id: str) -> NoReturn:
        _sync_refused("delete_thread")

    def delete_for_runs(self, run_ids: Sequence[str]) -> NoReturn:
        _sync_refused("delete_for_runs")

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> NoReturn:
        _sync_refused("copy_thread")

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> NoReturn:
        _sync_refused("prune")

    # -- helpers ---------------------------------------------------------------

    def _where(self, thread_id: str, checkpoint_id: str) -> str:
        return f"checkpoint {checkpoint_id!r} of thread {thread_id!r} (tenant {self._tenant!r})"

    def _check(self, what: str, data: bytes, where: str) -> None:
        check_size(what, len(data), self._max_value_bytes, where=where)

    def _tuple(self, stored: StoredCheckpoint) -> CheckpointTuple:
        loads = self.serde.loads_typed
        checkpoint = loads((stored.kind, stored.data))
        checkpoint["channel_values"] = {
            channel: loads((kind, data)) for channel, kind, data in stored.values if kind != _EMPTY
        }
        writes = sorted(stored.writes, key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
        return CheckpointTuple(
            config=config_for(stored.thread_id, stored.checkpoint_ns, stored.checkpoint_id),
            checkpoint=checkpoint,
            metadata=decode_json(stored.metadata),
            parent_config=(
                None
                if stored.parent_id is None
                else config_for(stored.thread_id, stored.checkpoint_ns, stored.parent_id)
            ),
            pending_writes=[(w.task_id, w.channel, loads((w.kind, w.data))) for w in writes],
        )


def _sync_refused(method: str) -> NoReturn:
    raise NotImplementedError(
        f"StatepactCheckpointSaver.{method}: the saver is asynchronous; call "
        f"`await saver.a{method}(...)`, and run graphs with ainvoke/astream"
    )


async def _open_store(backing: Backing[Any, Any, Any]) -> CheckpointStore:
    """The store of ``backing``'s kind, found by the class of its state store; only that
    backing's module (already imported by whoever opened the backing) is loaded."""
    state = backing.state
    memory = sys.modules.get("statepact.storage.memory")
    if memory is not None and isinstance(state, memory.MemoryStateStore):
        from statepact.integrations.langgraph._memory import MemoryCheckpointStore

        store = _MEMORY_STORES.get(backing)
        if store is None:
            store = _MEMORY_STORES[backing] = MemoryCheckpointStore()
        return store
    redis = sys.modules.get("statepact.storage.redis")
    if redis is not None and isinstance(state, redis.RedisStateStore):
        from statepact.integrations.langgraph._redis import RedisCheckpointStore

        return RedisCheckpointStore(backing.client, settings=backing.backend.settings)
    postgres = sys.modules.get("statepact.storage.postgres")
    if postgres is not None and isinstance(state, postgres.PostgresStateStore):
        from statepact.integrations.langgraph._postgres import PostgresCheckpointStore

        return PostgresCheckpointStore(backing.client, settings=backing.backend.settings)
    raise TypeError(
        "backing: must be a Backing from statepact.storage.memory, .redis or .postgres "
        f"open_backing, got one whose state store is a {type(state).__name__}"
    )
