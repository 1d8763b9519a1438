"""What every backing package shares: the :class:`Backing` its ``open_backing`` returns.

Each backing package (``statepact.storage.memory``, ``.redis``, ``.postgres``)
has one ``open_backing(settings, *, clock=None, policy=None)`` that opens its
state store, work queue and transaction backend through their ``open()`` and
hands them back together, with a ``TransactionManager`` on the backend, by
:func:`assemble_backing`. See docs/backings.md and docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from statepact._cancel import finish
from statepact.clock import Clock, SystemClock
from statepact.queue import WorkQueue
from statepact.state import StateStore
from statepact.tx import StorageBackend, TransactionManager

__all__ = ["Backing", "assemble_backing"]

S = TypeVar("S", bound=StateStore)
Q = TypeVar("Q", bound=WorkQueue)
B = TypeVar("B", bound=StorageBackend)


@dataclass(frozen=True, eq=False)
class Backing(Generic[S, Q, B]):
    """The three protocols on one backing, opened together by its ``open_backing``.

    ``state``, ``queue`` and ``backend`` are the backing's own classes (so
    ``backing.state.bound(conn)`` type-checks on PostgreSQL); ``manager`` is a
    ``TransactionManager`` on ``backend``, on the same clock. ``client`` is the
    server client under them (a redis-py client, an SQLAlchemy ``AsyncEngine``;
    ``None`` in memory). Use it as ``async with await open_backing(...) as
    backing:`` or call :meth:`close`: it closes the transaction backend, and
    the client when ``open_backing`` built it (a client you passed stays yours).
    """

    state: S
    queue: Q
    backend: B
    manager: TransactionManager
    client: Any = None
    close_client: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)

    async def close(self) -> None:
        """Close the transaction backend, then the client if it is this backing's; finished
        even if the caller is cancelled meanwhile."""
        await finish(self._close())

    async def _close(self) -> None:
        try:
            await self.manager.close()
        finally:
            if self.close_client is not None:
                await self.close_client()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()


async def assemble_backing(
    *,
    state: Callable[[Clock], Awaitable[S]],
    queue: Callable[[Clock], Awaitable[Q]],
    backend: Callable[[Clock], Awaitable[B]],
    clock: Clock | None,
    max_value_bytes: int,
    client: Any = None,
    close_client: Callable[[], Awaitable[None]] | None = None,
) -> Backing[S, Q, B]:
    """Open the state store, the work queue and the transaction backend in turn, on one clock
    (``clock``, else a ``SystemClock``), and put a ``TransactionManager`` on the backend.

    Each of ``state``, ``queue`` and ``backend`` opens one of them (its class's
    ``open()``). ``close_client`` closes the client when the backing owns it. If
    an opening fails, it runs (cancellation-safe) and the error is raised: the
    stores hold nothing of their own, and the backend is opened last.
    """
    shared = clock or SystemClock()
    try:
        opened_state = await state(shared)
        opened_queue = await queue(shared)
        opened_backend = await backend(shared)
    except BaseException:
        if close_client is not None:
            await finish(close_client())
        raise
    manager = TransactionManager(opened_backend, clock=shared, max_value_bytes=max_value_bytes)
    return Backing(
        state=opened_state,
        queue=opened_queue,
        backend=opened_backend,
        manager=manager,
        client=client,
        close_client=close_client,
    )
