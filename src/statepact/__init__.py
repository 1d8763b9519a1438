"""statepact: durable state, fair work queues and coordination transactions for agent fleets.

Importing this package imports neither redis nor SQLAlchemy: the backings live
in ``statepact.storage.{memory,redis,postgres}`` and load their drivers only
when imported.
"""

from statepact._retry import RetryPolicy
from statepact.clock import Clock, ManualClock, SystemClock
from statepact.errors import (
    ConflictError,
    DeadlockError,
    FencingError,
    IdempotencyConflictError,
    LeaseLostError,
    LockTimeoutError,
    OutOfTurnError,
    PoolExhaustedError,
    PreflightError,
    QueueUnavailableError,
    RunNotFoundError,
    SchemaVersionError,
    StateConflictError,
    StatepactError,
    StatePersistenceError,
)
from statepact.models import (
    AttemptError,
    ItemStatus,
    Lease,
    Page,
    QueueStats,
    RunRecord,
    RunStatus,
    SessionRecord,
    TenantQueueStats,
    WorkItem,
)
from statepact.queue import QueueLimits, QueuePolicy, Rate, WorkQueue
from statepact.settings import (
    MemoryStoreSettings,
    PostgresStoreSettings,
    RedisStoreSettings,
    StoreSettings,
)
from statepact.state import StateStore
from statepact.tx import CommitResult, Isolation, StorageBackend, Transaction, TransactionManager

__version__ = "0.1.0"

__all__ = [
    "AttemptError",
    "Clock",
    "CommitResult",
    "ConflictError",
    "DeadlockError",
    "FencingError",
    "IdempotencyConflictError",
    "Isolation",
    "ItemStatus",
    "Lease",
    "LeaseLostError",
    "LockTimeoutError",
    "ManualClock",
    "MemoryStoreSettings",
    "OutOfTurnError",
    "Page",
    "PoolExhaustedError",
    "PostgresStoreSettings",
    "PreflightError",
    "QueueLimits",
    "QueuePolicy",
    "QueueStats",
    "QueueUnavailableError",
    "Rate",
    "RedisStoreSettings",
    "RetryPolicy",
    "RunNotFoundError",
    "RunRecord",
    "RunStatus",
    "SchemaVersionError",
    "SessionRecord",
    "StateConflictError",
    "StatePersistenceError",
    "StateStore",
    "StatepactError",
    "StorageBackend",
    "StoreSettings",
    "SystemClock",
    "TenantQueueStats",
    "Transaction",
    "TransactionManager",
    "WorkItem",
    "WorkQueue",
]
