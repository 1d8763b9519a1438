"""The one home of statepact's limits and shared defaults.

Settings, the fronts, the backings and the conformance suites read these
names; none of them writes the numbers again. See docs/architecture.md.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_MAX_VALUE_BYTES",
    "LEASE_EXPIRED",
    "MAX_BATCH_BYTES",
    "MAX_CAP",
    "MAX_COUNTER",
    "MAX_ENQUEUE_BATCH",
    "MAX_ERROR_HISTORY",
    "MAX_HISTORY",
    "MAX_LIMIT_KEYS",
    "MAX_PAGE",
    "MAX_PRIORITY",
    "MAX_RATE_PERIOD",
    "MAX_RATE_WEIGHT",
    "MAX_RETRY_DELAY",
    "MAX_SHARED_COMMITS",
    "MAX_SHARED_ENQUEUES",
    "MAX_SHARED_READS",
    "MAX_SHARED_WRITES",
    "MAX_WEIGHT",
    "PRUNE_BATCH",
    "PRUNE_PAUSE",
]

#: The largest serialized blob, payload or value accepted unless settings say otherwise.
DEFAULT_MAX_VALUE_BYTES = 262_144
#: The most items one ``enqueue_many`` takes.
MAX_ENQUEUE_BATCH = 10_000
#: The most payload bytes one ``enqueue_many`` sends (each item is also held to max_value_bytes).
MAX_BATCH_BYTES = 64 * 1024 * 1024
#: The most rows one page of ``list_runs``/``list_sessions``/``dead_letters`` returns.
MAX_PAGE = 1000
#: The bound of a work item's priority, either way: ``-MAX_PRIORITY..MAX_PRIORITY``
#: (the front checks it; PostgreSQL's table holds it as a CHECK constraint).
MAX_PRIORITY = 1000
#: The most versions one ``history`` call returns.
MAX_HISTORY = 1000
#: The largest value a run counter holds (cost in nano-units): a signed 64-bit integer.
MAX_COUNTER = 2**63 - 1
#: The most calls one shared round trip carries (``statepact._shared``): single enqueues
#: of a queue, PostgreSQL run writes, a ``PostgresBackend``'s first reads and commits.
MAX_SHARED_ENQUEUES = 500
MAX_SHARED_WRITES = 200
MAX_SHARED_READS = 200
MAX_SHARED_COMMITS = 100
#: ``last_error`` of an item whose lease lapsed and was reaped.
LEASE_EXPIRED = "lease expired"
#: The most entries an item's error history keeps (``error_history``): the newest, one
#: per failure, reaped lease or cancel with a reason; an older one is dropped when a new
#: one would pass this, so an item retried forever never grows without bound.
MAX_ERROR_HISTORY = 20
#: The longest a failed item's retry may be put off, in seconds (30 days): ``Retry(delay)``
#: raised by a worker's handler and ``WorkQueue.fail(retry_in=)`` alike.
MAX_RETRY_DELAY = 30 * 86_400.0
#: The most rows (PostgreSQL) or records (Redis) one prune statement or script looks at
#: (``WorkQueue.prune``, ``StateStore.prune_runs``, a transaction history prune): a prune
#: of a million rows is many short steps, none holding the server for long.
PRUNE_BATCH = 500
#: After each batch ``WorkQueue.prune`` waits this many times as long as the batch took:
#: the pruner then holds the server at most a fifth of its time, so the workers draining
#: the queue meanwhile keep their throughput (docs/backings.md).
PRUNE_PAUSE = 4.0
#: The largest ``WorkItem.weight`` (e.g. a model call's tokens) and the largest concurrency
#: cap or rate a ``QueueLimits`` holds (``MAX_RATE_WEIGHT``: weight per period).
MAX_WEIGHT = 10_000_000
MAX_CAP = 1_000_000
MAX_RATE_WEIGHT = 2**40
#: The longest period of a ``Rate`` (one day) and the most keys ``QueueLimits`` names.
MAX_RATE_PERIOD = 86_400.0
MAX_LIMIT_KEYS = 1000
