"""The transaction layer's records: what the front hands a backing and what comes back.

Public through ``statepact.tx`` (which re-exports them under that module's name);
``Refusal`` is the verdict a backing returns for a commit it refuses, turned into
the public error in one place (:meth:`Refusal.error`), by the front.

This module must never import a driver (redis, asyncpg, SQLAlchemy) or a backing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from statepact.errors import (
    ConflictError,
    FencingError,
    IdempotencyConflictError,
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
    "Refusal",
    "RefusalKind",
    "ResourceInfo",
    "Snapshot",
    "StoredResource",
    "StoredValue",
    "StoredVersion",
    "VersionEntry",
    "WriteRecord",
]


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


#: Why a backing refused a commit: a key written since the snapshot (``write``), a key
#: read at a version that has moved on (``read``), a stale fencing token (``fenced``),
#: an idempotency key used for other writes (``idempotency``), or a refusal with only a
#: reason to give (``other``: the memory audit's cycle, a deadlock inside the commit, an
#: idempotency record removed mid-commit); or why it refused a read at a snapshot: the
#: version the snapshot needs is no longer kept (``too_old``).
RefusalKind = Literal["write", "read", "fenced", "idempotency", "other", "too_old"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A backing's verdict on a commit it refused (nothing of it was applied), or on a
    snapshot read it cannot answer (``too_old``).

    ``seen`` is the version the transaction read (``read``), or the fencing token it
    presented (``fenced``); ``latest`` the version now committed (``write``, ``read``)
    or the highest token issued (``fenced``); ``taken_at`` the snapshot's sequence
    (``write``, ``too_old``); ``reason`` the wording of an ``other`` refusal, or how the
    version a ``too_old`` read needs went (trimmed, collected, pruned). Backings decide
    *whether* to refuse; the front (``TransactionManager``) raises :meth:`error`, so
    the public error and its wording are decided once for every backing.
    """

    kind: RefusalKind
    resource: str | None = None
    key: str | None = None
    seen: int | None = None
    latest: int | None = None
    taken_at: int | None = None
    reason: str = ""

    def error(self) -> StatepactError:
        """The public error this refusal is raised as."""
        kind = self.kind
        if kind == "write":
            return ConflictError.write_conflict(
                self.resource, self.key, latest=self.latest, taken_at=self.taken_at
            )
        if kind == "read":
            return ConflictError.read_conflict(
                self.resource, self.key, seen=self.seen, latest=self.latest
            )
        if kind == "fenced":
            return FencingError(
                resource=str(self.resource),
                token=int(self.seen or 0),
                highest=int(self.latest or 0),
            )
        if kind == "idempotency":
            return IdempotencyConflictError(str(self.key))
        if kind == "too_old":
            return ConflictError.snapshot_too_old(
                str(self.resource), str(self.key), at=int(self.taken_at or 0), gone=self.reason
            )
        return ConflictError(self.reason, resource=self.resource, key=self.key)
