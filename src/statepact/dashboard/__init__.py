"""The operator's dashboard: an ASGI application over a backing, and ``/metrics``.

``create_app(backing)`` returns a Starlette application to mount inside your own
FastAPI/Starlette app, behind your own auth; ``statepact dashboard`` serves it
standalone. ``metrics_app`` serves the Prometheus text alone. Workers announce
themselves to the workers page with :func:`start_presence`
(``statepact.dashboard.workers``). See docs/dashboard.md.

Importing this package does not import starlette or jinja2 (the ``dashboard``
extra): ``create_app`` and ``metrics_app`` import them when called, so a worker
that only announces itself never needs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from statepact.dashboard.workers import (
    WorkerInfo,
    WorkerRegistry,
    registry_for,
    start_presence,
)
from statepact.queue import WorkQueue

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from statepact.clock import Clock

__all__ = [
    "WorkerInfo",
    "WorkerRegistry",
    "create_app",
    "metrics_app",
    "registry_for",
    "start_presence",
]


def create_app(
    backing: Any,
    *,
    read_only: bool = False,
    queues: Sequence[WorkQueue] | Mapping[str, WorkQueue] | None = None,
    token: str | None = None,
    where: str = "",
    registry: WorkerRegistry | None = None,
    clock: Clock | None = None,
    csrf_secret: bytes | None = None,
    metric_tenants: Sequence[str] = (),
) -> Starlette:
    """The dashboard over ``backing`` (what an ``open_backing`` returned): its queue,
    its state store, and the worker registry beside its queue.

    ``queues`` adds (or, as a mapping, names) more queues on the same server.
    ``read_only`` turns every action off. ``token``, when given, is required on
    every request (``Authorization: Bearer`` or Basic with it as the password);
    leave it ``None`` when your application's auth stands in front. ``where`` is
    shown in the header (any password in it is masked). ``metric_tenants`` are the
    tenants whose run totals ``/metrics`` reports.
    """
    from statepact.dashboard.app import build_app

    named: dict[str, WorkQueue] = {}
    if backing is not None:
        named[backing.queue.name] = backing.queue
    if isinstance(queues, Mapping):
        named.update(queues)
    elif queues is not None:
        named.update({queue.name: queue for queue in queues})
    return build_app(
        queues=named,
        state=None if backing is None else backing.state,
        registry=registry,
        clock=clock,
        read_only=read_only,
        token=token,
        where=where,
        csrf_secret=csrf_secret,
        metric_tenants=metric_tenants,
    )


def metrics_app(
    backing: Any,
    *,
    queues: Sequence[WorkQueue] | None = None,
    registry: WorkerRegistry | None = None,
    metric_tenants: Sequence[str] = (),
) -> Starlette:
    """``/metrics`` alone over ``backing`` (and ``queues``): mount it where a scraper reads."""
    from statepact.dashboard.metrics import metrics_app as build

    named: dict[str, WorkQueue] = {backing.queue.name: backing.queue}
    named.update({queue.name: queue for queue in queues or ()})
    if registry is None:
        try:
            registry = registry_for(backing.queue)
        except (TypeError, ValueError):
            registry = None
    return build(named, state=backing.state, registry=registry, metric_tenants=metric_tenants)
