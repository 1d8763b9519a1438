"""Coordination transactions: the ``StorageBackend`` protocol and the ``TransactionManager`` front.

Everything that can be decided before a request reaches a server lives in front,
once: validation and encoding, the idempotency fingerprint, read-your-own-writes
buffering, the clock, the lock wait, the public error of a refused commit, and
retries with backoff. A backing stores what it is told and validates a commit in
ONE atomic call, answering a ``CommitResult`` or a ``Refusal``; it never reads a
clock, validates an id or a JSON value, raises a commit refusal, or retries a
conflict. The records live in ``statepact._tx.models``, ``Transaction`` in
``statepact._tx.transaction``; all are public here. Versions and the two
``Lease`` classes: docs/transactions.md; what is logged: docs/observability.md.

This module must never import a driver (redis, asyncpg, SQLAlchemy) or a backing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar, runtime_checkable

from statepact import _observe
from statepact._codec import (
    check_size,
    decode_json,
    encode_json,
    require_id,
    require_limit,
    require_seconds,
)
from statepact._limits import DEFAULT_MAX_VALUE_BYTES, MAX_HISTORY, PRUNE_BATCH
from statepact._retry import Retrying, RetryPolicy, retry
from statepact._turns import HOLD_FOR, KeyTurns
from statepact._tx.models import (
    CommitRequest,
    CommitResult,
    Isolation,
    Lease,
    LeaseRequest,
    LockMode,
    ReadRecord,
    Refusal,
    RefusalKind,
    ResourceInfo,
    Snapshot,
    StoredResource,
    StoredValue,
    StoredVersion,
    VersionEntry,
    WriteRecord,
)
from statepact._tx.transaction import (
    Transaction,
    fingerprint,
    require_isolation,
    require_tx_lease,
)
from statepact.clock import Clock, SystemClock, read_clock
from statepact.errors import (
    ConflictError,
    DeadlockError,
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
    "Refusal",
    "RefusalKind",
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
    "fingerprint",
]

# Defined in the private modules, public here: named as this module's (repr, docs, pickle).
for _name in __all__:
    _public = globals().get(_name)
    if isinstance(_public, type) and _public.__module__.startswith("statepact._tx."):
        _public.__module__ = __name__
del _name, _public


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

    async def read(self, resource: str, key: str, at: Snapshot | None) -> StoredValue | Refusal:
        """The newest committed version of the key visible at snapshot ``at``.

        ``at=None`` reads the latest committed version. Never sees an
        uncommitted write. If the version the snapshot needs is no longer
        retained (a capped or pruned history), answers ``Refusal("too_old",
        resource, key, taken_at=at.sequence, reason=<how it went>)``, never
        raised here: the front raises it as ``ConflictError`` ("snapshot too
        old"; retryable).
        """
        ...

    async def commit(self, request: CommitRequest) -> CommitResult | Refusal:
        """Validate and apply a transaction, atomically, in one call.

        In this order, and with nothing applied unless every step passes; a
        refused commit is answered with a ``Refusal`` (the front raises its
        public error, ``Refusal.error``), never raised here:

        1. Fencing: if ``request.fencing`` is set and its token is below the
           highest token ever issued for ``fencing.resource``, refuse it
           (``kind="fenced"``, ``seen`` the token, ``latest`` the highest).
        2. Idempotency: if ``idempotency_key`` has a record, return its stored
           ``CommitResult`` with ``replayed=True`` when the fingerprints match,
           else refuse it (``kind="idempotency"``, ``key`` the idempotency key).
        3. Validation (a ``Refusal`` naming the resource and key):
           ``snapshot`` and ``serializable``: any written key with a version
           committed after the snapshot refuses the commit (first committer
           wins; nothing to check when ``snapshot`` is ``None``; ``kind="write"``).
           ``serializable`` also: any read key whose latest version is not
           the version recorded in ``reads`` refuses it (this covers keys
           read as absent, recorded as version 0; ``kind="read"``).
           ``read_committed``: no validation. A backing may refuse more
           (memory's serialization-graph audit, ``kind="other"``), never less.
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
# A conflict retried is the design working: DEBUG; giving up is news: WARNING.
_CONFLICTS = Retrying("conflict", logging.getLogger("statepact.tx"), logging.DEBUG, logging.WARNING)

T = TypeVar("T")


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
            isolation if type(isolation) is Isolation else require_isolation(isolation),
            None if idempotency_key is None else require_id("idempotency_key", idempotency_key),
            None if fencing is None else require_tx_lease("fencing", fencing),
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
            isolation if type(isolation) is Isolation else require_isolation(isolation)
        )
        checked_key = (
            None if idempotency_key is None else require_id("idempotency_key", idempotency_key)
        )
        checked_fencing = None if fencing is None else require_tx_lease("fencing", fencing)

        async def attempt() -> T:
            tx = Transaction(self, checked_isolation, checked_key, checked_fencing)
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
            return outcome

        return await retry(
            attempt,
            policy=replace(self._backoff, attempts=retries + 1),
            retryable=lambda exc: isinstance(exc, _RETRIED),
            how=_CONFLICTS,
            what="transaction run",
            backing=_observe.backing_of(self),
        )

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
        checked = require_tx_lease("lease", lease)
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
            require_tx_lease("lease", lease), read_clock(self._clock)
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
                value=None if row.data is None else decode_json(row.data),
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
