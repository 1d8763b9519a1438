"""``/metrics``: the dashboard's numbers in the Prometheus text format (version 0.0.4).

The same reads as the pages (:mod:`statepact.dashboard._data`): item counts per
queue, tenant and state from ``stats()``, the oldest wait per tenant, items
finished per minute by state, paused state, live workers and their in-flight
counts, and run totals over the last 24 hours for the tenants named up front
(``metric_tenants``; a scrape must stay bounded, so nothing lists every tenant).
:func:`metrics_app` serves it on its own, for a scraper on another port or path.

This module must never render a DSN nor a label value unescaped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from statepact.clock import Clock, SystemClock
from statepact.dashboard import _data
from statepact.dashboard.workers import WorkerRegistry
from statepact.queue import WorkQueue
from statepact.state import StateStore

__all__ = ["CONTENT_TYPE", "TOTALS_WINDOW", "metrics_app", "metrics_endpoint", "render_metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The run totals a scrape reports cover the runs created within this window.
TOTALS_WINDOW = timedelta(hours=24)
TOTALS_WINDOW_TEXT = "24 hours"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    inner = ",".join(f'{name}="{_label(value)}"' for name, value in labels.items())
    return "{" + inner + "}"


class _Family:
    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name = name
        self.lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def add(self, value: float | int | str, **labels: str) -> None:
        self.lines.append(f"{self.name}{_labels(**labels) if labels else ''} {value}")


async def render_metrics(sources: _data.Sources) -> str:
    """The exposition text for one scrape."""
    items = _Family("statepact_queue_items", "gauge", "Items per queue, tenant and state.")
    paused = _Family("statepact_queue_paused", "gauge", "1 when the queue is paused.")
    oldest = _Family(
        "statepact_queue_oldest_waiting_seconds",
        "gauge",
        "Seconds the tenant's oldest ready item has waited since it came due.",
    )
    finished = _Family(
        "statepact_queue_finished_per_minute",
        "gauge",
        f"Items finished per minute, averaged over the last {_data.RATE_MINUTES} minutes.",
    )
    for view in await _data.queue_views(sources):
        for tenant, counts in view.tenants:
            for state, count in counts.items():
                items.add(count, queue=view.name, tenant=tenant, state=state)
        for tenant, seconds in view.oldest.items():
            oldest.add(f"{seconds:.3f}", queue=view.name, tenant=tenant)
        for state, per_minute in view.per_minute.items():
            rate = sum(per_minute) / len(per_minute)
            finished.add(f"{rate:g}", queue=view.name, state=state)
        paused.add(int(view.paused), queue=view.name)
    families = [items, paused, oldest, finished]
    if sources.registry is not None:
        live = await sources.registry.live()
        workers = _Family("statepact_workers_live", "gauge", "Workers seen within their TTL.")
        workers.add(len(live))
        in_flight = _Family("statepact_worker_in_flight", "gauge", "Items a worker is running.")
        failures = _Family("statepact_worker_failures", "counter", "Failures a worker saw.")
        for worker in live:
            in_flight.add(worker.in_flight, worker=worker.worker_id)
            failures.add(worker.failures, worker=worker.worker_id)
        families += [workers, in_flight, failures]
    if sources.state is not None and sources.metric_tenants:
        window = f"over the runs created in the last {TOTALS_WINDOW_TEXT}"
        runs = _Family("statepact_runs", "gauge", f"Runs of the tenant, {window}.")
        tokens = _Family("statepact_run_tokens", "gauge", f"Tokens of the tenant's runs, {window}.")
        cost = _Family("statepact_run_cost", "gauge", f"Cost of the tenant's runs, {window}.")
        for tenant in sources.metric_tenants:
            totals = await _data.run_totals(
                sources.state, tenant, now=sources.clock.now(), window=TOTALS_WINDOW
            )
            if totals is None:
                continue
            runs.add(totals.runs, tenant=tenant)
            tokens.add(totals.input_tokens, tenant=tenant, direction="input")
            tokens.add(totals.output_tokens, tenant=tenant, direction="output")
            cost.add(str(totals.cost), tenant=tenant)
        families += [runs, tokens, cost]
    return "\n".join(line for family in families for line in family.lines) + "\n"


def metrics_endpoint(sources: _data.Sources) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return PlainTextResponse(await render_metrics(sources), media_type=CONTENT_TYPE)

    return endpoint


def metrics_app(
    queues: Mapping[str, WorkQueue] | Any,
    *,
    state: StateStore | None = None,
    registry: WorkerRegistry | None = None,
    clock: Clock | None = None,
    metric_tenants: Sequence[str] = (),
) -> Starlette:
    """``/metrics`` alone: an ASGI app answering every GET of its root with the text.

    ``queues`` is a mapping of name to queue, or a ``Backing`` (its queue and state).
    """
    if not isinstance(queues, Mapping):
        backing = queues
        queues = {backing.queue.name: backing.queue}
        state = state if state is not None else backing.state
    first = next(iter(queues.values()))
    sources = _data.Sources(
        queues=dict(queues),
        state=state,
        registry=registry,
        clock=clock or getattr(first, "clock", None) or SystemClock(),
        metric_tenants=tuple(metric_tenants),
    )
    return Starlette(routes=[Route("/", metrics_endpoint(sources))])
