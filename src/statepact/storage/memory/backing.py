"""``open_backing``: the memory state store, work queue and transaction backend together."""

from __future__ import annotations

from statepact.clock import Clock
from statepact.queue import QueuePolicy
from statepact.settings import MemoryStoreSettings
from statepact.storage import Backing, assemble_backing
from statepact.storage.memory.backend import MemoryBackend
from statepact.storage.memory.queue import MemoryWorkQueue
from statepact.storage.memory.state import MemoryStateStore

__all__ = ["open_backing"]


async def open_backing(
    settings: MemoryStoreSettings | None = None,
    *,
    clock: Clock | None = None,
    policy: QueuePolicy | None = None,
) -> Backing[MemoryStateStore, MemoryWorkQueue, MemoryBackend]:
    """A ``MemoryStateStore``, a ``MemoryWorkQueue`` (``policy``) and a ``MemoryBackend``
    under a ``TransactionManager``, all on ``clock`` (else one ``SystemClock``) and
    ``settings``. Close it (or use it as ``async with``) when done."""
    settings = settings or MemoryStoreSettings()
    return await assemble_backing(
        state=lambda clock: MemoryStateStore.open(clock=clock, settings=settings),
        queue=lambda clock: MemoryWorkQueue.open(clock=clock, settings=settings, policy=policy),
        backend=lambda clock: MemoryBackend.open(clock=clock, settings=settings),
        clock=clock,
        max_value_bytes=settings.max_value_bytes,
    )
