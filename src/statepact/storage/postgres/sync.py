"""``bound(session)`` on a sync SQLAlchemy ``Session``, ``Connection`` or ``scoped_session``:
blocking writes in the caller's transaction.

Flask and most SQLAlchemy applications run sync sessions (psycopg, or any sync
driver SQLAlchemy has). ``PostgresStateStore.bound(session)`` and
``PostgresWorkQueue.bound(session)`` given one return :class:`SyncBoundStateStore`
or :class:`SyncBoundWorkQueue`, whose methods are plain calls: each runs the async
bound form's own code (the front's validation, encoding and clock, the backing's
statements from ``_sql/``, the ``BoundExecutor``'s refusals of use out of turn and
its error translation) with the session's ``execute`` answering at once, so the
coroutine never waits and is run to its end here, on no event loop. There is one
copy of every statement and rule: this module only adapts the calls.

What it must never do: begin, commit, roll back or retry the caller's transaction,
wait on an event loop, or hold a second copy of a statement or a check. See
docs/backings.md#inside-your-transaction-bound and docs/adopting.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, scoped_session

from statepact.models import RunRecord, SessionRecord, WorkItem
from statepact.storage.postgres._client import BoundExecutor

if TYPE_CHECKING:
    from statepact.storage.postgres.queue import PostgresWorkQueue
    from statepact.storage.postgres.state import PostgresStateStore

__all__ = ["SyncBoundStateStore", "SyncBoundWorkQueue", "SyncSession"]

#: What a sync bound form takes: a ``Session``, a ``Connection``, or a ``scoped_session``
#: (Flask-SQLAlchemy's ``db.session``), which stands for this thread's ``Session``.
SyncSession = Session | Connection | scoped_session[Any]

T = TypeVar("T")
F = TypeVar("F")


def _blocking(call: Coroutine[Any, Any, T]) -> T:
    """Run ``call`` to its end here: it never waits, since every statement it sends goes
    through a sync session's ``execute``, which answers before returning."""
    try:
        call.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    call.close()
    # Only a change that made a bound call wait (a lock, a sleep) gets here.
    raise RuntimeError("a sync bound call waited on an event loop; nothing more was sent")


class _Runner:
    """A sync session seen as what a store's work runs statements on."""

    __slots__ = ("_session",)

    def __init__(self, session: Session | Connection) -> None:
        self._session = session

    async def execute(self, statement: Any, parameters: Any = None) -> Any:
        return self._session.execute(statement, parameters)


class _SyncBoundExecutor(BoundExecutor):
    """``BoundExecutor``'s turn checks and error translation, over a sync session."""

    def __init__(self, session: Session | Connection, replaced: BoundExecutor) -> None:
        # The failures (what the store is called, its unavailable error) of the executor
        # the async bound form was given; the target is the caller's sync session.
        self._target: Any = session
        self._kind = type(session).__name__
        self._failures = replaced._failures
        self._runner = _Runner(session)

    def _check_turn(self) -> None:
        target = self._target
        if isinstance(target, Connection):
            try:
                closed, invalidated = target.closed, target.invalidated
            except sa_exc.InvalidRequestError as exc:
                raise self._refuse("is closed") from exc
            if closed:
                raise self._refuse("is closed")
            if invalidated:
                raise self._refuse(
                    "lost its server connection inside the transaction (an earlier call "
                    "raised); roll the transaction back and run it again"
                )
        super()._check_turn()

    async def run(
        self,
        work: Callable[[Any], Awaitable[T]],
        *,
        idempotent: bool,
        resend_safe: bool = False,
        abandonable: bool = False,
    ) -> T:
        runner = self._runner
        return await super().run(
            lambda _target: work(runner),
            idempotent=idempotent,
            resend_safe=resend_safe,
            abandonable=abandonable,
        )


def _on_sync_session(front: F, session: SyncSession) -> F:
    """The async bound form of ``front`` (its statements, no shared round trips), built
    as ``bound()`` builds it, with its executor then run over ``session`` (a
    ``scoped_session``: the calling thread's ``Session``, as it is now)."""
    target = session() if isinstance(session, scoped_session) else session
    clone = front.bound(AsyncSession())  # type: ignore[attr-defined]  # never sent a statement
    clone._executor = _SyncBoundExecutor(target, clone._executor)
    return clone  # type: ignore[no-any-return]


class SyncBoundStateStore:
    """``PostgresStateStore.bound(session)`` for a sync ``Session`` or ``Connection``: the
    writes an application makes inside its own transaction, as blocking calls.

    Each does what the ``await``-ed call of the async bound form does, with the same
    validation, errors and refusals (``OutOfTurnError`` for a session not inside a
    transaction the caller began, closed, failed or in use by another call).
    """

    __slots__ = ("_store",)

    def __init__(self, store: PostgresStateStore, session: SyncSession) -> None:
        self._store = _on_sync_session(store, session)

    def __repr__(self) -> str:
        return f"SyncBoundStateStore(runs={self._store.tables.runs.name!r})"

    def put_run(self, record: RunRecord) -> RunRecord:
        """``StateStore.put_run``, inside the session's transaction."""
        return _blocking(self._store.put_run(record))

    def patch_run(
        self,
        tenant: str,
        run_id: str,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost: Decimal | int | str = 0,
        iterations: int = 0,
        cursor: int = 0,
    ) -> RunRecord:
        """``StateStore.patch_run``, inside the session's transaction."""
        return _blocking(
            self._store.patch_run(
                tenant,
                run_id,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cost=cost,
                iterations=iterations,
                cursor=cursor,
            )
        )

    def put_session(self, record: SessionRecord) -> SessionRecord:
        """``StateStore.put_session``, inside the session's transaction."""
        return _blocking(self._store.put_session(record))


class SyncBoundWorkQueue:
    """``PostgresWorkQueue.bound(session)`` for a sync ``Session`` or ``Connection``: the
    enqueues and cancels an application makes inside its own transaction, as blocking
    calls.

    The same validation, errors and refusals as the async bound form; an enqueue's
    notification is part of the transaction, so a worker listening on the queue
    wakes when the caller commits (never for a rollback).
    """

    __slots__ = ("_queue",)

    def __init__(self, queue: PostgresWorkQueue, session: SyncSession) -> None:
        self._queue = _on_sync_session(queue, session)

    def __repr__(self) -> str:
        return f"SyncBoundWorkQueue(name={self._queue.name!r})"

    @property
    def name(self) -> str:
        return self._queue.name

    def enqueue(self, item: WorkItem, *, delay: float | timedelta | None = None) -> WorkItem:
        """``WorkQueue.enqueue``, inside the session's transaction."""
        return _blocking(self._queue.enqueue(item, delay=delay))

    def enqueue_many(
        self,
        items: Sequence[WorkItem | Mapping[str, Any]],
        *,
        delay: float | timedelta | None = None,
    ) -> list[WorkItem]:
        """``WorkQueue.enqueue_many``, inside the session's transaction."""
        return _blocking(self._queue.enqueue_many(items, delay=delay))

    def cancel(self, tenant: str, item_id: str, *, reason: str | None = None) -> WorkItem | None:
        """``WorkQueue.cancel``, inside the session's transaction: the item is cancelled (and
        a worker running it told) when the caller commits, never for a rollback."""
        return _blocking(self._queue.cancel(tenant, item_id, reason=reason))

    def cancel_many(
        self, tenant: str, item_ids: Sequence[str], *, reason: str | None = None
    ) -> list[WorkItem | None]:
        """``WorkQueue.cancel_many``, inside the session's transaction."""
        return _blocking(self._queue.cancel_many(tenant, item_ids, reason=reason))
