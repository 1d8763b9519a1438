"""OpenTelemetry spans and metrics for every statepact call (the ``otel`` extra).

``instrument()`` installs an observer at statepact's one instrumentation point
(``statepact._observe``): from then on each public call of a state store, a work
queue or a transaction manager is a span, timed into a duration histogram,
following the OpenTelemetry semantic conventions for database client calls
(state, transactions) and for messaging (the queue). ``uninstrument()`` takes it
away again; not instrumented, statepact runs exactly the code it runs without
this module. Span, attribute and metric names: docs/observability.md.

Nothing recorded carries a URL or a password: the server is named by host, port
and database only, and exception messages pass through ``redact_dsn``.

This module must never configure a provider or an exporter (that is the
application's) and never be imported by ``import statepact``.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

try:
    from opentelemetry import context, metrics, trace
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "statepact.otel needs OpenTelemetry: install the extra, pip install 'statepact[otel]'"
    ) from exc

from statepact import __version__, _observe
from statepact._observe import Call
from statepact.errors import LeaseLostError
from statepact.models import ItemStatus, Lease, QueueStats, WorkItem
from statepact.settings import redact_dsn
from statepact.tx import CommitResult

__all__ = [
    "COUNTERS",
    "DB_SYSTEMS",
    "MESSAGING_SYSTEM",
    "attributes_for",
    "instrument",
    "is_instrumented",
    "uninstrument",
]

#: ``db.system.name`` per backing: the well-known values for Redis and PostgreSQL; the
#: memory backing has none, so it gets a custom one in statepact's own namespace.
DB_SYSTEMS: Mapping[str, str] = {
    "memory": "statepact.memory",
    "postgres": "postgresql",
    "redis": "redis",
}
MESSAGING_SYSTEM = "statepact"

# The buckets the conventions advise for each duration histogram (seconds).
_DB_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)
_MESSAGING_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)

_OPERATION_TYPES: Mapping[str, str] = {
    "enqueue": "send",
    "enqueue_many": "send",
    "claim": "receive",
    "claim_batch": "receive",
    "heartbeat": "settle",
    "ack": "settle",
    "ack_many": "settle",
    "fail": "settle",
    "release": "settle",
}
_SUBJECTS: Mapping[str | None, str] = {
    "runs": "statepact.run.id",
    "sessions": "statepact.session.id",
}

Attributes = dict[str, str | int | bool]

#: The counters: name, unit, description (docs/observability.md has the attributes of each).
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("messaging.client.sent.messages", "{message}", "Work items enqueued."),
    ("messaging.client.consumed.messages", "{message}", "Work items claimed (leases handed out)."),
    (
        "statepact.client.retries",
        "{retry}",
        "Calls sent again: a connection error waited out (failover), or a transaction run "
        "again after a conflict.",
    ),
    (
        "statepact.queue.leases_lost",
        "{lease}",
        "Settles and heartbeats refused because the lease had moved on.",
    ),
    (
        "statepact.queue.dead_letters",
        "{item}",
        "Work items moved to the dead letter (by fail, or by reap).",
    ),
    ("statepact.queue.reaped", "{item}", "Expired leases reaped back to ready."),
)


def _server(call: Call, into: Attributes) -> Attributes:
    target = call.target
    into["statepact.backing"] = target.backing
    if target.address is not None:
        into["server.address"] = target.address
        if target.port is not None:
            into["server.port"] = target.port
    return into


def attributes_for(call: Call) -> tuple[str, SpanKind, Attributes, Attributes]:
    """The span name, kind, span attributes and metric attributes of ``call``.

    Metric attributes are the low-cardinality subset (no tenant, no ids).
    """
    target = call.target
    if call.area == "queue":
        queue = call.queue or "default"
        metric: Attributes = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.name": call.operation,
            "messaging.destination.name": queue,
        }
        kind = _OPERATION_TYPES.get(call.operation)
        if kind is not None:
            metric["messaging.operation.type"] = kind
        _server(call, metric)
        span: Attributes = dict(metric)
        if call.subject is not None:
            span["messaging.message.id"] = call.subject
        if call.tenant is not None:
            span["statepact.tenant"] = call.tenant
        name = f"{call.operation} {queue}"
        return name, SpanKind.PRODUCER if kind == "send" else SpanKind.CLIENT, span, metric
    metric = {
        "db.system.name": DB_SYSTEMS.get(target.backing, target.backing),
        "db.operation.name": call.operation,
    }
    if call.collection is not None:
        metric["db.collection.name"] = call.collection
    if target.namespace is not None:
        metric["db.namespace"] = target.namespace
    _server(call, metric)
    span = dict(metric)
    if call.tenant is not None:
        span["statepact.tenant"] = call.tenant
    if call.subject is not None:
        span[_SUBJECTS.get(call.collection, "statepact.tx.key")] = call.subject
    txn_id = getattr(call.front, "txn_id", None)
    if call.area == "tx" and isinstance(txn_id, str):
        span["statepact.tx.id"] = txn_id
    # The conventions' span name: the operation and its target, the most specific known.
    where = call.collection or target.namespace
    if where is None and target.address is not None:
        where = target.address if target.port is None else f"{target.address}:{target.port}"
    name = call.operation if where is None else f"{call.operation} {where}"
    return name, SpanKind.CLIENT, span, metric


def _error_type(error: BaseException) -> str:
    cls = type(error)
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(slots=True)
class _Scope:
    span: trace.Span
    token: object
    started: float
    metric: Attributes


class _Observer:
    """Spans and metrics for :mod:`statepact._observe`'s calls."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
        tenant_in_metrics: bool,
    ) -> None:
        self.active = True
        self._tenants = tenant_in_metrics
        self._tracer = trace.get_tracer("statepact", __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter("statepact", __version__, meter_provider=meter_provider)
        self._db_duration = meter.create_histogram(
            "db.client.operation.duration",
            unit="s",
            description="Duration of statepact state store and transaction calls.",
            explicit_bucket_boundaries_advisory=_DB_BUCKETS,
        )
        self._messaging_duration = meter.create_histogram(
            "messaging.client.operation.duration",
            unit="s",
            description="Duration of statepact work queue calls.",
            explicit_bucket_boundaries_advisory=_MESSAGING_BUCKETS,
        )
        counters = {
            name: meter.create_counter(name, unit=unit, description=description)
            for name, unit, description in COUNTERS
        }
        self._sent = counters["messaging.client.sent.messages"]
        self._consumed = counters["messaging.client.consumed.messages"]
        self._retries = counters["statepact.client.retries"]
        self._leases_lost = counters["statepact.queue.leases_lost"]
        self._dead_letters = counters["statepact.queue.dead_letters"]
        self._reaped = counters["statepact.queue.reaped"]
        # Queued items per queue (name, backing, server), per tenant or summed, as the last
        # stats() call on it read them.
        self._depth: dict[tuple[tuple[str, str | int | bool], ...], list[tuple[Attributes, int]]]
        self._depth = {}
        meter.create_observable_gauge(
            "statepact.queue.depth",
            callbacks=[self._observe_depth],
            unit="{item}",
            description="Queued items, as the last WorkQueue.stats() call on the queue read them.",
        )

    # -- the observer protocol ---------------------------------------------------------------

    def begin(self, call: Call) -> object:
        name, kind, span_attributes, metric = attributes_for(call)
        span = self._tracer.start_span(name, kind=kind, attributes=span_attributes)
        token = context.attach(trace.set_span_in_context(span))
        return _Scope(span, token, time.perf_counter(), metric)

    def end(self, call: Call, scope: object, result: object, error: BaseException | None) -> None:
        if not isinstance(scope, _Scope):
            return
        elapsed = time.perf_counter() - scope.started
        span, metric = scope.span, scope.metric
        try:
            if self._tenants and call.tenant is not None:
                metric["statepact.tenant"] = call.tenant
            if error is not None:
                self._failed(span, metric, error)
            if call.area == "queue":
                self._queue_outcome(call, span, metric, result, error)
                self._messaging_duration.record(elapsed, metric)
            else:
                if isinstance(result, CommitResult):
                    span.set_attribute("statepact.tx.version", result.version)
                    span.set_attribute("statepact.tx.replayed", result.replayed)
                self._db_duration.record(elapsed, metric)
        finally:
            span.end()
            context.detach(scope.token)  # type: ignore[arg-type]

    def retried(
        self,
        call: Call | None,
        *,
        reason: str,
        backing: str,
        attempt: int,
        error: BaseException,
    ) -> None:
        attributes: Attributes = {
            "statepact.backing": backing,
            "statepact.retry.reason": reason,
            "error.type": _error_type(error),
        }
        if call is not None:
            attributes["statepact.operation"] = call.operation
        self._retries.add(1, attributes)
        event: Attributes = {
            "statepact.retry.reason": reason,
            "statepact.retry.attempt": attempt,
            "error.type": _error_type(error),
        }
        trace.get_current_span().add_event("statepact.retry", event)

    # -- what each outcome adds --------------------------------------------------------------

    def _failed(self, span: trace.Span, metric: Attributes, error: BaseException) -> None:
        kind = _error_type(error)
        metric["error.type"] = kind
        span.set_attribute("error.type", kind)
        message = redact_dsn(str(error))
        span.set_status(Status(StatusCode.ERROR, message))
        # As Span.record_exception records it, with every password masked.
        span.add_event(
            "exception",
            {
                "exception.type": kind,
                "exception.message": message,
                "exception.stacktrace": redact_dsn("".join(traceback.format_exception(error))),
            },
        )

    def _queue_outcome(
        self,
        call: Call,
        span: trace.Span,
        metric: Attributes,
        result: object,
        error: BaseException | None,
    ) -> None:
        operation = call.operation
        base = {k: metric[k] for k in _QUEUE_KEYS if k in metric}
        if self._tenants and call.tenant is not None:
            base["statepact.tenant"] = call.tenant
        if operation == "enqueue":
            self._sent.add(1, metric)
        elif operation == "enqueue_many":
            if isinstance(result, list):
                span.set_attribute("messaging.batch.message_count", len(result))
                self._sent.add(len(result), metric)
        elif operation == "ack_many" and isinstance(result, list):
            span.set_attribute("messaging.batch.message_count", len(result))
            lost = sum(1 for answer in result if isinstance(answer, LeaseLostError))
            if lost:
                self._leases_lost.add(lost, base | {"messaging.operation.name": operation})
        elif operation in ("claim", "claim_batch") and error is None:
            leases = [result] if isinstance(result, Lease) else result
            if isinstance(leases, list):
                if operation == "claim_batch":
                    span.set_attribute("messaging.batch.message_count", len(leases))
                for lease in leases:
                    self._consumed.add(1, self._with_tenant(metric, lease.item.tenant))
                if isinstance(result, Lease):
                    span.set_attribute("messaging.message.id", result.item.item_id)
                    span.set_attribute("statepact.tenant", result.item.tenant)
                    span.set_attribute("messaging.client.id", result.worker_id)
        elif isinstance(error, LeaseLostError):
            self._leases_lost.add(1, base | {"messaging.operation.name": operation})
        elif operation == "fail" and isinstance(result, WorkItem):
            span.set_attribute("statepact.item.status", str(result.status))
            if result.status == ItemStatus.DEAD:
                self._dead_letters.add(1, base | {"statepact.dead_letter.reason": "failed"})
                span.add_event(
                    "statepact.dead_letter", {"statepact.item.attempts": result.attempts}
                )
        elif operation == "reap" and isinstance(result, list):
            dead = sum(1 for item in result if item.status == ItemStatus.DEAD)
            span.set_attribute("statepact.queue.reaped", len(result) - dead)
            span.set_attribute("statepact.queue.dead_lettered", dead)
            for item in result:
                where = self._with_tenant(base, item.tenant)
                if item.status == ItemStatus.DEAD:
                    self._dead_letters.add(1, where | {"statepact.dead_letter.reason": "lapsed"})
                else:
                    self._reaped.add(1, where)
        elif operation == "stats" and isinstance(result, QueueStats):
            self._sample_depth(base, result)

    def _with_tenant(self, attributes: Attributes, tenant: str) -> Attributes:
        if not self._tenants:
            return attributes
        return attributes | {"statepact.tenant": tenant}

    def _sample_depth(self, base: Attributes, stats: QueueStats) -> None:
        owner = tuple(sorted((k, v) for k, v in base.items() if k != "statepact.tenant"))
        plain = dict(owner)
        if self._tenants:
            self._depth[owner] = [
                (plain | {"statepact.tenant": tenant}, counts.queued)
                for tenant, counts in sorted(stats.tenants.items())
            ]
        else:
            self._depth[owner] = [(plain, stats.queued)]

    def _observe_depth(self, _options: CallbackOptions) -> Iterable[Observation]:
        if not self.active:
            return []
        return [
            Observation(value, attributes)
            for rows in list(self._depth.values())
            for attributes, value in rows
        ]


_QUEUE_KEYS = (
    "messaging.system",
    "messaging.destination.name",
    "statepact.backing",
    "server.address",
    "server.port",
)


def instrument(
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    tenant_in_metrics: bool = False,
) -> None:
    """Record a span and metrics for every statepact call from now on, in this process.

    ``tracer_provider`` / ``meter_provider`` default to the global ones
    (``opentelemetry.trace.set_tracer_provider``...). Spans carry the tenant
    (``statepact.tenant``); metrics carry it only with ``tenant_in_metrics=True``
    (one time series per tenant: mind the cardinality). Calling it again
    replaces the providers.
    """
    previous = _observe.installed()
    if isinstance(previous, _Observer):
        previous.active = False
    _observe.install(_Observer(tracer_provider, meter_provider, tenant_in_metrics))


def uninstrument() -> None:
    """Stop recording; statepact's calls run uninstrumented again. Idempotent."""
    previous = _observe.installed()
    if isinstance(previous, _Observer):
        previous.active = False
        _observe.uninstall()


def is_instrumented() -> bool:
    """Whether :func:`instrument` is in effect."""
    return isinstance(_observe.installed(), _Observer)
