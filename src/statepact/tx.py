"""Coordination transactions: the ``StorageBackend`` protocol and the ``TransactionManager`` front.

Everything that can be decided before a request reaches a server lives here,
once: validation and encoding, the idempotency fingerprint, read-your-own-writes
buffering, the clock, the lock wait and retries with backoff. A backing stores
what it is told and validates a commit in ONE atomic call; it never reads a
clock, validates an id or a JSON value, or retries a conflict. Versions and the
two ``Lease`` classes: docs/transactions.md; what is logged:
docs/observability.md.

This module must never import a driver (redis, asyncpg, SQLAlchemy) or a backing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from types import TracebackType
from typing import Any, Protocol, TypeVar, runtime_checkable

from statepact import _observe
from statepact._cancel import finish
from statepact._codec import (
    check_size,
    decode_json,
    encode_json,
    encode_json_value,
    require_id,
    require_limit,
    require_seconds,
    utf8_size,
)
from statepact._limits import DEFAULT_MAX_VALUE_BYTES, MAX_HISTORY, PRUNE_BATCH
from statepact._retry import RetryPolicy, UniqueIds
from statepact._turns import HOLD_FOR, KeyTurns, Turn
from statepact.clock import Clock, SystemClock, read_clock
from statepact.errors import (
    ConflictError,
    DeadlockError,
    FencingError,
    LeaseLostError,
    LockTimeoutError,
    StatepactError,
)

__all__ = [
    "CommitRequest",
    "CommitResult",
    "Isolation",
    "Lease",
    "LeaseRequest",
    "LockMode",
    "ReadRecord",
    "ResourceInfo",
    "Snapshot",
    "StorageBackend",
    "StoredResource",
    "StoredValue",
    "StoredVersion",
    "Transaction",
    "TransactionManager",
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


@dataclass(frozen=True, slots=True, init=False)
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

    def __init__(self, version: int, replayed: bool = False) -> None:
        # Set through the slots: half the cost of the generated __init__ (see CommitRequest).
        _RESULT_SLOTS[0](self, version)
        _RESULT_SLOTS[1](self, replayed)


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


@dataclass(frozen=True, slots=True, init=False)
class StoredValue:
    """A key as ``read`` found it: ``data`` is JSON text, ``None`` if absent or deleted.

    ``version`` is the version of the entry found: 0 for a key never written,
    the tombstone's version for a deleted key.
    """

    data: str | None
    version: int

    def __init__(self, data: str | None, version: int) -> None:
        # Set through the slots: half the cost of the generated __init__ (see CommitRequest).
        _VALUE_SLOTS[0](self, data)
        _VALUE_SLOTS[1](self, version)


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


@dataclass(frozen=True, slots=True, init=False)
class Snapshot:
    """A transaction's snapshot, as the backing took it (``begin`` or ``begin_read``).

    ``sequence`` is the committed sequence at the snapshot: the transaction's
    ``taken_at`` and the version a read-only commit reports. ``token`` is what
    else the backing needs to read at the snapshot and to validate a commit
    against it (PostgreSQL: the server's own MVCC snapshot); ``None`` where the
    sequence says it all (memory, Redis). The front hands it back verbatim.
    """

    sequence: int
    token: str | None = None

    def __init__(self, sequence: int, token: str | None = None) -> None:
        # Set through the slots: half the cost of the generated __init__ (see CommitRequest).
        _SNAPSHOT_SLOTS[0](self, sequence)
        _SNAPSHOT_SLOTS[1](self, token)


@dataclass(frozen=True, slots=True, init=False)
class ReadRecord:
    """A key the transaction read from the backing and the version it observed (absent = 0)."""

    resource: str
    key: str
    version: int

    def __init__(self, resource: str, key: str, version: int) -> None:
        # Set through the slots: half the cost of the generated __init__ (see CommitRequest).
        _READ_SLOTS[0](self, resource)
        _READ_SLOTS[1](self, key)
        _READ_SLOTS[2](self, version)


@dataclass(frozen=True, slots=True, init=False)
class WriteRecord:
    """A buffered write: ``data`` is the JSON text to store, ``None`` to delete the key."""

    resource: str
    key: str
    data: str | None

    def __init__(self, resource: str, key: str, data: str | None) -> None:
        # Set through the slots: half the cost of the generated __init__ (see CommitRequest).
        _WRITE_SLOTS[0](self, resource)
        _WRITE_SLOTS[1](self, key)
        _WRITE_SLOTS[2](self, data)


@dataclass(frozen=True, slots=True, init=False)
class CommitRequest:
    """Everything one commit needs, validated in ONE atomic backing call.

    - ``txn_id``: the transaction's id (the one ``begin``/``begin_read`` got, if
      it took a snapshot).
    - ``isolation``: which validation to run (see :class:`Isolation`).
    - ``snapshot``: what ``begin``/``begin_read`` returned, or ``None`` for a
      transaction that read nothing: its snapshot is then the commit point
      itself (nothing it could have read has moved), so no write can conflict.
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
    snapshot: Snapshot | None
    reads: tuple[ReadRecord, ...]
    writes: tuple[WriteRecord, ...]
    idempotency_key: str | None
    fingerprint: str | None
    fencing: Lease | None
    now: datetime

    def __init__(  # noqa: PLR0917 - the generated __init__'s signature, fields in order
        self,
        txn_id: str,
        isolation: Isolation,
        snapshot: Snapshot | None,
        reads: tuple[ReadRecord, ...],
        writes: tuple[WriteRecord, ...],
        idempotency_key: str | None,
        fingerprint: str | None,
        fencing: Lease | None,
        now: datetime,
    ) -> None:
        # What the generated __init__ does, at half its cost (one request per commit):
        # it sets each field through object.__setattr__, this through the slot itself.
        # The records made on every transaction (this one, ``CommitResult``,
        # ``Snapshot``, ``StoredValue``, ``ReadRecord``, ``WriteRecord``) do the same.
        put = _REQUEST_SLOTS
        put[0](self, txn_id)
        put[1](self, isolation)
        put[2](self, snapshot)
        put[3](self, reads)
        put[4](self, writes)
        put[5](self, idempotency_key)
        put[6](self, fingerprint)
        put[7](self, fencing)
        put[8](self, now)

    @property
    def taken_at(self) -> int | None:
        """The snapshot's sequence, ``None`` when the snapshot is the commit point."""
        return None if self.snapshot is None else self.snapshot.sequence


def _slot_setters(cls: type) -> tuple[Callable[[Any, Any], None], ...]:
    """The setters of a slotted dataclass's fields, in field order."""
    return tuple(vars(cls)[field.name].__set__ for field in fields(cls))


_RESULT_SLOTS = _slot_setters(CommitResult)
_VALUE_SLOTS = _slot_setters(StoredValue)
_SNAPSHOT_SLOTS = _slot_setters(Snapshot)
_READ_SLOTS = _slot_setters(ReadRecord)
_WRITE_SLOTS = _slot_setters(WriteRecord)
_REQUEST_SLOTS = _slot_setters(CommitRequest)


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
    - Time: a backing never reads a clock of its own; every time it stores or
      compares (lease expiry, commit times) arrives as a ``now`` argument taken
      from the injected clock. The exceptions are the lock wait, a real
      elapsed wait (``timeout`` seconds), and a lock's TTL, which the server
      measures (see ``lock``).
    - Every method is safe to call concurrently from many tasks, and (for a
      server backing) from many processes.
    - Errors: driver exceptions never escape. A server that stayed
      unreachable past the failover budget raises
      ``StatePersistenceError(reason="unavailable")``; a pool with no free
      connection raises ``PoolExhaustedError`` at once. The specific errors
      each method raises on purpose are listed on the method.
    """

    #: The clock the backing was built with, if any: ``TransactionManager`` uses it when
    #: it is given none (then ``SystemClock``). A backing never reads it.
    clock: Clock | None

    #: ``True`` if ``try_lock`` detects wait-for cycles and raises ``DeadlockError``
    #: (memory); ``False`` if a cycle surfaces as ``LockTimeoutError`` (Redis, PostgreSQL).
    detects_deadlocks: bool

    #: The lock wait, in seconds, of a ``Transaction.lock`` given no ``timeout``.
    lock_timeout: float

    #: ``True`` if the backing keeps versions for a snapshot until ``end(txn_id)``
    #: (memory's garbage collection); the front then always ends a transaction that
    #: called ``begin`` or ``begin_read``. ``False``: ``end`` only releases locks.
    pins_snapshots: bool

    #: Seconds: ``prune_history`` drops the versions superseded by one committed longer
    #: ago than this, and a read at a snapshot that needed one raises ``ConflictError``
    #: ("snapshot too old"). ``None``: no time-based retention (memory, whose live
    #: snapshots pin what they need). Read with ``getattr`` (default ``None``).
    history_retention: float | None

    #: ``True`` if the backing runs in this process and every call but ``try_lock``
    #: completes without suspending (memory): a cancellation can never arrive in the
    #: middle of one, so the front awaits them directly instead of shielding them.
    #: ``TransactionManager`` reads this and ``pins_snapshots`` once, when it is built.
    in_process: bool

    async def begin(self, txn_id: str) -> Snapshot:
        """Take a snapshot for transaction ``txn_id``: the current committed state.

        Its ``sequence`` is the snapshot's ``taken_at``. A backing that
        garbage-collects history (``pins_snapshots``) registers it and keeps
        every version it can still read until ``end(txn_id)``. Used by
        ``manager.begin()`` and by a transaction that commits without reading.
        """
        ...

    async def begin_read(
        self, txn_id: str, resource: str, key: str
    ) -> tuple[Snapshot, StoredValue]:
        """``begin`` and a read of the key at that snapshot, in one call (one round trip).

        A transaction takes its snapshot at its first read: a read-only
        transaction is then one request, a read-modify-write two.
        """
        ...

    async def end(self, txn_id: str) -> None:
        """Finish ``txn_id`` (committed, failed or abandoned): release its snapshot and locks.

        Idempotent; ending an unknown transaction does nothing. The front calls
        it when the transaction asked for a lock, or took a snapshot on a
        backing that ``pins_snapshots``.
        """
        ...

    async def read(self, resource: str, key: str, at: Snapshot | None) -> StoredValue:
        """The newest committed version of the key visible at snapshot ``at``.

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
           ``snapshot`` and ``serializable``: any written key with a version
           committed after the snapshot refuses the commit (first committer
           wins; nothing to check when ``snapshot`` is ``None``).
           ``serializable`` also: any read key whose latest version is not
           the version recorded in ``reads`` refuses it (this covers keys
           read as absent, recorded as version 0). ``read_committed``: no
           validation. A backing may refuse more (memory's
           serialization-graph audit), never less.
        4. Apply: if there are writes, the sequence advances by one and every
           write gets that version, with ``committed_at=now``, in the current
           value and the history; each written resource's registry entry gets
           the version and time (created with ``{}`` metadata if absent).
           A read-only commit does not advance the sequence and returns
           ``CommitResult(taken_at)`` (the current sequence without a snapshot).
        5. With an ``idempotency_key``, store ``(key, fingerprint, version)``
           in the same atomic step.

        Does not end the transaction: the front calls ``end`` afterwards.
        """
        ...

    async def try_lock(
        self, txn_id: str, resource: str, key: str, mode: LockMode, wait: float
    ) -> bool:
        """One attempt at a pessimistic lock on ``(resource, key)`` for ``txn_id``.

        ``True`` when granted (held until ``end(txn_id)``), ``False`` when not.
        The front's ``Transaction.lock`` calls it until its deadline passes,
        with backoff between attempts, then raises ``LockTimeoutError``: the
        wait loop lives there, once. Redis and PostgreSQL try once and ignore
        ``wait``; memory waits up to ``wait`` seconds on its wait-for graph (a
        real elapsed wait) and raises ``DeadlockError`` when waiting would
        close a wait-for cycle (exactly one transaction of the cycle gets it;
        only a backing whose ``detects_deadlocks`` is ``True`` does).

        Shared locks coexist; an exclusive lock excludes every other holder.
        Re-locking a key the transaction holds is granted at once; asking for
        exclusive while holding shared upgrades (once the other sharers are
        gone). Locks are advisory among transactions that take them: they do
        not block commits of transactions that did not lock.

        Time: a server backing's lock expires ``lock_ttl_seconds`` after its
        grant as the *server* measures it (Redis's PX TTL, PostgreSQL's
        ``now()``), so that a crashed holder frees its keys and no host's clock
        can expire another's live lock; the injected clock never moves a lock
        (lease expiry, by contrast, reads only the injected clock). Memory
        locks live in the process and never expire.

        Cancellation: the request is recorded before it is sent, so a grant
        whose reply never arrived (a lost connection, a cancelled caller) is
        still released by ``end``.
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

    async def renew_lease(self, lease: Lease, request: LeaseRequest) -> Lease | None:
        """Extend a live lease: same token, ``expires_at=request.expires_at``.

        Returns ``None`` (nothing changed) unless the resource's current lease
        has ``lease.token``, ``lease.owner`` and has not expired at
        ``request.now``; the manager raises ``LeaseLostError`` for it.
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
        ``history_limit``; PostgreSQL: all), less what ``prune_history`` dropped;
        the latest is always retained.
        """
        ...

    async def prune_history(self, cutoff: datetime, batch: int) -> int:
        """Drop each key's versions older than its newest one committed before ``cutoff``;
        how many went.

        The latest version of a key always stays, and so does every version committed
        at or after ``cutoff`` and the newest one before it, so a snapshot taken after
        that one committed reads as before. A snapshot that needed a dropped version
        gets ``ConflictError`` from ``read`` (never an older value, never "absent").
        Bounded steps of at most ``batch`` versions or keys each, nothing held between
        them; safe to run in several processes at once. A backing whose
        ``history_retention`` is ``None`` may ignore ``cutoff`` (memory collects what no
        live snapshot needs).
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


# -- the front ------------------------------------------------------------------------

# Conflicts, deadlocks and lock timeouts are the transaction errors that a fresh
# attempt can get past; a lock cycle is a DeadlockError on memory but a
# LockTimeoutError on Redis and PostgreSQL, so ``run`` treats them alike.
_RETRIED: tuple[type[StatepactError], ...] = (ConflictError, DeadlockError, LockTimeoutError)
_DEFAULT_BACKOFF = RetryPolicy(attempts=11, base_delay=0.01, max_delay=0.5)
# Between lock attempts: the first retry comes quickly (most locks are short), then
# the wait doubles up to a ceiling that keeps a released lock's latency small.
_LOCK_FIRST_DELAY = 0.002
_LOCK_MAX_DELAY = 0.05

_log = logging.getLogger("statepact.tx")

T = TypeVar("T")


# The levels the hot paths compare against, read once: ``Isolation.X`` is a lookup through
# the enum's metaclass (about 60 ns) at every use.
_READ_COMMITTED = Isolation.READ_COMMITTED
_SERIALIZABLE = Isolation.SERIALIZABLE

#: The isolation levels by name; a member is its own name (``StrEnum``), so it finds itself.
_ISOLATIONS: dict[str, Isolation] = {level.value: level for level in Isolation}


def _require_isolation(value: object) -> Isolation:
    if type(value) is Isolation or type(value) is str:
        found = _ISOLATIONS.get(value)
        if found is not None:
            return found
    if not isinstance(value, str):
        raise TypeError(f"isolation: must be a str, got {type(value).__name__}")
    try:
        return Isolation(value)
    except ValueError as exc:
        allowed = ", ".join(i.value for i in Isolation)
        raise ValueError(f"isolation: {value!r} is not one of {allowed}") from exc


def _require_mode(value: object) -> LockMode:
    if not isinstance(value, str):
        raise TypeError(f"mode: must be a str, got {type(value).__name__}")
    try:
        return LockMode(value)
    except ValueError as exc:
        raise ValueError(f"mode: {value!r} is not one of shared, exclusive") from exc


def _require_lease(field: str, value: object) -> Lease:
    """A lease whose resource, owner and token a backing can read (a ``Lease`` is a plain
    dataclass: nothing checked its fields when it was built)."""
    if not isinstance(value, Lease):
        raise TypeError(f"{field}: must be a statepact.tx.Lease, got {type(value).__name__}")
    require_id(f"{field}.resource", value.resource)
    require_id(f"{field}.owner", value.owner)
    token = value.token
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"{field}.token: must be an int, got {type(token).__name__}")
    if not 0 <= token < 2**63:
        raise ValueError(f"{field}.token: {token} is not a token any backing issues")
    return value


# Transaction ids: unique across processes (they name lock rows, replay records and history).
_new_txn_id = UniqueIds()


#: Resource names and keys that passed ``require_id`` (which does not depend on the field
#: name): the same ids come back transaction after transaction, and a plain ``str``
#: equal to a checked one is the same text. Bounded: emptied when full, then refilled.
_ids: set[str] = set()
_IDS_KEPT = 1024


def _checked_slot(resource: object, key: object) -> tuple[str, str]:
    """``(resource, key)`` checked by ``require_id`` (or found checked before)."""
    if type(resource) is str and type(key) is str and resource in _ids and key in _ids:
        return (resource, key)
    slot = (require_id("resource", resource), require_id("key", key))
    if len(_ids) >= _IDS_KEPT:
        _ids.clear()
    _ids.add(slot[0])
    _ids.add(slot[1])
    return slot


def _decode(data: str | None) -> Any:
    return None if data is None else decode_json(data)


def _sorted_values(writes: dict[tuple[str, str], WriteRecord]) -> tuple[WriteRecord, ...]:
    """The buffered writes in ``(resource, key)`` order (most transactions write one key)."""
    if len(writes) < 2:
        return tuple(writes.values())
    return tuple(record for _, record in sorted(writes.items()))


def _read_records(reads: dict[tuple[str, str], StoredValue]) -> tuple[ReadRecord, ...]:
    """What each key read from the backing was first seen at, in ``(resource, key)`` order."""
    if len(reads) == 1:
        for (resource, key), found in reads.items():
            return (ReadRecord(resource, key, found.version),)
    return tuple(
        [
            ReadRecord(resource, key, found.version)
            for (resource, key), found in sorted(reads.items())
        ]
    )


def fingerprint(writes: tuple[WriteRecord, ...]) -> str:
    """The idempotency fingerprint: hex SHA-256 of the canonical encoding of a sorted write set.

    Values are already canonical (compact, sorted object keys), so two
    requests that write equal values to the same keys have equal fingerprints.
    """
    canonical = json.dumps(
        [[w.resource, w.key, w.data] for w in writes], ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class Transaction:
    """One transaction: reads go to the backing (or to this transaction's own writes),
    writes are buffered until commit, and commit is one atomic backing call.

    Use it as ``async with manager.transaction(...) as tx`` (commits on a clean
    exit, rolls back on an exception) or through ``await manager.begin(...)``
    with explicit ``commit()``/``rollback()``. Not safe to share between tasks.
    """

    # One is made per attempt: slots make it smaller and its attributes quicker to reach.
    __slots__ = (
        "_backend",
        "_holds",
        "_manager",
        "_reads",
        "_result",
        "_snapshot",
        "_state",
        "_turn",
        "_writes",
        "fencing",
        "idempotency_key",
        "isolation",
        "txn_id",
    )

    def __init__(
        self,
        manager: TransactionManager,
        isolation: Isolation,
        idempotency_key: str | None,
        fencing: Lease | None,
    ) -> None:
        self._manager = manager
        self._backend = manager._backend
        self.isolation = isolation
        self.idempotency_key = idempotency_key
        self.fencing = fencing
        self.txn_id = next(_new_txn_id.ids)
        self._snapshot: Snapshot | None = None
        # Set before the calls that make the backing hold something for this transaction
        # until end(): a lock request, a snapshot on a backing that pins snapshots.
        self._holds = False
        self._state = "new"
        # Keyed by checked (resource, key) pairs.
        self._reads: dict[tuple[str, str], StoredValue] = {}
        self._writes: dict[tuple[str, str], WriteRecord] = {}
        self._result: CommitResult | None = None
        # The turn on a hot key its first read waited for (statepact._turns), until it ends.
        self._turn: Turn | None = None

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> Transaction:
        """Take the snapshot now (``manager.begin``); one round trip on a server."""
        if self._state != "new":
            raise RuntimeError("transaction: already started")
        self._state = "starting"
        try:
            await self._take_snapshot()
        except BaseException:
            # Cancelled or failed after the backing may have registered the snapshot:
            # ``__aexit__`` will not run for a failed ``__aenter__``, so end it here.
            self._state = "failed"
            await self._end()
            raise
        self._state = "active"
        return self

    async def __aenter__(self) -> Transaction:
        # Nothing is sent: the snapshot is taken by the first read (one round trip
        # for a read-only transaction), or at the commit point if nothing is read.
        if self._state != "new":
            raise RuntimeError("transaction: already started")
        self._state = "active"
        return self

    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Awaitable[object]:
        # ``async with`` awaits what this returns: the commit or the rollback itself, one
        # coroutine fewer per transaction than awaiting it here. The commit's result is
        # not a suppression (the exit is clean); the rollback returns None, which suppresses
        # nothing, and is a no-op once the transaction ended inside the block.
        if exc_type is None and self._state == "active":
            return self.commit()
        return self.rollback()

    async def _take_snapshot(self) -> Snapshot:
        self._holds = self._holds or self._manager._pins_snapshots
        snapshot = self._snapshot = await self._backend.begin(self.txn_id)
        return snapshot

    async def _end(self) -> None:
        """Release what the backing holds for this transaction, if anything; runs to its end
        even if the caller is cancelled meanwhile (which then gets its ``CancelledError``)."""
        if not self._holds:
            return
        self._holds = False
        if self._manager._in_process:
            await self._backend.end(self.txn_id)
        else:
            await finish(self._backend.end(self.txn_id))

    @property
    def taken_at(self) -> int:
        """The snapshot sequence this transaction reads at (snapshot and serializable).

        ``manager.begin()`` takes the snapshot at once; ``async with
        manager.transaction()`` takes it at the first read.
        """
        if self._snapshot is None:
            if self._state == "new":
                raise RuntimeError("transaction: not started")
            raise RuntimeError(
                "transaction: no snapshot yet (it is taken at the first read, or by "
                "manager.begin())"
            )
        return self._snapshot.sequence

    @property
    def result(self) -> CommitResult:
        """The commit's result; ``RuntimeError`` before the transaction committed."""
        if self._result is None:
            raise RuntimeError(f"transaction: no result, it is {self._state}")
        return self._result

    @property
    def active(self) -> bool:
        return self._state == "active"

    def _require_active(self) -> None:
        if self._state != "active":
            raise RuntimeError(f"transaction: it is {self._state}, not active")

    # -- reads, writes, locks ------------------------------------------------------

    async def read(self, resource: str, key: str) -> Any:
        """The key's JSON value, or ``None``: this transaction's own write first, else the
        snapshot (``snapshot``/``serializable``) or the latest commit (``read_committed``)."""
        if type(resource) is str and type(key) is str and resource in _ids and key in _ids:
            slot = (resource, key)  # both checked before
        else:
            slot = _checked_slot(resource, key)
        if self._state != "active":
            self._require_active()
        written = self._writes.get(slot)
        if written is not None:
            return _decode(written.data)
        read_committed = self.isolation is _READ_COMMITTED
        reads = self._reads
        if not read_committed:
            cached = reads.get(slot)
            if cached is not None:
                return _decode(cached.data)
        snapshot = self._snapshot
        if snapshot is None:
            turns = self._manager._turns
            if turns is not None and turns.lines:  # a key is hot: this read may wait its turn
                self._turn = await turns.take(slot)
            self._holds = self._holds or self._manager._pins_snapshots
            self._snapshot, found = await self._backend.begin_read(self.txn_id, slot[0], slot[1])
        else:
            found = await self._backend.read(slot[0], slot[1], None if read_committed else snapshot)
        # The first observation is what serializable validation compares against.
        if slot not in reads:
            reads[slot] = found
        data = found.data
        return None if data is None else decode_json(data)

    def write(self, resource: str, key: str, value: Any) -> None:
        """Buffer a write of a JSON value (``None`` is refused: use ``delete``)."""
        if type(resource) is str and type(key) is str and resource in _ids and key in _ids:
            slot = (resource, key)  # both checked before
        else:
            slot = _checked_slot(resource, key)
        if value is None:
            raise ValueError(
                "value: None cannot be stored (reads return None for absent keys); "
                "use tx.delete to remove a key"
            )
        data = encode_json_value("value", value, sort_keys=True)
        limit = self._manager.max_value_bytes
        size = utf8_size(data)
        if size > limit:  # the place is named only when it is refused
            check_size("value", size, limit, where=f"{slot[0]!r}/{slot[1]!r}")
        if self._state != "active":
            self._require_active()
        self._writes[slot] = WriteRecord(slot[0], slot[1], data)

    def delete(self, resource: str, key: str) -> None:
        """Buffer a delete; the key reads as ``None`` afterwards."""
        slot = _checked_slot(resource, key)
        self._require_active()
        self._writes[slot] = WriteRecord(slot[0], slot[1], None)

    async def lock(
        self,
        resource: str,
        key: str,
        mode: LockMode | str = LockMode.EXCLUSIVE,
        timeout: float | None = None,  # noqa: ASYNC109 - the wait budget is part of the request
    ) -> None:
        """Take a pessimistic lock held until this transaction ends.

        ``timeout`` is seconds to wait (0 tries once; ``None`` is the backing's
        ``lock_timeout``). Raises ``LockTimeoutError``, or ``DeadlockError`` on
        a backing that detects wait-for cycles.
        """
        checked_resource = require_id("resource", resource)
        checked_key = require_id("key", key)
        checked_mode = _require_mode(mode)
        wait = (
            self._backend.lock_timeout
            if timeout is None
            else require_seconds("timeout", timeout, allow_zero=True)
        )
        self._require_active()
        self._holds = True  # before asking: a grant whose reply is lost is released by end()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        delay = _LOCK_FIRST_DELAY
        while True:
            remaining = max(0.0, deadline - loop.time())
            if await self._backend.try_lock(
                self.txn_id, checked_resource, checked_key, checked_mode, remaining
            ):
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise LockTimeoutError(resource=checked_resource, key=checked_key, timeout=wait)
            # Jittered so that waiters released together do not ask together.
            await asyncio.sleep(min(remaining, random.uniform(delay / 2, delay)))
            delay = min(delay * 2, _LOCK_MAX_DELAY)

    # -- the end -------------------------------------------------------------------

    async def commit(self) -> CommitResult:
        """Validate and apply everything in one atomic backing call; always ends the transaction."""
        if self._state != "active":
            self._require_active()
        self._state = "committing"
        manager = self._manager
        try:
            writes = _sorted_values(self._writes)
            if (
                not writes
                and self.idempotency_key is None
                and self.fencing is None
                and self.isolation is not _SERIALIZABLE
            ):
                # Nothing to validate or record: the backing would answer exactly this.
                snapshot = self._snapshot or await self._take_snapshot()
                result = manager._read_only
                if result.version != snapshot.sequence:
                    result = manager._read_only = CommitResult(snapshot.sequence)
            else:
                request = CommitRequest(  # by position: a keyword call costs more, every commit
                    self.txn_id,
                    self.isolation,
                    self._snapshot,
                    _read_records(self._reads),
                    writes,
                    self.idempotency_key,
                    None if self.idempotency_key is None else fingerprint(writes),
                    self.fencing,
                    datetime.now(UTC) if manager._system_clock else read_clock(manager.clock),
                )
                if manager._in_process:  # never suspends: nothing to shield
                    result = await self._backend.commit(request)
                else:
                    result = await self._commit(request)
            self._result = result
            self._state = "committed"
        except ConflictError as exc:
            self._state = "failed"
            turns = manager._turns
            if turns is not None and exc.resource is not None and exc.key is not None:
                turns.conflicted((exc.resource, exc.key))
            raise
        except FencingError as exc:
            self._state = "failed"
            _log.warning(
                "transaction %s refused: %s",
                self.txn_id,
                exc,
                extra={"txn_id": self.txn_id, "backing": _observe.backing_of(self._manager)},
            )
            raise
        except BaseException:
            if self._state != "committed":  # a cancelled commit may have landed all the same
                self._state = "failed"
            raise
        finally:
            # Whatever happened above, a cancellation included: the locks and the
            # snapshot are released before the caller goes on.
            if self._turn is not None:
                self._give_back_turn()
            if self._holds:
                await self._end()
        return result

    async def _commit(self, request: CommitRequest) -> CommitResult:
        """A server backing's commit, run to its answer even if the caller is cancelled
        meanwhile.

        The commit must have settled before ``end`` releases the locks (a lock
        released under a commit still in flight would let another holder read
        what it is about to overwrite). If it landed, ``result`` is set even
        though the caller gets ``CancelledError``.
        """
        outcome = asyncio.ensure_future(self._backend.commit(request))
        try:
            return await finish(outcome)
        except asyncio.CancelledError:
            if not outcome.cancelled() and outcome.exception() is None:
                self._result = outcome.result()
                self._state = "committed"
            raise

    async def rollback(self) -> None:
        """Discard the buffered writes and release the snapshot and locks; idempotent.

        The release completes even if the caller is cancelled meanwhile (which
        then gets its ``CancelledError`` once it has).
        """
        if self._state in ("active", "new"):
            self._state = "rolled back"
            if self._turn is not None:
                self._give_back_turn()
            await self._end()

    def _give_back_turn(self) -> None:
        turn, self._turn = self._turn, None
        turns = self._manager._turns
        if turn is not None and turns is not None:
            turns.give_back(turn)

    def __repr__(self) -> str:
        return f"Transaction({self.txn_id}, {self.isolation.value}, {self._state})"


class TransactionManager:
    """Transactions, leases, history and the resource registry over one ``StorageBackend``.

    ``clock`` is the clock every lease and commit time is read from: the one
    passed, else the one the backing was built with, else ``SystemClock``;
    ``max_value_bytes`` bounds each
    serialized value (``StatePersistenceError(reason="too_large")`` above it,
    nothing sent); ``backoff`` paces ``run``'s retries (its ``attempts`` is
    replaced by ``retries + 1``); ``hot_key_turn`` is the longest, in seconds, a
    transaction holds its turn on a key under contention (``None``: no turns, every
    first read is sent at once; docs/transactions.md#hot-keys).
    """

    def __init__(
        self,
        backend: StorageBackend,
        *,
        clock: Clock | None = None,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        backoff: RetryPolicy | None = None,
        hot_key_turn: float | timedelta | None = HOLD_FOR,
    ) -> None:
        if max_value_bytes <= 0:
            raise ValueError("max_value_bytes: must be positive")
        # Hot keys, on which this manager's transactions take turns (statepact._turns).
        self._turns = (
            None
            if hot_key_turn is None
            else KeyTurns(hold_for=require_seconds("hot_key_turn", hot_key_turn))
        )
        self._backend = backend
        self._clock: Clock = clock or backend.clock or SystemClock()
        # SystemClock reads datetime.now(UTC): nothing for read_clock to hold it to.
        self._system_clock = type(self._clock) is SystemClock
        self.max_value_bytes = max_value_bytes
        self._backoff = backoff or _DEFAULT_BACKOFF
        # The backing's constants, read once (every transaction asks them).
        self._in_process: bool = getattr(backend, "in_process", False)
        self._pins_snapshots: bool = getattr(backend, "pins_snapshots", False)
        # The last read-only commit's result: the next one at the same sequence is the
        # same (immutable) result, so it is handed out again instead of made again.
        self._read_only = CommitResult(0)

    @property
    def backend(self) -> StorageBackend:
        return self._backend

    @property
    def clock(self) -> Clock:
        return self._clock

    # -- transactions ---------------------------------------------------------------

    def transaction(
        self,
        isolation: Isolation | str = Isolation.SNAPSHOT,
        idempotency_key: str | None = None,
        fencing: Lease | None = None,
    ) -> Transaction:
        """A transaction to use as ``async with``: commits on a clean exit, rolls back otherwise.

        With ``idempotency_key``, a second commit of the same writes returns
        the first ``CommitResult`` with ``replayed=True`` and applies nothing;
        different writes raise ``IdempotencyConflictError``. With ``fencing``,
        the commit is refused with ``FencingError`` once a higher token has
        been issued for ``fencing.resource``. Bad arguments raise
        ``ValueError``/``TypeError`` naming the field, before anything is sent.
        """
        return Transaction(  # by position: a keyword call costs more, every transaction
            self,
            isolation if type(isolation) is Isolation else _require_isolation(isolation),
            None if idempotency_key is None else require_id("idempotency_key", idempotency_key),
            None if fencing is None else _require_lease("fencing", fencing),
        )

    async def begin(
        self,
        isolation: Isolation | str = Isolation.SNAPSHOT,
        idempotency_key: str | None = None,
        fencing: Lease | None = None,
    ) -> Transaction:
        """A started transaction, for explicit ``commit()``/``rollback()``."""
        return await self.transaction(isolation, idempotency_key, fencing).start()

    async def run(
        self,
        fn: Callable[[Transaction], Awaitable[T]],
        *,
        isolation: Isolation | str = Isolation.SNAPSHOT,
        retries: int = 10,
        idempotency_key: str | None = None,
        fencing: Lease | None = None,
    ) -> T:
        """Run ``fn(tx)`` in a transaction and commit; return what ``fn`` returned.

        On ``ConflictError``, ``DeadlockError`` or ``LockTimeoutError`` (from
        ``fn`` or the commit) the transaction is rolled back and ``fn`` runs
        again in a new one, after a jittered, doubling backoff, up to
        ``retries`` times; then the last error is raised. Other errors propagate
        at once.
        """
        if type(retries) is not int and (isinstance(retries, bool) or not isinstance(retries, int)):
            raise TypeError(f"retries: must be an int, got {type(retries).__name__}")
        if retries < 0:
            raise ValueError(f"retries: must not be negative, got {retries}")
        # Checked once, before the first attempt, as ``transaction`` checks them.
        checked_isolation = (
            isolation if type(isolation) is Isolation else _require_isolation(isolation)
        )
        checked_key = (
            None if idempotency_key is None else require_id("idempotency_key", idempotency_key)
        )
        checked_fencing = None if fencing is None else _require_lease("fencing", fencing)
        attempt = 0
        while True:
            tx = Transaction(self, checked_isolation, checked_key, checked_fencing)
            try:
                # ``async with tx``, without its two extra awaits: commit on a clean exit,
                # roll back on an exception (rollback never suppresses it).
                tx._state = "active"
                try:
                    outcome = await fn(tx)
                except BaseException:
                    await tx.rollback()
                    raise
                if tx._state == "active":
                    await tx.commit()
            except _RETRIED as exc:
                attempt += 1
                policy = replace(self._backoff, attempts=retries + 1)
                backing = _observe.backing_of(self)
                fields = {
                    "backing": backing,
                    "attempt": attempt,
                    "max_attempts": policy.attempts,
                    "error_type": type(exc).__name__,
                }
                if attempt >= policy.attempts:
                    _log.warning(
                        "transaction run gave up after %d attempt(s): %s",
                        attempt,
                        exc,
                        extra=fields,
                    )
                    raise
                delay = policy.delay(attempt - 1)
                _log.debug(
                    "transaction run: attempt %d of %d raised %s; again in %.3f s",
                    attempt,
                    policy.attempts,
                    type(exc).__name__,
                    delay,
                    extra={**fields, "delay": delay},
                )
                _observe.retried(reason="conflict", backing=backing, attempt=attempt, error=exc)
                await asyncio.sleep(delay)
                continue
            return outcome

    # -- leases ---------------------------------------------------------------------

    def _lease_request(self, resource: str, owner: str, ttl: object) -> LeaseRequest:
        seconds = require_seconds("ttl", ttl)
        now = read_clock(self._clock)
        return LeaseRequest(
            resource=require_id("resource", resource),
            owner=require_id("owner", owner),
            ttl=seconds,
            now=now,
            expires_at=now + timedelta(seconds=seconds),
        )

    async def acquire_lease(
        self, resource: str, owner: str, ttl: float | timedelta
    ) -> Lease | None:
        """A lease on ``resource`` with a token above every token issued for it, or ``None``.

        ``None`` means another owner holds a live lease (nothing changed). The
        same owner acquiring again gets a fresh token and expiry.
        """
        return await self._backend.acquire_lease(self._lease_request(resource, owner, ttl))

    async def renew_lease(self, lease: Lease, ttl: float | timedelta | None = None) -> Lease:
        """Extend a live lease by ``ttl`` (default: its own) from now, keeping its token.

        Raises ``LeaseLostError`` if it expired or another lease was issued since.
        """
        checked = _require_lease("lease", lease)
        request = self._lease_request(
            checked.resource, checked.owner, checked.ttl if ttl is None else ttl
        )
        renewed = await self._backend.renew_lease(checked, request)
        if renewed is None:
            raise LeaseLostError(
                f"lease on {checked.resource!r} with token {checked.token} held by "
                f"{checked.owner!r} expired or was taken over; acquire a new one"
            )
        return renewed

    async def release_lease(self, lease: Lease) -> bool:
        """Give the lease up; ``True`` if it was still the current one."""
        return await self._backend.release_lease(
            _require_lease("lease", lease), read_clock(self._clock)
        )

    # -- history, registry, operations ------------------------------------------------

    async def history(self, resource: str, key: str, limit: int = 100) -> list[VersionEntry]:
        """Retained committed versions of the key, newest first (deletes included)."""
        rows = await self._backend.history(
            require_id("resource", resource),
            require_id("key", key),
            require_limit(limit, MAX_HISTORY),
        )
        return [
            VersionEntry(
                version=row.version,
                value=_decode(row.data),
                deleted=row.data is None,
                committed_at=row.committed_at,
            )
            for row in rows
        ]

    async def prune_history(self) -> int:
        """Drop the history no snapshot younger than the backing's retention needs.

        Each key keeps its versions committed within ``history_retention_seconds``
        (settings; an hour by default) and the newest one before; a transaction whose
        snapshot is older than that may then get ``ConflictError`` ("snapshot too
        old", retryable: ``run`` retries it with a fresh snapshot). Run it
        periodically (a worker's scheduled task, cron); on memory it only collects
        what no live snapshot needs. Returns how many versions went.
        """
        retention = getattr(self._backend, "history_retention", None)
        now = read_clock(self._clock)
        cutoff = now if retention is None else now - timedelta(seconds=retention)
        return await self._backend.prune_history(cutoff, PRUNE_BATCH)

    async def register_resource(self, name: str, metadata: dict[str, Any] | None = None) -> None:
        """Create or update a resource's registry entry; ``metadata`` (JSON object) replaces it."""
        checked = require_id("name", name)
        data = encode_json("metadata", {} if metadata is None else metadata, sort_keys=True)
        check_size("metadata", len(data), self.max_value_bytes, where=f"resource {checked!r}")
        await self._backend.register_resource(
            checked, data.decode("utf-8"), read_clock(self._clock)
        )

    async def resource_info(self, name: str) -> ResourceInfo | None:
        """The resource's registry entry, or ``None`` if it was never registered nor written."""
        row = await self._backend.resource_info(require_id("name", name))
        if row is None:
            return None
        return ResourceInfo(
            name=row.name,
            metadata=decode_json(row.metadata),
            version=row.version,
            last_commit_at=row.last_commit_at,
        )

    async def health_check(self) -> bool:
        """``True`` when the backing answers."""
        return await self._backend.health_check()

    async def close(self) -> None:
        """Close the backing; idempotent."""
        await self._backend.close()
