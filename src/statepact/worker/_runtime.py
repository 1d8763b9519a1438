"""What the worker's parts share while it runs: one :class:`Runtime`, and its :class:`Settings`.

The face (``_worker.py``) builds one ``Runtime`` at ``start()`` and hands it to
the claimer, the executors, the completer, the schedules and the maintenance
services. Each part reads the settings and the clock and touches only its own
fields (docs/worker.md, "The parts"): the executors add and remove themselves
from ``running``; the completer sets ``acks_sending``; anyone may set the three
events. This module must never touch the queue.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from statepact._codec import require_seconds
from statepact.clock import Clock, read_clock
from statepact.models import Lease, WorkItem
from statepact.queue import WorkQueue
from statepact.worker._hooks import HookSet

if TYPE_CHECKING:
    from statepact.worker._executor import Executor

__all__ = ["Runtime", "Settings", "require_concurrency", "require_timeout"]


def require_timeout(field: str, value: object) -> float | None:
    """A handler deadline: ``None`` (none), or seconds or a ``timedelta`` above 0."""
    return None if value is None else require_seconds(field, value)


def require_concurrency(value: object) -> int:
    """A worker's ``concurrency``: an int, 1 or more."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"concurrency: must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"concurrency: must be 1 or more, got {value}")
    return value


@dataclass(slots=True)
class Settings:
    """A worker's settings, checked by :meth:`read` when the worker is built."""

    concurrency: int
    lease_for: float
    heartbeat_every: float
    poll_interval: float
    reap_every: float
    grace_period: float
    timeout: float | None = None
    prune_every: float = 60.0

    @classmethod
    def read(
        cls,
        *,
        concurrency: object,
        lease_for: object,
        heartbeat_every: object,
        poll_interval: object,
        reap_every: object,
        grace_period: object,
        timeout: object = None,
        prune_every: object = 60.0,
    ) -> Settings:
        """Each setting checked, naming it. A duration is read by the rule the queue's calls
        read theirs with (``claim_batch``'s ``lease_for``, ``watch().wait``'s timeout), so
        what the queue would refuse later is refused here. ``heartbeat_every`` defaults to
        a third of ``lease_for``, ``reap_every`` to ``lease_for`` (0 turns the reaper off);
        ``timeout`` is the handlers' default deadline (``None``: none); ``prune_every``
        0 turns the pruner off."""
        lease = require_seconds("lease_for", lease_for)
        every = require_seconds(
            "heartbeat_every", lease / 3 if heartbeat_every is None else heartbeat_every
        )
        if every >= lease:
            raise ValueError(
                f"heartbeat_every: {every:g} s is not below lease_for {lease:g} s; a lease "
                "would lapse between heartbeats"
            )
        reap = lease if reap_every is None else reap_every
        return cls(
            concurrency=require_concurrency(concurrency),
            lease_for=lease,
            heartbeat_every=every,
            poll_interval=require_seconds("poll_interval", poll_interval),
            reap_every=require_seconds("reap_every", reap, allow_zero=True),
            grace_period=require_seconds("grace_period", grace_period, allow_zero=True),
            timeout=require_timeout("timeout", timeout),
            prune_every=require_seconds("prune_every", prune_every, allow_zero=True),
        )


class Runtime:
    """The one object a running worker's parts share.

    ``running`` holds one :class:`~statepact.worker._executor.Executor` per lease in
    flight (its handler runs, or its fail or release is on its way); an executor is
    its own key, so two leases of one item (a lapsed one and the one that replaced it)
    are two entries, and ``newest`` names the latest per item. ``acks_sending`` is the
    completer's ``ack_many`` in flight, which takes a slot as an item does. ``stopping``
    ends every loop; ``work`` says something may be due now (a tick enqueued, a reap);
    ``slot_freed`` wakes the claimer when a slot may be free.
    """

    __slots__ = (
        "acks_sending",
        "clock",
        "context",
        "hooks",
        "newest",
        "queue",
        "running",
        "settings",
        "slot_freed",
        "stopping",
        "work",
        "worker_id",
    )

    def __init__(
        self, queue: WorkQueue, worker_id: str, settings: Settings, clock: Clock, hooks: HookSet
    ) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.settings = settings
        self.clock = clock
        self.hooks = hooks
        # What the worker's startup returned: every job's ``context``.
        self.context: Any = None
        self.running: set[Executor] = set()
        self.newest: dict[tuple[str, str], Executor] = {}
        self.acks_sending = False
        self.stopping = asyncio.Event()
        self.work = asyncio.Event()
        self.slot_freed = asyncio.Event()

    def fields(self, item: WorkItem | None = None, task: str | None = None) -> dict[str, object]:
        """The ``extra`` of a worker log record: worker id and queue, and the item's tenant,
        id and task when it is about one (the CLI's text and JSON logs print them)."""
        found: dict[str, object] = {"worker_id": self.worker_id, "queue": self.queue.name}
        if item is not None:
            found.update(tenant=item.tenant, item_id=item.item_id, task=task)
        return found

    def busy(self) -> int:
        """Slots taken: leases in flight, plus one while the completer sends. So a worker
        claims again while its acks are on their way, and holds at most one connection per
        slot."""
        return len(self.running) + self.acks_sending

    def expired(self, lease: Lease) -> str | None:
        """Why ``lease`` is lost by the worker's clock (its expiry passed), or ``None``."""
        now = read_clock(self.clock)
        if now >= lease.expires_at:
            return f"lease expired at {lease.expires_at.isoformat()} (now {now.isoformat()})"
        return None
