"""The statements of ``PostgresWorkQueue``, one module per seam.

:mod:`.enqueue` (insert an item or a batch), :mod:`.claim` (the rotation and the
``FOR UPDATE SKIP LOCKED`` claims), :mod:`.settle` (fenced writes, the reaper, requeue
and cancel) and :mod:`.reads` (reads, stats, prune, the queue's control row); what they
share is in :mod:`._parts`. :class:`QueueStatements` holds every statement by name,
built once per table naming; :meth:`QueueStatements.map` turns the whole set into
another form (the driver's prepared statements) with every name still checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, Generic, TypeVar

from sqlalchemy import Select, Update

from statepact.storage.postgres._sql.queue import claim, enqueue, reads, settle
from statepact.storage.postgres.schema import Tables

__all__ = ["CoreStatement", "QueueStatements", "statements"]

#: A statement as built: a SELECT (with data-modifying CTEs) or an UPDATE.
CoreStatement = Select[Any] | Update

S = TypeVar("S")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class QueueStatements(Generic[S]):
    """Every statement of the queue, by name, each of type ``S``."""

    enqueue: S
    enqueue_many: S
    enqueue_new: S
    claim: S
    claim_many: S
    get_item: S
    heartbeat: S
    ack: S
    ack_many: S
    fail: S
    release: S
    requeue: S
    reap: S
    dead_letters: S
    purge_dead: S
    stats: S
    next_due: S

    @property
    def by_name(self) -> dict[str, S]:
        """Every statement under its name, in declaration order."""
        return {spec.name: getattr(self, spec.name) for spec in fields(self)}

    def map(self, convert: Callable[[S], T]) -> QueueStatements[T]:
        """The same set with each statement converted (compiled for the driver, say)."""
        converted = {name: convert(statement) for name, statement in self.by_name.items()}
        return QueueStatements(**converted)

    @staticmethod
    def build(tables: Tables) -> QueueStatements[CoreStatement]:
        work = tables.work
        return QueueStatements(
            enqueue=enqueue.enqueue(tables),
            enqueue_many=enqueue.enqueue_many(tables),
            enqueue_new=enqueue.enqueue_new(tables),
            claim=claim.claim(tables),
            claim_many=claim.claim_many(tables),
            get_item=reads.get_item(work),
            heartbeat=settle.heartbeat(tables),
            ack=settle.ack(work),
            ack_many=settle.ack_many(work),
            fail=settle.fail(tables),
            release=settle.release(tables),
            requeue=settle.requeue(tables),
            reap=settle.reap(tables),
            dead_letters=reads.dead_letters(work),
            purge_dead=reads.purge_dead(work),
            stats=reads.stats(work),
            next_due=reads.next_due(tables.queue_turns),
        )


@cache
def statements(tables: Tables) -> QueueStatements[CoreStatement]:
    """The statements of one table naming, built on first use."""
    return QueueStatements.build(tables)
