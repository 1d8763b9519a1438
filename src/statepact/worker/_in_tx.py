"""``job.complete_in(session)``: the item's fenced ack inside the handler's own transaction.

The executor owns one :class:`InTransaction` per job. ``complete(session)``
stops the job's heartbeats (a beat from another connection would wait on the
row the ack locked and then find the item done: a lease reported lost for an
item that succeeded), runs ``queue.bound(session).ack(lease)`` and listens to
SQLAlchemy for the end of that transaction: ``after_commit`` / ``after_rollback``
on an ``AsyncSession``'s sync session, ``commit`` / ``rollback`` on an
``AsyncConnection``'s sync connection (these fire as the commit is sent, so a
commit the server then refuses reaches the handler as an error, and the worker
settles that attempt as a failure). A rollback puts the job back where it was:
heartbeats resume and ``complete`` may be called again in a new transaction.

What the executor reads at the end is :attr:`InTransaction.state`. Only a
queue with a ``bound`` form over an async SQLAlchemy session can do this
(PostgreSQL); Redis and memory are refused naming what to do instead. See
docs/worker.md, "Completing in your transaction". This module must never
commit, roll back or begin the caller's transaction.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from typing import Any

from statepact.models import Lease, WorkItem
from statepact.queue import WorkQueue

__all__ = ["InTransaction", "TxState"]


class TxState(enum.Enum):
    """What the transaction ``complete_in`` joined has done so far."""

    NONE = "complete_in was not called, or its transaction was rolled back"
    PENDING = "the ack is in the transaction, which has not ended"
    COMMITTING = "the connection sent its commit"
    COMMITTED = "the session committed"
    ROLLED_BACK = "the transaction was rolled back"


class InTransaction:
    """One job's ``complete_in``: the bound ack and what the caller's transaction did."""

    __slots__ = ("_hold", "_listeners", "_resume", "item", "rollbacks", "state")

    def __init__(self, hold: Callable[[], Awaitable[None]], resume: Callable[[], None]) -> None:
        # hold(): stop heartbeats and wait for the one in flight; resume(): start them again.
        self._hold = hold
        self._resume = resume
        self.state = TxState.NONE
        self.item: WorkItem | None = None
        self.rollbacks = 0
        self._listeners: list[tuple[Any, str, Callable[..., None]]] = []

    async def complete(
        self, queue: WorkQueue, lease: Callable[[], Lease], session: object
    ) -> WorkItem:
        bound = getattr(queue, "bound", None)
        if bound is None:
            raise TypeError(
                f"job.complete_in: a {type(queue).__name__} cannot join an SQL transaction "
                "(only PostgresWorkQueue can). Make the handler's writes idempotent, keyed by "
                "job.item.item_id, and return: the worker acks after they are done"
            )
        from sqlalchemy import event
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

        if isinstance(session, AsyncSession):
            target: Any = session.sync_session
            hooks = {"after_commit": self._committed, "after_rollback": self._rolled_back}
        elif isinstance(session, AsyncConnection):
            target = session.sync_connection
            hooks = {"commit": self._commit_sent, "rollback": self._rolled_back}
        else:
            raise TypeError(
                "job.complete_in: session must be an SQLAlchemy AsyncSession or AsyncConnection "
                f"inside a transaction the handler began, got {type(session).__name__}"
            )
        if self.state in (TxState.PENDING, TxState.COMMITTING, TxState.COMMITTED):
            raise RuntimeError(
                f"job.complete_in: called again for item {lease().item.item_id!r}, whose ack is "
                f"already in a transaction ({self.state.value})"
            )
        await self._hold()
        try:
            done = await bound(session).ack(lease())
        except BaseException:
            self._resume()
            raise
        self.detach()
        for name, function in hooks.items():
            event.listen(target, name, function)
            self._listeners.append((target, name, function))
        self.state = TxState.PENDING
        self.item = done
        assert isinstance(done, WorkItem)
        return done

    def detach(self) -> None:
        """Stop listening to the transaction (once the job is settled, or before a new one)."""
        if not self._listeners:
            return
        from sqlalchemy import event

        for target, name, function in self._listeners:
            if event.contains(target, name, function):
                event.remove(target, name, function)
        self._listeners.clear()

    # SQLAlchemy calls these from inside the commit or rollback, in the handler's task.

    def _committed(self, *_: object) -> None:
        if self.state is TxState.PENDING:
            self.state = TxState.COMMITTED

    def _commit_sent(self, *_: object) -> None:
        if self.state is TxState.PENDING:
            self.state = TxState.COMMITTING

    def _rolled_back(self, *_: object) -> None:
        if self.state in (TxState.PENDING, TxState.COMMITTING):
            self.state = TxState.ROLLED_BACK
            self.item = None
            self.rollbacks += 1
            self._resume()
