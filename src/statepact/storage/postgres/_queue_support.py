"""What ``PostgresWorkQueue``'s methods share: the shapes of its executors and
connections, a stored row read back as a ``WorkItem``, the parameters several
statements take, and the prune loop.

Nothing here builds SQL (``_sql/queue/`` does) or decides a retry or the dead letter.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from sqlalchemy.engine import RowMapping

from statepact._cancel import finish
from statepact._codec import decode_json
from statepact._limits import PRUNE_PAUSE
from statepact.clock import Clock, read_clock
from statepact.models import ItemStatus, WorkItem, stored
from statepact.storage.postgres._client import Executor
from statepact.storage.postgres._direct import Prepared
from statepact.storage.postgres._sql.queue import CoreStatement, QueueStatements

__all__ = [
    "PRUNE_LEASE",
    "Conn",
    "Statements",
    "cutoff_params",
    "item_of",
    "item_or_none",
    "optional_json",
    "prune",
]

#: How long a pruner's lease on a queue lasts past each batch: far above one batch, so
#: only a pruner that died leaves it to lapse.
PRUNE_LEASE = timedelta(seconds=60)

#: The statements a queue runs: Core expressions, or compiled once for the driver.
Statements = QueueStatements[CoreStatement] | QueueStatements[Prepared]

T = TypeVar("T")


class Conn(Protocol):
    """What a call's work runs its statements on: an ``AsyncConnection`` or ``AsyncSession``
    (Core statements) or the driver's connection (``_direct.Statements``, prepared ones)."""

    async def execute(self, statement: Any, parameters: Any = None) -> Any: ...


def item_or_none(row: RowMapping | None) -> WorkItem | None:
    return None if row is None else item_of(row)


def item_of(row: RowMapping) -> WorkItem:
    # Read from this queue's own table: every field is of its type already, built in the
    # model's order without validating it again.
    return stored(
        WorkItem,
        {
            "tenant": row["tenant"],
            "item_id": row["item_id"],
            "payload": decode_json(row["payload"]),
            "queue": row["queue"],
            "priority": row["priority"],
            "available_at": row["available_at"],
            "attempts": row["attempts"],
            "status": ItemStatus(row["status"]),
            "last_error": row["last_error"],
            "created_at": row["created_at"],
            "updated_at": row["updated_at"],
            "unique_key": row["unique_key"],
            "unique_for": row["unique_for"],
            "timeout": row["timeout"],
            "limit_key": row["limit_key"],
            "weight": row["weight"],
        },
    )


def cutoff_params(cutoffs: Mapping[ItemStatus, datetime]) -> dict[str, datetime | None]:
    """The per-status cutoffs of prune and its count; a status without one (kept
    forever) is NULL, which no ``updated_at`` is before."""
    return {
        "p_done_before": cutoffs.get(ItemStatus.DONE),
        "p_cancelled_before": cutoffs.get(ItemStatus.CANCELLED),
        "p_dead_before": cutoffs.get(ItemStatus.DEAD),
    }


def optional_json(values: Sequence[str | float | None]) -> str | None:
    """A batch's optional column as one JSON text, ``null`` where unset; ``None`` (no array
    to read: every item's is NULL) when none is set."""
    if values.count(None) == len(values):
        return None
    return json.dumps(values, allow_nan=False, separators=(",", ":"))


async def prune(
    executor: Executor,
    sql: Statements,
    *,
    queue: str,
    clock: Clock,
    now: datetime,
    cutoffs: Mapping[ItemStatus, datetime],
    batch: int,
) -> int:
    """``PostgresWorkQueue._prune``: take the queue's pruner lease (0 at once when another
    pruner holds it), delete finished items past ``cutoffs`` a batch per statement until
    a batch comes back short or the lease is lost, and give the lease back, even when
    cancelled (if it cannot be, it lapses)."""
    pruner = uuid.uuid4().hex
    lease = {"p_queue": queue, "p_pruner": pruner}

    async def take(conn: Conn) -> bool:
        until = {**lease, "p_now": now, "p_until": now + PRUNE_LEASE}
        return (await conn.execute(sql.prune_lock, until)).first() is not None

    if not await executor.run(take, idempotent=False):
        return 0  # another process is pruning this queue
    pruned = 0
    try:
        params = {**lease, "p_batch": batch, **cutoff_params(cutoffs)}
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            # Each batch is its own statement (and transaction, outside a caller's):
            # the lease is extended from the clock's reading as it goes.
            step = {**params, "p_until": read_clock(clock) + PRUNE_LEASE}

            async def one(conn: Conn, step: dict[str, Any] = step) -> tuple[int, int]:
                row = (await conn.execute(sql.prune, step)).first()
                return int(row[0]), int(row[1])

            deleted, held = await executor.run(one, idempotent=True)
            pruned += deleted
            if not held or deleted < batch:
                return pruned
            await asyncio.sleep(PRUNE_PAUSE * (loop.time() - started))
    finally:

        async def give_back(conn: Conn) -> None:
            await conn.execute(sql.prune_unlock, lease)

        # Given back even when cancelled; if it cannot be, it lapses.
        await finish(executor.run(give_back, idempotent=True))
