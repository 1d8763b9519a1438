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
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

from sqlalchemy.engine import RowMapping

from statepact._cancel import finish
from statepact._codec import decode_json
from statepact._limits import PRUNE_BATCH, PRUNE_PAUSE
from statepact.clock import Clock, read_clock
from statepact.models import ItemStatus, WorkItem, stored
from statepact.storage.postgres._client import Executor
from statepact.storage.postgres._direct import Prepared
from statepact.storage.postgres._sql.queue import CoreStatement, QueueStatements

__all__ = [
    "PRUNE_LEASE",
    "PRUNE_MAX_BATCH",
    "PRUNE_MIN_BATCH",
    "PRUNE_STEP",
    "Conn",
    "Statements",
    "cutoff_params",
    "item_of",
    "item_or_none",
    "next_batch",
    "optional_json",
    "prune",
]

#: How long a pruner's lease on a queue lasts past each batch: far above one batch, so
#: only a pruner that died leaves it to lapse.
PRUNE_LEASE = timedelta(seconds=60)
#: What one prune statement should take, in seconds (the round trip included): the step
#: shrinks after a slow one toward it, so a busy server gets smaller steps and the
#: slowest stays far under 100 ms; never past ``PRUNE_BATCH`` rows, whose work a
#: stall of the whole server multiplies (docs/benchmarks.md#retention-under-load).
PRUNE_STEP = 0.01
#: The bounds of a prune step, in rows.
PRUNE_MIN_BATCH = 50
PRUNE_MAX_BATCH = PRUNE_BATCH
#: Where a status's first step starts: before every ``updated_at``.
_EARLIEST = datetime(1, 1, 2, tzinfo=UTC)

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
    pruner holds it), delete each status's finished items past its cutoff, oldest first,
    a step per statement, each from where the one before reached, until a step comes
    back short or the lease is lost, and give the lease back, even when cancelled (if it
    cannot be, it lapses).

    The first step takes ``batch`` rows; each next one is sized so that a step takes
    about ``PRUNE_STEP`` seconds (within ``PRUNE_MIN_BATCH``..``PRUNE_MAX_BATCH``, at most
    doubling or halving at once), and after each the pruner waits ``PRUNE_PAUSE`` times
    as long as it took."""
    pruner = uuid.uuid4().hex
    lease = {"p_queue": queue, "p_pruner": pruner}

    async def take(conn: Conn) -> bool:
        until = {**lease, "p_now": now, "p_until": now + PRUNE_LEASE}
        return (await conn.execute(sql.prune_lock, until)).first() is not None

    if not await executor.run(take, idempotent=False):
        return 0  # another process is pruning this queue
    pruned = 0
    try:
        loop = asyncio.get_running_loop()
        size, pause = batch, 0.0
        for status, cutoff in cutoffs.items():
            after = _EARLIEST
            while True:
                await asyncio.sleep(pause)
                # Each step is its own statement (and transaction, outside a caller's):
                # the lease is extended from the clock's reading as it goes.
                step = {
                    **lease,
                    **cutoff_params({status: cutoff}),
                    "p_batch": size,
                    "p_after": after,
                    "p_until": read_clock(clock) + PRUNE_LEASE,
                    # Each step its own transaction: it need not wait for its WAL flush.
                    # Inside a caller's transaction the commit is the caller's.
                    "p_commit": None if executor.bound else "off",
                }

                async def one(conn: Conn, step: dict[str, Any] = step) -> Any:
                    return (await conn.execute(sql.prune, step)).first()

                started = loop.time()
                deleted, held, reached = await executor.run(one, idempotent=True)
                took = loop.time() - started
                pruned += int(deleted)
                if not held:
                    return pruned
                pause = PRUNE_PAUSE * took
                if deleted < size or reached is None:
                    break
                after = reached
                size = next_batch(size, took)
        return pruned
    finally:

        async def give_back(conn: Conn) -> None:
            await conn.execute(sql.prune_unlock, lease)

        # Given back even when cancelled; if it cannot be, it lapses.
        await finish(executor.run(give_back, idempotent=True))


def next_batch(size: int, took: float) -> int:
    """The size of the prune step after one of ``size`` rows that took ``took`` seconds:
    what would take ``PRUNE_STEP``, at most twice or half ``size``, within the bounds."""
    scaled = size * min(2.0, max(0.5, PRUNE_STEP / max(took, 1e-6)))
    return max(PRUNE_MIN_BATCH, min(PRUNE_MAX_BATCH, round(scaled)))
