"""The task registry: which handler runs an item, by the task its payload names.

Handlers are registered by name (at most one default, for items naming no task);
each is checked to be a coroutine function when it is added. Routing reads the
payload's task field once per item. See docs/worker.md, "Handlers and routing".
This module must never touch the queue.
"""

from __future__ import annotations

from statepact.models import Lease
from statepact.worker._job import Handler, Job, check_handler

__all__ = ["Tasks"]


class Tasks:
    """A worker's handlers by task name, and its default handler."""

    __slots__ = ("_default", "_field", "_handlers", "_timeouts")

    def __init__(self, task_field: str) -> None:
        if not isinstance(task_field, str) or not task_field:
            raise ValueError(f"task_field: must be a non-empty str, got {task_field!r}")
        self._field = task_field
        self._handlers: dict[str, Handler] = {}
        self._timeouts: dict[str, float] = {}
        self._default: Handler | None = None

    @property
    def field(self) -> str:
        return self._field

    @property
    def names(self) -> tuple[str, ...]:
        """The registered task names, sorted."""
        return tuple(sorted(self._handlers))

    def __bool__(self) -> bool:
        """Whether any handler (a task's or the default) is registered."""
        return bool(self._handlers) or self._default is not None

    def add(self, name: str, handler: Handler, timeout: float | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"task name: must be a non-empty str, got {name!r}")
        checked = check_handler(name, handler)
        if name in self._handlers:
            raise ValueError(f"task {name!r}: a handler is already registered under this name")
        self._handlers[name] = checked
        if timeout is not None:
            self._timeouts[name] = timeout

    def timeout(self, job: Job, default: float | None) -> float | None:
        """The seconds ``job``'s handler may run: the item's own ``timeout``, else its task's,
        else ``default`` (the worker's); ``None``: no deadline."""
        if job.item.timeout is not None:
            return job.item.timeout
        if job.task is not None and job.task in self._timeouts:
            return self._timeouts[job.task]
        return default

    def set_default(self, handler: Handler) -> None:
        checked = check_handler("(default)", handler)
        if self._default is not None:
            raise ValueError("default handler: one is already registered")
        self._default = checked

    def route(self, lease: Lease, worker_id: str) -> tuple[Job, Handler | str]:
        """The job for ``lease`` and its handler, or why there is none (the item is
        dead-lettered on its first try, naming the task, the field and the tasks known)."""
        raw = lease.item.payload.get(self._field)
        job = Job(lease=lease, task=raw if isinstance(raw, str) else None, worker_id=worker_id)
        if raw is None:
            if self._default is not None:
                return job, self._default
            return job, (
                f"payload has no {self._field!r} field and this worker has no default "
                f"handler; tasks registered: {', '.join(self.names) or 'none'}"
            )
        handler = self._handlers.get(raw) if isinstance(raw, str) else None
        if handler is not None:
            return job, handler
        return job, (
            f"unknown task {raw!r} (payload field {self._field!r}); "
            f"tasks registered: {', '.join(self.names) or 'none'}"
        )
