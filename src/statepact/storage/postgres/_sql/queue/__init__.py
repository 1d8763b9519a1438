"""The statements of ``PostgresWorkQueue``, one module per seam.

:mod:`.enqueue` (insert an item or a batch), :mod:`.claim` (the rotation and the
``FOR UPDATE SKIP LOCKED`` claims), :mod:`.settle` (fenced writes, the reaper, requeue
and cancel), :mod:`.reads` (reads, stats) and :mod:`.maintain` (purge, prune, pause);
what they share is in :mod:`._parts`. :class:`QueueStatements` holds every statement by name,
built once per table naming; :meth:`QueueStatements.map` turns the whole set into
another form (the driver's prepared statements) with every name still checked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, Generic, TypeVar

from sqlalchemy import CompoundSelect, Select, Update

from statepact.storage.postgres._sql.queue import (
    claim,
    enqueue,
    flow,
    maintain,
    reads,
    settle,
)
from statepact.storage.postgres.schema import Tables

__all__ = ["CoreStatement", "QueueStatements", "statements"]

#: A statement as built: a SELECT (with data-modifying CTEs, or a UNION) or an UPDATE.
CoreStatement = Select[Any] | CompoundSelect[Any] | Update

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
    error_history: S
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
    slot_holder: S
    cancel_many: S
    prune: S
    prune_lock: S
    prune_unlock: S
    set_paused: S
    paused: S
    set_limits: S
    limits: S
    count_prunable: S
    dead_letters_all: S
    queue_names: S
    oldest_ready: S
    finished_counts: S
    flow_state: S
    flow_state_locked: S
    flow_flush: S
    flow_save: S
    flow_turns: S
    flow_pick_head: S
    flow_pick_tenant: S
    flow_claim: S

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
            error_history=reads.error_history(work),
            heartbeat=settle.heartbeat(tables),
            ack=settle.ack(work),
            ack_many=settle.ack_many(work),
            fail=settle.fail(tables),
            release=settle.release(tables),
            requeue=settle.requeue(tables),
            reap=settle.reap(tables),
            dead_letters=reads.dead_letters(work),
            purge_dead=maintain.purge_dead(tables),
            stats=reads.stats(work),
            next_due=reads.next_due(tables.queue_turns, tables.queue_control),
            slot_holder=reads.slot_holder(work),
            cancel_many=settle.cancel_many(tables),
            prune=maintain.prune(tables),
            prune_lock=maintain.prune_lock(tables.queue_control),
            prune_unlock=maintain.prune_unlock(tables.queue_control),
            set_paused=maintain.set_paused(tables.queue_control),
            paused=maintain.paused(tables.queue_control),
            set_limits=maintain.set_limits(tables.queue_control),
            limits=maintain.limits(tables.queue_control),
            count_prunable=reads.count_prunable(work),
            dead_letters_all=reads.dead_letters_all(work),
            queue_names=reads.queue_names(work),
            oldest_ready=reads.oldest_ready(tables.queue_turns, work),
            finished_counts=reads.finished_counts(work),
            flow_state=flow.state(tables.queue_control),
            flow_state_locked=flow.state_locked(tables.queue_control),
            flow_flush=flow.flush(),
            flow_save=flow.save(tables.queue_control),
            flow_turns=flow.turns_ahead(tables),
            flow_pick_head=flow.pick_head(tables),
            flow_pick_tenant=flow.pick_tenant(tables),
            flow_claim=flow.claim_item(tables),
        )


@cache
def statements(tables: Tables) -> QueueStatements[CoreStatement]:
    """The statements of one table naming, built on first use."""
    return QueueStatements.build(tables)
