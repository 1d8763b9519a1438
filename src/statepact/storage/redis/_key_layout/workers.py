"""The worker registry's key."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WorkerKeys"]


@dataclass(frozen=True, slots=True)
class WorkerKeys:
    """The worker registry's one key (``statepact.dashboard.workers``).

    ``<ns>:workers``: a hash, worker id -> the worker's JSON record (with its
    ``last_seen`` and ``ttl_seconds``); the key itself expires when no worker
    has beaten for longer than the longest time to live.
    """

    namespace: str

    @property
    def registry(self) -> str:
        return f"{self.namespace}:workers"
