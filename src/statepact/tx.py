"""Coordination transactions: the ``StorageBackend`` protocol and the ``TransactionManager`` front.

A ``StorageBackend`` keeps keyed JSON values with MVCC history, resource
leases with fencing tokens, pessimistic locks and idempotency records. It is
deliberately thin: everything that can be decided before a request reaches a
server lives here, once, in :class:`TransactionManager` and
:class:`Transaction`: validation and JSON encoding (``statepact._codec``), the
idempotency fingerprint, read-your-own-writes buffering, the clock reading,
and retries with backoff (``statepact._retry.RetryPolicy``). A backing stores
what it is told and validates a commit in ONE atomic call; it never reads a
clock, never validates an id or a JSON value, and never retries a conflict.

Versions and sequences. Every backing keeps one global commit sequence,
starting at 0. A commit that writes gets ``sequence + 1``; that number is its
``CommitResult.version`` and the version of every key it wrote (a delete
writes a tombstone with that version). A key never written has version 0. A
read-only commit does not advance the sequence.

Two classes are called ``Lease`` in statepact: ``statepact.Lease`` (from
``statepact.models``) is a claim on a work item; :class:`statepact.tx.Lease`
here is a lease on a *resource*, whose ``token`` fences commits. The latter is
deliberately not exported at the top level; import it from ``statepact.tx``.

This module must never import a driver (redis, asyncpg, SQLAlchemy).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from statepact.clock import Clock

__all__ = [
    "CommitRequest",
    "CommitResult",
    "Isolation",
    "Lease",
    "LeaseRequest",
    "LockMode",
    "ReadRecord",
    "ResourceInfo",
    "StorageBackend",
    "StoredResource",
    "StoredValue",
    "StoredVersion",
    "VersionEntry",
    "WriteRecord",
]


# -- public models -------------------------------------------------------------


class Isolation(StrEnum):
    """How a transaction is validated at commit.

    - ``read_committed``: reads see the latest committed value; no read is
      validated; the writes still apply atomically. Never a dirty read or a
      dirty write (writes are buffered until commit), but lost updates happen.
    - ``snapshot``: reads see the snapshot taken at ``begin``; first committer
      wins: a written key whose latest version is above the snapshot refuses
      the commit with ``ConflictError``. Write skew is possible.
    - ``serializable``: snapshot validation plus full backward read
      validation: every key read (including keys read as absent) must still be
      at the version observed. Memory adds a serialization-graph audit.
    """

    READ_COMMITTED = "read_committed"
    SNAPSHOT = "snapshot"
    SERIALIZABLE = "serializable"


class LockMode(StrEnum):
    """Pessimistic lock modes: many ``shared`` holders, or one ``exclusive`` holder."""

    SHARED = "shared"
    EXCLUSIVE = "exclusive"


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What a commit did.

    ``version`` is the sequence number the commit's writes got; for a
    read-only commit (which does not advance the sequence) it is the snapshot
    sequence the transaction read at. ``replayed`` is ``True`` when the
    idempotency key had already committed the same request: this is the first
    result again, and nothing was applied.
    """

    version: int
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Lease:
    """A time-limited lease on a resource, held by ``owner``.

    ``token`` strictly increases per resource across every lease ever
    issued for it (release and expiry never reset it), so it can fence a
    commit: ``manager.transaction(fencing=lease)`` is refused with
    ``FencingError`` once a higher token has been issued. ``expires_at`` is
    read from the injected clock; ``ttl`` (seconds) is what a renewal extends by.
    """

    resource: str
    owner: str
    token: int
    expires_at: datetime
    ttl: float


@dataclass(frozen=True, slots=True)
class VersionEntry:
    """One committed version of a key, as ``history`` returns it (newest first).

    ``value`` is the decoded JSON value, or ``None`` for a delete (``deleted``).
    """

    version: int
    value: Any
    deleted: bool
    committed_at: datetime


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """A resource's registry entry.

    ``metadata`` is what ``register_resource`` stored (``{}`` for a resource
    only ever committed to); ``version`` is the last commit sequence that wrote
    to it (0 if none); ``last_commit_at`` that commit's time.
    """

    name: str
    metadata: dict[str, Any]
    version: int
    last_commit_at: datetime | None


# -- what crosses the backing boundary --------------------------------------------
#
# Every string a backing receives was checked by the front (non-empty, at most
# 1 KiB, no NUL); every ``data`` is compact JSON text with sorted object keys,
# already under the size limit. A backing stores it verbatim and hands it back
# verbatim.


@dataclass(frozen=True, slots=True)
class StoredValue:
    """A key as ``read`` found it: ``data`` is JSON text, ``None`` if absent or deleted.

    ``version`` is the version of the entry found: 0 for a key never written,
    the tombstone's version for a deleted key.
    """

    data: str | None
    version: int


@dataclass(frozen=True, slots=True)
class StoredVersion:
    """One history entry: ``data`` is ``None`` for a delete."""

    version: int
    data: str | None
    committed_at: datetime


@dataclass(frozen=True, slots=True)
class StoredResource:
    """A registry row: ``metadata`` is JSON text of an object."""

    name: str
    metadata: str
    version: int
    last_commit_at: datetime | None


@dataclass(frozen=True, slots=True)
class ReadRecord:
    """A key the transaction read from the backing and the version it observed (absent = 0)."""

    resource: str
    key: str
    version: int


@dataclass(frozen=True, slots=True)
class WriteRecord:
    """A buffered write: ``data`` is the JSON text to store, ``None`` to delete the key."""

    resource: str
    key: str
    data: str | None


@dataclass(frozen=True, slots=True)
class CommitRequest:
    """Everything one commit needs, validated in ONE atomic backing call.

    - ``txn_id``: the id passed to ``begin``.
    - ``isolation``: which validation to run (see :class:`Isolation`).
    - ``taken_at``: the snapshot sequence ``begin`` returned.
    - ``reads``: each key read from the backing (not from the transaction's
      own buffer), once, with the version first observed; sorted by
      ``(resource, key)``.
    - ``writes``: the final write per key, sorted by ``(resource, key)``;
      empty for a read-only commit.
    - ``idempotency_key`` / ``fingerprint``: both set or both ``None``.
      ``fingerprint`` is a hex SHA-256 over the canonical encoding of the
      write set (reads, isolation and fencing are not part of it, so a retry
      of the same change after a lost reply replays even if what it read
      has moved since).
    - ``fencing``: a lease whose ``token`` must not be below the highest token
      issued for ``fencing.resource``.
    - ``now``: the injected clock's time; ``committed_at`` of every version
      written and of the idempotency record.
    """

    txn_id: str
    isolation: Isolation
    taken_at: int
    reads: tuple[ReadRecord, ...]
    writes: tuple[WriteRecord, ...]
    idempotency_key: str | None
    fingerprint: str | None
    fencing: Lease | None
    now: datetime


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """A checked lease acquisition or renewal; ``expires_at = now + ttl`` is computed in front."""

    resource: str
    owner: str
    ttl: float
    now: datetime
    expires_at: datetime


# -- the protocol -------------------------------------------------------------------


@runtime_checkable
class StorageBackend(Protocol):
    """Keyed JSON values with MVCC history, leases, locks and idempotency.

    Implemented by ``MemoryBackend`` (the semantic reference), ``RedisBackend``
    and ``PostgresBackend``; checked by ``statepact.testing.tx_suite``.

    Common to every method:

    - Arguments were validated in front; a backing does not validate again.
    - Time: a backing never reads a clock (neither its own nor the server's
      ``TIME``/``now()``); every time it stores or compares arrives as a
      ``now`` argument taken from the injected clock. The one exception is a
      lock wait, which is a real elapsed wait (``timeout`` seconds).
    - Every method is safe to call concurrently from many tasks, and (for a
      server backing) from many processes.
    - Errors: driver exceptions never escape. A server that stayed
      unreachable past the failover budget raises
      ``StatePersistenceError(reason="unavailable")``; a pool with no free
      connection raises ``PoolExhaustedError`` at once. The specific errors
      each method raises on purpose are listed on the method.
    """

    #: The clock the backing was built with. The front reads it (a backing never does).
    clock: Clock

    #: ``True`` if ``lock`` detects wait-for cycles and raises ``DeadlockError``
    #: (memory); ``False`` if a cycle surfaces as ``LockTimeoutError`` (Redis, PostgreSQL).
    detects_deadlocks: bool

    async def begin(self, txn_id: str) -> int:
        """Start transaction ``txn_id``: return the current committed sequence and register it.

        The returned number is the snapshot's ``taken_at``. Registering it
        lets a backing that garbage-collects history (memory) keep every
        version the snapshot can still read until ``end(txn_id)``.
        """
        ...

    async def end(self, txn_id: str) -> None:
        """Finish ``txn_id`` (committed, failed or abandoned): release its snapshot and locks.

        Idempotent; ending an unknown transaction does nothing.
        """
        ...

    async def read(self, resource: str, key: str, at: int | None) -> StoredValue:
        """The newest committed version of the key at or before sequence ``at``.

        ``at=None`` reads the latest committed version. Never sees an
        uncommitted write. Raises ``ConflictError`` if the version the
        snapshot needs is no longer retained (a capped history: "snapshot
        too old"; retryable).
        """
        ...

    async def commit(self, request: CommitRequest) -> CommitResult:
        """Validate and apply a transaction, atomically, in one call.

        In this order, and with nothing applied unless every step passes:

        1. Fencing: if ``request.fencing`` is set and its token is below the
           highest token ever issued for ``fencing.resource``, raise
           ``FencingError``.
        2. Idempotency: if ``idempotency_key`` has a record, return its stored
           ``CommitResult`` with ``replayed=True`` when the fingerprints match,
           else raise ``IdempotencyConflictError``.
        3. Validation (``ConflictError`` naming the resource and key):
           ``snapshot`` and ``serializable``: any written key whose latest
           version is above ``taken_at`` refuses the commit (first committer
           wins). ``serializable`` also: any read key whose latest version is
           not the version recorded in ``reads`` refuses it (this covers keys
           read as absent, recorded as version 0). ``read_committed``: no
           validation. A backing may refuse more (memory's
           serialization-graph audit), never less.
        4. Apply: if there are writes, the sequence advances by one and every
           write gets that version, with ``committed_at=now``, in the current
           value and the history; each written resource's registry entry gets
           the version and time (created with ``{}`` metadata if absent).
           A read-only commit does not advance the sequence and returns
           ``CommitResult(taken_at)``.
        5. With an ``idempotency_key``, store ``(key, fingerprint, version)``
           in the same atomic step.

        Does not end the transaction: the front calls ``end`` afterwards.
        """
        ...

    async def lock(
        self,
        txn_id: str,
        resource: str,
        key: str,
        mode: LockMode,
        timeout: float | None,  # noqa: ASYNC109 - the wait budget is part of the request
    ) -> None:
        """Take a pessimistic lock on ``(resource, key)`` for ``txn_id`` until ``end(txn_id)``.

        Shared locks coexist; an exclusive lock excludes every other holder.
        Re-locking a key the transaction holds is a no-op; asking for
        exclusive while holding shared upgrades (waiting for other sharers).
        Locks are advisory among transactions that take them: they do not
        block commits of transactions that did not lock. ``timeout`` is a
        real elapsed wait in seconds (0 tries once); ``None`` means the
        backing's configured ``lock_timeout``. Raises ``LockTimeoutError``
        when not granted in time, ``DeadlockError`` when waiting would close
        a wait-for cycle (only if ``detects_deadlocks``; exactly one
        transaction of the cycle gets it).
        """
        ...

    async def acquire_lease(self, request: LeaseRequest) -> Lease | None:
        """Grant ``request.resource`` to ``request.owner`` with a new, strictly higher token.

        Granted when the resource has no lease, its lease expired
        (``expires_at <= now``), or the live lease is ``request.owner``'s own
        (a re-acquire: new token, new expiry). Returns ``None``, changing
        nothing, when another owner holds a live lease. The returned lease
        has ``expires_at=request.expires_at`` and ``ttl=request.ttl``.
        Atomic per resource: two concurrent acquisitions never both win.
        """
        ...

    async def renew_lease(self, lease: Lease, request: LeaseRequest) -> Lease:
        """Extend a live lease: same token, ``expires_at=request.expires_at``.

        Raises ``LeaseLostError`` (nothing changed) unless the resource's
        current lease has ``lease.token``, ``lease.owner`` and has not expired
        at ``request.now``.
        """
        ...

    async def release_lease(self, lease: Lease, now: datetime) -> bool:
        """Give a lease up; ``True`` if it was the current lease (by token) and is now gone.

        The token high-water mark is kept: the next acquisition gets a higher one.
        """
        ...

    async def history(self, resource: str, key: str, limit: int) -> list[StoredVersion]:
        """Up to ``limit`` retained versions of the key, newest first (deletes included).

        How many versions are retained is the backing's policy (memory:
        ``retain_versions`` plus what live snapshots need; Redis:
        ``history_limit``; PostgreSQL: all); the latest is always retained.
        """
        ...

    async def register_resource(self, name: str, metadata: str, now: datetime) -> None:
        """Create or update the resource's registry entry; ``metadata`` replaces the stored one."""
        ...

    async def resource_info(self, name: str) -> StoredResource | None:
        """The registry entry, or ``None`` for a resource never registered nor written."""
        ...

    async def health_check(self) -> bool:
        """``True`` when the backing answers a trivial request, else ``False``; never raises."""
        ...

    async def close(self) -> None:
        """Release connections; idempotent. The backing is unusable afterwards."""
        ...

    async def clear(self) -> None:
        """Remove every value, version, lease, token mark, lock and idempotency record.

        The sequence restarts at 0. A test and playground helper: it touches
        only this backing's own keys or tables.
        """
        ...
