"""``Transaction``: one transaction's reads, buffered writes, locks and commit.

Built by ``TransactionManager`` (``statepact.tx``), whose backing, clock and hot-key
turns it uses; a commit the backing refuses comes back as a ``Refusal`` and is
raised here as its public error (:meth:`statepact._tx.models.Refusal.error`), the
one place that decision is made.

This module must never import a driver (redis, asyncpg, SQLAlchemy) or a backing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
from collections.abc import Awaitable
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from statepact import _observe
from statepact._cancel import finish
from statepact._codec import (
    check_size,
    decode_json,
    encode_json_value,
    require_id,
    require_seconds,
    require_token,
    utf8_size,
)
from statepact._retry import UniqueIds
from statepact._turns import Turn
from statepact._tx.models import (
    CommitRequest,
    CommitResult,
    Isolation,
    Lease,
    LockMode,
    ReadRecord,
    Refusal,
    Snapshot,
    StoredValue,
    WriteRecord,
)
from statepact.clock import read_clock
from statepact.errors import (
    ConflictError,
    FencingError,
    LockTimeoutError,
)

if TYPE_CHECKING:
    from statepact.tx import TransactionManager

__all__ = ["Transaction", "fingerprint", "require_isolation", "require_tx_lease"]

# Between lock attempts: the first retry comes quickly (most locks are short), then
# the wait doubles up to a ceiling that keeps a released lock's latency small.
_LOCK_FIRST_DELAY = 0.002
_LOCK_MAX_DELAY = 0.05

_log = logging.getLogger("statepact.tx")


# The levels the hot paths compare against, read once: ``Isolation.X`` is a lookup through
# the enum's metaclass at every use.
_READ_COMMITTED = Isolation.READ_COMMITTED
_SERIALIZABLE = Isolation.SERIALIZABLE

#: The isolation levels by name; a member is its own name (``StrEnum``), so it finds itself.
_ISOLATIONS: dict[str, Isolation] = {level.value: level for level in Isolation}


def require_isolation(value: object) -> Isolation:
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


def require_tx_lease(field: str, value: object) -> Lease:
    """A lease whose resource, owner and token a backing can read (a ``Lease`` is a plain
    dataclass: nothing checked its fields when it was built)."""
    if not isinstance(value, Lease):
        raise TypeError(f"{field}: must be a statepact.tx.Lease, got {type(value).__name__}")
    require_id(f"{field}.resource", value.resource)
    require_id(f"{field}.owner", value.owner)
    require_token(f"{field}.token", value.token, "backing")
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

    @property
    def manager(self) -> TransactionManager:
        """The manager this transaction belongs to."""
        return self._manager

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
        if self._holds:
            await self._release()

    def _release(self) -> Awaitable[None]:
        """The backing's ``end`` of this transaction, to await (``_holds`` was checked): an
        in-process backing's own call, which never suspends; a server's, run to its end."""
        self._holds = False
        if self._manager._in_process:
            return self._backend.end(self.txn_id)
        return finish(self._backend.end(self.txn_id))

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
        writes = self._writes
        if writes:
            written = writes.get(slot)
            if written is not None:
                return _decode(written.data)
        reads = self._reads
        snapshot = self._snapshot
        if snapshot is None:
            # The first read from the backing (nothing cached: each one took the snapshot).
            turns = self._manager._turns
            if turns is not None and turns.lines:  # a key is hot: this read may wait its turn
                self._turn = await turns.take(slot)
            self._holds = self._holds or self._manager._pins_snapshots
            self._snapshot, found = await self._backend.begin_read(self.txn_id, slot[0], slot[1])
            reads[slot] = found
        else:
            read_committed = self.isolation is _READ_COMMITTED
            if not read_committed:
                cached = reads.get(slot)
                if cached is not None:
                    return _decode(cached.data)
            answer = await self._backend.read(
                slot[0], slot[1], None if read_committed else snapshot
            )
            if isinstance(answer, Refusal):  # the version the snapshot needs is gone
                raise answer.error()
            found = answer
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
                    verdict = await self._backend.commit(request)
                else:
                    verdict = await self._commit(request)
                if isinstance(verdict, Refusal):
                    # The one place a backing's refusal becomes the public error (a
                    # backing written before verdicts may still raise it itself).
                    raise verdict.error()
                result = verdict
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
                await self._release()
        return result

    async def _commit(self, request: CommitRequest) -> CommitResult | Refusal:
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
                landed = outcome.result()
                if not isinstance(landed, Refusal):
                    self._result = landed
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
