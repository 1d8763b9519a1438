"""The one error tree of statepact.

Every backing translates its driver's exceptions at its own boundary
(``raise Public(...) from exc``); nothing above a backing ever sees a redis-py,
asyncpg or SQLAlchemy exception. Each error says whether retrying the same call
can help (``retryable``). Messages name the tenant, key or setting involved and
never a DSN or a password.

::

    StatepactError                      retryable
    ├── StateConflictError              no   put_run held a stale version
    ├── RunNotFoundError                no   patch_run on a run that is not there
    ├── StatePersistenceError           by reason: "unavailable" yes, "too_large" no
    ├── QueueUnavailableError           yes  the queue's server stayed down past the budget
    ├── PoolExhaustedError              no   no free pooled connection; raised at once
    ├── LeaseLostError                  no   a settle or heartbeat with a lease that moved on
    ├── ConflictError                   yes  a transaction failed validation
    ├── IdempotencyConflictError        no   same idempotency key, different request
    ├── FencingError                    no   a fencing token below the highest issued
    ├── LockTimeoutError                yes  a pessimistic lock was not granted in time
    ├── DeadlockError                   yes  a wait-for cycle; this waiter was chosen
    ├── PreflightError                  no   the server would lose data; every reason listed
    ├── SchemaVersionError              no   the tables are not the shape this release reads
    └── OutOfTurnError (RuntimeError)   no   a session/connection used out of turn (bound)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

__all__ = [
    "ConflictError",
    "DeadlockError",
    "FencingError",
    "IdempotencyConflictError",
    "LeaseLostError",
    "LockTimeoutError",
    "OutOfTurnError",
    "PoolExhaustedError",
    "PreflightError",
    "QueueUnavailableError",
    "RunNotFoundError",
    "SchemaVersionError",
    "StateConflictError",
    "StatePersistenceError",
    "StatepactError",
]

PersistenceReason = Literal["unavailable", "too_large"]


class StatepactError(Exception):
    """Base of every error statepact raises on purpose."""

    retryable: bool = False


class StateConflictError(StatepactError):
    """A put held a version the store has moved past; nothing was written.

    ``expected`` is the version the caller held, ``actual`` the stored one
    (0 when the record does not exist).
    """

    def __init__(
        self, *, tenant: str, record_id: str, expected: int, actual: int, kind: str = "run"
    ) -> None:
        self.tenant = tenant
        self.record_id = record_id
        self.kind = kind
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"{kind} {record_id!r} of tenant {tenant!r}: the put held version {expected}, "
            f"the store has version {actual}; re-read it and apply the change again"
        )


class RunNotFoundError(StatepactError):
    """The run does not exist (or was deleted)."""

    def __init__(self, *, tenant: str, run_id: str) -> None:
        self.tenant = tenant
        self.run_id = run_id
        super().__init__(f"run {run_id!r} of tenant {tenant!r} does not exist")


class StatePersistenceError(StatepactError):
    """State could not be persisted.

    ``reason="unavailable"``: the server stayed unreachable past the failover
    budget; retryable. ``reason="too_large"``: the serialized value is over
    ``max_value_bytes``; refused before anything was sent, never retryable.
    """

    def __init__(self, message: str, *, reason: PersistenceReason) -> None:
        self.reason: PersistenceReason = reason
        self.retryable = reason == "unavailable"
        super().__init__(message)


class QueueUnavailableError(StatepactError):
    """The queue's server stayed unreachable past the failover budget."""

    retryable = True


class PoolExhaustedError(StatepactError):
    """No pooled connection was free; the endpoint is fine, the process is over-subscribed."""


class LeaseLostError(StatepactError):
    """A settle or heartbeat carried a lease token that is no longer the item's."""

    def __init__(self, message: str, *, item_id: str | None = None) -> None:
        self.item_id = item_id
        super().__init__(message)


class ConflictError(StatepactError):
    """A transaction failed validation at commit; nothing it wrote was applied."""

    retryable = True

    def __init__(self, message: str, *, resource: str | None = None, key: str | None = None):
        self.resource = resource
        self.key = key
        super().__init__(message)

    # One wording per kind of conflict, whichever backing detects it.

    @classmethod
    def write_conflict(
        cls, resource: str | None, key: str | None, *, latest: object, taken_at: object
    ) -> ConflictError:
        """A key this transaction writes was committed after its snapshot (first committer wins)."""
        return cls(
            f"{resource!r}/{key!r} was committed at version {latest}, after "
            f"this transaction's snapshot {taken_at}; first committer wins",
            resource=resource,
            key=key,
        )

    @classmethod
    def read_conflict(
        cls, resource: str | None, key: str | None, *, seen: object, latest: object
    ) -> ConflictError:
        """A key this serializable transaction read has moved on since it was read."""
        return cls(
            f"{resource!r}/{key!r} was read at version {seen} and is "
            f"now at version {latest}; serializable validation failed",
            resource=resource,
            key=key,
        )

    @classmethod
    def snapshot_too_old(cls, resource: str, key: str, *, at: int, gone: str) -> ConflictError:
        """The version a snapshot read needs is no longer kept; ``gone`` says how it went."""
        return cls(
            f"{resource!r}/{key!r}: the version snapshot {at} needs was {gone} "
            "(snapshot too old); retry the transaction",
            resource=resource,
            key=key,
        )


class IdempotencyConflictError(StatepactError):
    """The idempotency key was used before for a different request."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(
            f"idempotency key {key!r} was already used for a different request; "
            "use a new key for a new request"
        )


class FencingError(StatepactError):
    """The commit's fencing token is below the highest token issued for its resource."""

    def __init__(self, *, resource: str, token: int, highest: int) -> None:
        self.resource = resource
        self.token = token
        self.highest = highest
        super().__init__(
            f"fencing token {token} for resource {resource!r} is stale: "
            f"token {highest} has been issued since; this holder lost its lease"
        )


class LockTimeoutError(StatepactError):
    """A pessimistic lock was not granted within its timeout."""

    retryable = True

    def __init__(self, *, resource: str, key: str, timeout: float) -> None:
        self.resource = resource
        self.key = key
        self.timeout = timeout
        super().__init__(f"lock on {resource!r}/{key!r} not granted within {timeout:g} s")


class DeadlockError(StatepactError):
    """Granting this lock would close a wait-for cycle; this waiter was refused."""

    retryable = True

    def __init__(self, *, resource: str, key: str) -> None:
        self.resource = resource
        self.key = key
        super().__init__(
            f"lock on {resource!r}/{key!r} would deadlock; this transaction was chosen to abort"
        )


class PreflightError(StatepactError):
    """The server is configured so that it could lose data, or the role lacks a privilege a
    call needs; every reason is listed, each with its fix."""

    def __init__(self, reasons: Sequence[str], *, server: str = "server") -> None:
        self.reasons = tuple(reasons)
        self.server = server
        listed = "; ".join(self.reasons)
        super().__init__(f"{server} refused: {listed}")


class SchemaVersionError(StatepactError):
    """The database schema is missing or at a version this release was not written for."""

    def __init__(self, message: str, *, found: str | None = None, expected: str | None = None):
        self.found = found
        self.expected = expected
        super().__init__(message)


class OutOfTurnError(StatepactError, RuntimeError):
    """An object was used out of turn; the message says what the caller must do first.

    Raised by a bound adapter (``bound(session)`` on PostgreSQL) given a session or
    connection that is not inside a transaction the caller began, is closed, holds a
    transaction that failed and must be rolled back, or is running another task's call.
    Not retryable: the same call on the same object fails the same way. A
    ``RuntimeError``, as docs/errors.md promises for use out of turn.
    """
