"""``MemoryBackend``: the in-process ``StorageBackend``, and the reference for the other two.

A commit never awaits, so it is atomic in the event loop; each key keeps a
chain of versions that garbage collection trims to what live snapshots need,
locks go through the lock manager (``_locks.py``) and ``serializable`` commits
through the audit (``_serialization.py``): docs/backings.md#memory.

Nothing here is safe across processes or OS threads, reads a clock (times
arrive in the requests), or validates a caller's input (``statepact.tx`` did).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Self, TypedDict, Unpack

from statepact.clock import Clock
from statepact.errors import (
    LockTimeoutError,
)
from statepact.settings import MemoryStoreSettings
from statepact.storage.memory._locks import LockManager, Slot
from statepact.storage.memory._serialization import Footprint, SerializationGraph
from statepact.tx import (
    CommitRequest,
    CommitResult,
    Isolation,
    Lease,
    LeaseRequest,
    LockMode,
    Refusal,
    Snapshot,
    StoredResource,
    StoredValue,
    StoredVersion,
)

__all__ = ["MemoryBackend"]

_ABSENT = StoredValue(None, 0)
# Garbage collection is batched: the versions no snapshot needs any more are dropped once
# this many snapshot sequences were released, and a key's chain is trimmed at once when it
# grows this many versions past what it keeps (history() and retained_versions() collect
# first, so they show what a collection leaves). A batch visits each key written since the
# last one once, however often it was written: the longer the batch, the fewer visits per
# write, while the slack bounds what a key holds meanwhile.
_GC_EVERY = 256
_GC_SLACK = 32


_CURRENT = 2**63  # "not superseded yet"
# Read once: ``Isolation.X`` is a lookup through the enum's metaclass at every use.
_READ_COMMITTED = Isolation.READ_COMMITTED
_SERIALIZABLE = Isolation.SERIALIZABLE


@dataclass(slots=True)
class _Chain:
    """A key's retained versions, oldest first, in parallel lists.

    ``versions[i]`` is the version number of ``values[i]`` (what a read of it
    returns, made once when it is written) and ``times[i]`` its commit time;
    ``until[i]`` is the version that superseded it (``_CURRENT`` for the
    latest), so a read can tell a version GC removed from one that never
    existed; ``first`` is the key's first version ever.
    """

    first: int
    versions: list[int]
    values: list[StoredValue]
    times: list[datetime]
    until: list[int]

    @classmethod
    def of(cls, value: StoredValue, at: datetime) -> _Chain:
        return cls(value.version, [value.version], [value], [at], [_CURRENT])

    def append(self, value: StoredValue, at: datetime) -> None:
        self.until[-1] = value.version
        self.versions.append(value.version)
        self.values.append(value)
        self.times.append(at)
        self.until.append(_CURRENT)

    def drop_oldest(self, count: int) -> None:
        """Drop the oldest ``count`` versions, in place (what most collections do)."""
        del self.versions[:count]
        del self.values[:count]
        del self.times[:count]
        del self.until[:count]

    def keep(self, indexes: list[int]) -> None:
        """Retain only the versions at ``indexes`` (ascending)."""
        self.versions = [self.versions[i] for i in indexes]
        self.values = [self.values[i] for i in indexes]
        self.times = [self.times[i] for i in indexes]
        self.until = [self.until[i] for i in indexes]


class MemoryBackendOptions(TypedDict, total=False):
    """The keyword forms of ``MemoryStoreSettings``' transaction fields; ``None`` keeps the
    setting."""

    lock_timeout: float | None
    serialization_window: int | None
    retain_versions: int | None
    gc: bool | None


class MemoryBackend:
    """The in-process ``StorageBackend`` (see the module docstring).

    Built like every backing object: ``MemoryBackend(clock=, settings=)``, or
    ``await MemoryBackend.open(clock=, settings=)`` (nothing to check in
    process). ``settings`` is a ``MemoryStoreSettings``: ``lock_timeout`` is
    the default lock wait in seconds; ``serialization_window`` how many
    committed footprints the serializable audit looks back over;
    ``retain_versions`` keeps at least that many newest versions per key
    whatever the snapshots (for history and tests); ``gc=False`` keeps every
    version. Those four are accepted as keywords too
    (``MemoryBackend(lock_timeout=5.0, ...)``, see docs/backings.md), and win
    over ``settings``.
    ``clock`` is the clock a ``TransactionManager`` on this backend uses unless
    given one (else ``SystemClock``); never read here.
    """

    detects_deadlocks = True
    pins_snapshots = True
    #: No time-based retention: a version goes as soon as no live snapshot (nor
    #: ``retain_versions``) needs it, so no snapshot is ever refused as too old.
    history_retention: float | None = None
    in_process = True

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        settings: MemoryStoreSettings | None = None,
        **options: Unpack[MemoryBackendOptions],
    ) -> None:
        self._settings = (settings or MemoryStoreSettings()).replace(**options)
        self.clock: Clock | None = clock
        self.lock_timeout = self._settings.lock_timeout
        self.serialization_window = self._settings.serialization_window
        self.retain_versions = self._settings.retain_versions
        self.gc = self._settings.gc
        self._closed = False
        self._reset()

    @classmethod
    async def open(
        cls, *, clock: Clock | None = None, settings: MemoryStoreSettings | None = None
    ) -> Self:
        """A backend built as the constructor builds it: an in-process one has no server to
        check. The same call as the server backings' ``open()``."""
        return cls(clock=clock, settings=settings)

    @property
    def settings(self) -> MemoryStoreSettings:
        return self._settings

    def _reset(self) -> None:
        self._seq = 0
        self._chains: dict[Slot, _Chain] = {}
        # Keys holding more versions than retain_versions; released, not yet collected.
        self._prunable: set[Slot] = set()
        self._released = 0
        self._snapshots: dict[str, int] = {}
        # How many live snapshots hold each sequence.
        self._snapshot_counts: dict[int, int] = {}
        # The snapshot of the current sequence, shared by every transaction that takes it.
        self._current = Snapshot(0)
        self._idempotency: dict[str, tuple[str, CommitResult]] = {}
        self._fence: dict[str, int] = {}
        self._leases: dict[str, Lease] = {}
        # The registry: a resource's metadata, and its last writing commit (version, time).
        self._metadata: dict[str, str] = {}
        self._last_commit: dict[str, tuple[int, datetime]] = {}
        self._graph = SerializationGraph(self.serialization_window)
        self.locks = LockManager()

    def __repr__(self) -> str:
        return f"MemoryBackend(seq={self._seq}, keys={len(self._chains)})"

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("MemoryBackend: closed")

    # -- snapshots and reads ------------------------------------------------------------

    async def begin(self, txn_id: str) -> Snapshot:
        return self._pin(txn_id)

    async def begin_read(
        self, txn_id: str, resource: str, key: str
    ) -> tuple[Snapshot, StoredValue]:
        chain = self._chains.get((resource, key))
        return self._pin(txn_id), _ABSENT if chain is None else chain.values[-1]

    def _pin(self, txn_id: str) -> Snapshot:
        if self._closed:
            self._check_open()
        seq = self._seq
        snapshots = self._snapshots
        previous = snapshots.get(txn_id)
        if previous is not None:  # the same transaction again: keep one pin
            self._unpin(previous)
        snapshots[txn_id] = seq
        counts = self._snapshot_counts
        counts[seq] = counts.get(seq, 0) + 1
        current = self._current
        if current.sequence != seq:
            current = self._current = Snapshot(seq)
        return current

    async def end(self, txn_id: str) -> None:
        self.locks.release_all(txn_id)
        taken_at = self._snapshots.pop(txn_id, None)
        if taken_at is not None:
            self._unpin(taken_at)

    def _unpin(self, taken_at: int) -> None:
        counts = self._snapshot_counts
        left = counts[taken_at] - 1
        if left:
            counts[taken_at] = left
        else:
            del counts[taken_at]
            # A snapshot sequence nobody holds any more: its versions may go, in a batch.
            self._released += 1
            if self._released >= _GC_EVERY and self._prunable:
                self._collect_all()

    def _collect_all(self) -> None:
        self._released = 0
        self._collect(list(self._prunable))

    def _read_latest(self, resource: str, key: str) -> StoredValue:
        chain = self._chains.get((resource, key))
        return _ABSENT if chain is None else chain.values[-1]

    async def read(self, resource: str, key: str, at: Snapshot | None) -> StoredValue | Refusal:
        if self._closed:
            self._check_open()
        if at is None:
            return self._read_latest(resource, key)
        chain = self._chains.get((resource, key))
        if chain is None:
            return _ABSENT
        seq = at.sequence
        versions = chain.versions
        if versions[-1] <= seq:
            return chain.values[-1]
        if seq < chain.first:
            return _ABSENT
        index = bisect.bisect_right(versions, seq) - 1
        if index < 0 or chain.until[index] <= seq:
            return Refusal("too_old", resource, key, taken_at=seq, reason="garbage-collected")
        return chain.values[index]

    def _latest(self, slot: Slot) -> int:
        chain = self._chains.get(slot)
        return chain.versions[-1] if chain is not None else 0

    # -- commit ---------------------------------------------------------------------------

    async def commit(self, request: CommitRequest) -> CommitResult | Refusal:
        # Atomic in the event loop: nothing below awaits, so no other task runs between
        # the checks and the apply.
        if self._closed:
            self._check_open()
        if request.fencing is not None:
            fence = request.fencing
            highest = self._fence.get(fence.resource, 0)
            if fence.token < highest:
                return Refusal("fenced", fence.resource, seen=fence.token, latest=highest)
        if request.idempotency_key is not None:
            seen = self._idempotency.get(request.idempotency_key)
            if seen is not None:
                if seen[0] != request.fingerprint:
                    return Refusal("idempotency", key=request.idempotency_key)
                return replace(seen[1], replayed=True)
        snapshot = request.snapshot
        taken_at = self._seq if snapshot is None else snapshot.sequence
        if request.isolation is not _READ_COMMITTED:
            refusal = self._validate(request, taken_at)
            if refusal is not None:
                return refusal
        result = self._apply(request, taken_at)
        if request.idempotency_key is not None and request.fingerprint is not None:
            self._idempotency[request.idempotency_key] = (request.fingerprint, result)
        return result

    def _validate(self, request: CommitRequest, taken_at: int) -> Refusal | None:
        chains = self._chains
        for write in request.writes:
            chain = chains.get((write.resource, write.key))
            if chain is not None and chain.versions[-1] > taken_at:
                return Refusal(
                    "write", write.resource, write.key, latest=chain.versions[-1], taken_at=taken_at
                )
        if request.isolation is not _SERIALIZABLE:
            return None
        for read in request.reads:
            latest = self._latest((read.resource, read.key))
            if latest != read.version:
                return Refusal("read", read.resource, read.key, seen=read.version, latest=latest)
        if not request.writes:
            return None  # a read-only commit takes no place in the commit order
        # The audit: a second, independent check. Backward validation above already
        # leaves the candidate no edge to a retained commit, so this is not expected to
        # refuse; it re-derives serializability from the footprints instead of trusting it.
        candidate = Footprint.of(
            request.txn_id,
            self._seq + 1,
            request.reads,
            [(write.resource, write.key) for write in request.writes],
        )
        cycle = self._graph.cycle_through(candidate)
        if cycle is not None:
            return Refusal(
                "other",
                reason="serialization-graph audit: committing would close the dependency "
                "cycle " + " -> ".join([*cycle, cycle[0]]) + "; retry the transaction",
            )
        return None

    def _apply(self, request: CommitRequest, taken_at: int) -> CommitResult:
        writes = request.writes
        if not writes:
            return CommitResult(taken_at)
        seq = self._seq = self._seq + 1
        now = request.now
        chains = self._chains
        last_commit = self._last_commit
        mark = (seq, now)
        floor = self.retain_versions or 1
        written: list[Slot] = []
        for write in writes:
            slot = (write.resource, write.key)
            value = StoredValue(write.data, seq)
            chain = chains.get(slot)
            if chain is None:
                chains[slot] = _Chain.of(value, now)  # one version: nothing to collect
            else:
                chain.append(value, now)
                # A key is prunable exactly while it holds more than ``floor`` versions
                # (a collection leaves it so): it joins the set when it first passes it.
                length = len(chain.versions)
                if length == floor + 1:
                    self._prunable.add(slot)
                elif length > floor + _GC_SLACK:
                    self._collect((slot,))
            written.append(slot)
            last_commit[write.resource] = mark
        # Every writing commit is retained for the audit, whatever its isolation: a
        # serializable commit's cycle may run through any of them.
        self._graph.add_commit(request.txn_id, seq, request.reads, written)
        return CommitResult(seq)

    # -- garbage collection ---------------------------------------------------------------

    async def prune_history(self, cutoff: datetime, batch: int) -> int:
        """Collect now what the batched collection has pending; how many versions went.
        ``cutoff`` plays no part: live snapshots pin what they need (``pins_snapshots``)."""
        before = sum(len(chain.versions) for chain in self._chains.values())
        self._collect_all()
        return before - sum(len(chain.versions) for chain in self._chains.values())

    def _collect(self, slots: Iterable[Slot]) -> None:
        """Drop versions of ``slots`` that neither a live snapshot nor retention needs."""
        if not self.gc:
            return
        live = sorted(self._snapshot_counts)
        floor = self.retain_versions or 1
        for slot in slots:
            chain = self._chains.get(slot)
            if chain is None:
                continue
            versions = chain.versions
            if len(versions) <= floor:
                self._prunable.discard(slot)
                continue
            if not live or live[0] >= versions[-floor]:
                # No snapshot is older than the versions retention keeps: only they stay.
                chain.drop_oldest(len(versions) - floor)
                self._prunable.discard(slot)
                continue
            keep = set(range(len(versions) - floor, len(versions)))
            for taken_at in live:
                index = bisect.bisect_right(versions, taken_at) - 1
                if index >= 0:
                    keep.add(index)
            if len(keep) < len(versions):
                chain.keep(sorted(keep))
            if len(chain.versions) > floor:
                self._prunable.add(slot)  # a live snapshot still pins an old version
            else:
                self._prunable.discard(slot)

    # -- locks ------------------------------------------------------------------------------

    async def try_lock(
        self, txn_id: str, resource: str, key: str, mode: LockMode, wait: float
    ) -> bool:
        self._check_open()
        try:
            await self.locks.acquire(txn_id, (resource, key), mode, wait)
        except LockTimeoutError:
            return False
        return True

    # -- leases -----------------------------------------------------------------------------

    async def acquire_lease(self, request: LeaseRequest) -> Lease | None:
        self._check_open()
        current = self._leases.get(request.resource)
        if (
            current is not None
            and current.expires_at > request.now
            and current.owner != request.owner
        ):
            return None
        token = self._fence.get(request.resource, 0) + 1
        self._fence[request.resource] = token
        lease = Lease(
            resource=request.resource,
            owner=request.owner,
            token=token,
            expires_at=request.expires_at,
            ttl=request.ttl,
        )
        self._leases[request.resource] = lease
        return lease

    async def renew_lease(self, lease: Lease, request: LeaseRequest) -> Lease | None:
        self._check_open()
        current = self._leases.get(lease.resource)
        if (
            current is None
            or current.token != lease.token
            or current.owner != lease.owner
            or current.expires_at <= request.now
        ):
            return None
        renewed = replace(current, expires_at=request.expires_at, ttl=request.ttl)
        self._leases[lease.resource] = renewed
        return renewed

    async def release_lease(self, lease: Lease, now: datetime) -> bool:
        self._check_open()
        current = self._leases.get(lease.resource)
        if current is None or current.token != lease.token:
            return False
        del self._leases[lease.resource]
        return True

    # -- history, registry, operations --------------------------------------------------------

    async def history(self, resource: str, key: str, limit: int) -> list[StoredVersion]:
        self._check_open()
        if self._prunable:
            self._collect_all()  # what is retained is what GC leaves, batched or not
        chain = self._chains.get((resource, key))
        if chain is None:
            return []
        newest = len(chain.versions) - 1
        return [
            StoredVersion(chain.versions[i], chain.values[i].data, chain.times[i])
            for i in range(newest, max(newest - limit, -1), -1)
        ]

    async def register_resource(self, name: str, metadata: str, now: datetime) -> None:
        self._check_open()
        self._metadata[name] = metadata

    async def resource_info(self, name: str) -> StoredResource | None:
        self._check_open()
        metadata = self._metadata.get(name)
        last = self._last_commit.get(name)
        if metadata is None and last is None:
            return None
        return StoredResource(
            name=name,
            metadata="{}" if metadata is None else metadata,
            version=0 if last is None else last[0],
            last_commit_at=None if last is None else last[1],
        )

    async def health_check(self) -> bool:
        return not self._closed

    async def close(self) -> None:
        self._closed = True

    async def clear(self) -> None:
        self._check_open()
        self._reset()

    # -- introspection for tests ------------------------------------------------------------

    @property
    def serialization_graph(self) -> SerializationGraph:
        """The audit's window of committed footprints, with its statistics."""
        return self._graph

    @property
    def sequence(self) -> int:
        """The current committed sequence."""
        return self._seq

    def retained_versions(self, resource: str, key: str) -> list[int]:
        """The versions of a key still held in memory, oldest first."""
        if self._prunable:
            self._collect_all()
        chain = self._chains.get((resource, key))
        return [] if chain is None else list(chain.versions)
