"""The instrumentation point (``statepact._observe``), the OTel observer's attribute mapping, and
the log records the fronts write, on the memory backing (no server needed).

``Telemetry`` and the ``telemetry`` fixture (an SDK tracer and meter provider with in-memory
exporters, instrumented for the test) are shared with tests/integration/test_otel.py.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import statepact
from statepact import _observe, otel
from statepact._observe import CALLS, LOGGERS, Call, Target
from statepact._queue.operator import OperatorReads
from statepact._retry import RetryPolicy, call_with_failover
from statepact.clock import ManualClock
from statepact.errors import ConflictError, FencingError, StatePersistenceError
from statepact.models import RunRecord, WorkItem
from statepact.queue import BaseWorkQueue
from statepact.state import BaseStateStore
from statepact.storage.memory import MemoryBackend, MemoryStateStore, MemoryWorkQueue
from statepact.tx import Transaction, TransactionManager

SRC = Path(statepact.__file__).parent


@dataclass
class Telemetry:
    """An SDK tracer and meter provider whose spans and metrics stay in memory."""

    spans_exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def spans(self) -> list[ReadableSpan]:
        return list(self.spans_exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans() if span.name == name]

    def points(self, metric: str) -> list[Any]:
        """Every data point of ``metric`` (attributes and value or count) collected now."""
        found: list[Any] = []
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for item in scope.metrics:
                    if item.name == metric:
                        found.extend(item.data.data_points)
        return found

    def total(self, metric: str, where: dict[str, object] | None = None) -> float:
        """The sum of a counter's (or a histogram's count of) points whose attributes match
        ``where`` (a value of ``None``: the attribute is absent)."""
        total = 0.0
        for point in self.points(metric):
            if all(point.attributes.get(k) == v for k, v in (where or {}).items()):
                total += point.count if hasattr(point, "count") else point.value
        return total

    def everything_as_text(self) -> str:
        """Every span's name, attributes, events and status, and every metric point's attributes."""
        parts: list[str] = []
        for span in self.spans():
            parts.append(span.to_json())
        data = self.reader.get_metrics_data()
        if data is not None:
            parts.append(data.to_json())
        return "\n".join(parts)


def make_telemetry(*, tenant_in_metrics: bool = False) -> Telemetry:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    otel.instrument(
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader]),
        tenant_in_metrics=tenant_in_metrics,
    )
    return Telemetry(exporter, reader)


@contextmanager
def instrumented(*, tenant_in_metrics: bool = False) -> Iterator[Telemetry]:
    """statepact instrumented into in-memory exporters, uninstrumented on the way out."""
    try:
        yield make_telemetry(tenant_in_metrics=tenant_in_metrics)
    finally:
        otel.uninstrument()


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    """statepact instrumented for this test (see :func:`instrumented`)."""
    with instrumented() as running:
        yield running


def _clock() -> ManualClock:
    return ManualClock()


# -- the instrumentation point -----------------------------------------------------------


def _method(owner: str, name: str) -> Any:
    return _observe._resolve(owner).__dict__[name]


def test_uninstrumented_calls_create_no_spans_and_run_the_original_methods() -> None:
    """Never instrumented, or instrumented and then uninstrumented: a call makes no span and
    every front method is the class's own function again."""
    originals = {(spec.owner, spec.method): _method(spec.owner, spec.method) for spec in CALLS}
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel.instrument(tracer_provider=provider, meter_provider=MeterProvider())
    assert otel.is_instrumented()
    wrapped = {key: _method(*key) for key in originals}
    assert all(wrapped[key] is not originals[key] for key in originals)
    otel.uninstrument()
    otel.uninstrument()  # idempotent
    assert not otel.is_instrumented()
    assert {key: _method(*key) for key in originals} == originals

    async def calls() -> None:
        store = MemoryStateStore(clock=_clock())
        await store.put_run(RunRecord(tenant="acme", run_id="r1"))
        assert await store.get_run("acme", "r1") is not None
        queue = MemoryWorkQueue(clock=store.clock)
        await queue.enqueue(WorkItem(tenant="acme", item_id="i1", payload={}))
        lease = await queue.claim("w", lease_for=5)
        assert lease is not None
        await queue.ack(lease)

    import asyncio

    asyncio.run(calls())
    assert exporter.get_finished_spans() == ()


_NOT_OBSERVED = {
    # Runs user code around observed calls (its transactions' calls are spans of their own).
    ("statepact.tx:TransactionManager", "run"),
    # Hand out a transaction or close a client: no call to observe.
    ("statepact.tx:TransactionManager", "begin"),
    ("statepact.tx:TransactionManager", "close"),
}


@pytest.mark.parametrize(
    "owner",
    [BaseStateStore, BaseWorkQueue, OperatorReads, Transaction, TransactionManager],
    ids=lambda c: c.__name__,
)
def test_every_public_call_of_a_front_is_in_the_table(owner: type) -> None:
    """A coroutine method added to a front without an entry in CALLS fails here."""
    key = f"{owner.__module__}:{owner.__name__}"
    listed = {spec.method for spec in CALLS if spec.owner == key}
    public = {
        name
        for name, value in vars(owner).items()
        if not name.startswith("_") and inspect.iscoroutinefunction(value)
    }
    missing = {name for name in public - listed if (key, name) not in _NOT_OBSERVED}
    assert missing == set()
    assert listed <= public


async def test_a_call_made_inside_an_observed_call_is_part_of_it(telemetry: Telemetry) -> None:
    """``claim`` runs ``claim_batch``: one span, named for the call the caller made."""
    queue = MemoryWorkQueue(clock=_clock())
    await queue.enqueue(WorkItem(tenant="acme", item_id="i1", payload={}))
    lease = await queue.claim("w1", lease_for=5)
    assert lease is not None
    names = [span.name for span in telemetry.spans()]
    assert names == ["enqueue default", "claim default"]
    assert telemetry.total("messaging.client.consumed.messages") == 1
    assert telemetry.total(
        "messaging.client.operation.duration", {"messaging.operation.name": "claim"}
    )
    assert not telemetry.total(
        "messaging.client.operation.duration", {"messaging.operation.name": "claim_batch"}
    )


class _Broken:
    def begin(self, call: Call) -> object:
        raise RuntimeError("observer bug")

    def end(self, call: Call, scope: object, result: object, error: BaseException | None) -> None:
        raise RuntimeError("observer bug")

    def retried(self, call: Call | None, **_: Any) -> None:
        raise RuntimeError("observer bug")


async def test_a_broken_observer_is_logged_and_never_breaks_a_call(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An observer that raises: the call still returns its result; the failure is logged."""
    _observe.install(_Broken())
    try:
        store = MemoryStateStore(clock=_clock())
        with caplog.at_level(logging.ERROR, logger="statepact.observe"):
            stored = await store.put_run(RunRecord(tenant="acme", run_id="r1"))
            _observe.retried(reason="failover", backing="redis", attempt=1, error=OSError())
    finally:
        _observe.uninstall()
    assert stored.version == 1
    assert [r.levelno for r in caplog.records if r.name == "statepact.observe"] == [
        logging.ERROR
    ] * 3


# -- attribute mapping -------------------------------------------------------------------------


def _call(area: str, operation: str, target: Target, **fields: Any) -> Call:
    return Call(area=area, operation=operation, target=target, front=object(), **fields)


def test_a_state_call_maps_to_a_database_client_span() -> None:
    target = Target("postgres", address="db.internal", port=5433, namespace="app")
    name, kind, span, metric = otel.attributes_for(
        _call("state", "get_run", target, tenant="acme", subject="r1", collection="runs")
    )
    assert (name, kind) == ("get_run runs", SpanKind.CLIENT)
    assert metric == {
        "db.system.name": "postgresql",
        "db.operation.name": "get_run",
        "db.collection.name": "runs",
        "db.namespace": "app",
        "server.address": "db.internal",
        "server.port": 5433,
        "statepact.backing": "postgres",
    }
    assert span == metric | {"statepact.tenant": "acme", "statepact.run.id": "r1"}


def test_a_session_call_names_the_session() -> None:
    target = Target("redis", address="127.0.0.1", port=6390, namespace="3")
    name, _kind, span, _metric = otel.attributes_for(
        _call("state", "put_session", target, tenant="t", subject="s1", collection="sessions")
    )
    assert name == "put_session sessions"
    assert span["db.system.name"] == "redis"
    assert span["db.namespace"] == "3"
    assert span["statepact.session.id"] == "s1"


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (Target("postgres", address="h", port=5432, namespace="app"), "commit app"),
        (Target("redis", address="h", port=6379), "commit h:6379"),
        (Target("redis", address="/run/redis.sock"), "commit /run/redis.sock"),
        (Target("memory"), "commit"),
    ],
)
def test_a_span_name_is_the_operation_and_its_most_specific_target(
    target: Target, expected: str
) -> None:
    """Collection, else namespace, else address:port, else the operation alone."""
    name, kind, span, _metric = otel.attributes_for(_call("tx", "commit", target))
    assert (name, kind) == (expected, SpanKind.CLIENT)
    assert "statepact.tenant" not in span


def test_the_memory_backing_gets_a_custom_system_name() -> None:
    _name, _kind, span, _metric = otel.attributes_for(_call("tx", "read", Target("memory")))
    assert span["db.system.name"] == "statepact.memory"
    assert span["statepact.backing"] == "memory"
    assert "server.address" not in span


@pytest.mark.parametrize(
    ("operation", "kind", "operation_type"),
    [
        ("enqueue", SpanKind.PRODUCER, "send"),
        ("claim", SpanKind.CLIENT, "receive"),
        ("claim_batch", SpanKind.CLIENT, "receive"),
        ("ack", SpanKind.CLIENT, "settle"),
        ("fail", SpanKind.CLIENT, "settle"),
        ("release", SpanKind.CLIENT, "settle"),
        ("heartbeat", SpanKind.CLIENT, "settle"),
        ("reap", SpanKind.CLIENT, None),
        ("stats", SpanKind.CLIENT, None),
    ],
)
def test_a_queue_call_maps_to_a_messaging_span(
    operation: str, kind: SpanKind, operation_type: str | None
) -> None:
    target = Target("redis", address="10.0.0.5", port=6379, namespace="0")
    name, got_kind, span, metric = otel.attributes_for(
        _call("queue", operation, target, tenant="acme", subject="i1", queue="jobs")
    )
    assert (name, got_kind) == (f"{operation} jobs", kind)
    expected = {
        "messaging.system": "statepact",
        "messaging.operation.name": operation,
        "messaging.destination.name": "jobs",
        "server.address": "10.0.0.5",
        "server.port": 6379,
        "statepact.backing": "redis",
    }
    if operation_type is not None:
        expected["messaging.operation.type"] = operation_type
    assert metric == expected
    assert span == expected | {"messaging.message.id": "i1", "statepact.tenant": "acme"}


async def test_an_error_is_recorded_with_every_password_masked(telemetry: Telemetry) -> None:
    """error.type is the exception's class; the exception event and the status are redacted."""
    observer = _observe.installed()
    assert observer is not None
    call = _call("state", "get_run", Target("memory"), collection="runs")
    scope = observer.begin(call)
    error = RuntimeError("could not reach postgresql://app:hunter2@db:5432/app")
    observer.end(call, scope, None, error)
    [span] = telemetry.spans()
    assert span.attributes is not None
    assert span.attributes["error.type"] == "builtins.RuntimeError"
    assert span.status.description is not None
    assert "app:***@db" in span.status.description
    [event] = span.events
    assert event.name == "exception"
    assert "hunter2" not in telemetry.everything_as_text()
    point = telemetry.points("db.client.operation.duration")[0]
    assert point.attributes["error.type"] == "builtins.RuntimeError"


# -- memory calls, end to end ---------------------------------------------------------------


async def test_memory_spans_and_metrics_of_the_three_fronts(telemetry: Telemetry) -> None:
    clock = _clock()
    store = MemoryStateStore(clock=clock)
    await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    await store.patch_run("acme", "r1", input_tokens=3)
    manager = TransactionManager(MemoryBackend(clock=clock))
    async with manager.transaction() as tx:
        await tx.read("orders", "o1")
        tx.write("orders", "o1", {"state": "paid"})
    names = [span.name for span in telemetry.spans()]
    # async with: the snapshot is taken by the first read, so there is no begin span.
    assert names == ["put_run runs", "patch_run runs", "read orders", "commit"]
    commit = telemetry.named("commit")[0]
    assert commit.attributes is not None
    assert commit.attributes["statepact.tx.version"] == 1
    assert commit.attributes["statepact.tx.id"] == tx.txn_id
    assert telemetry.total("db.client.operation.duration", {"db.operation.name": "put_run"}) == 1
    [point] = [
        p
        for p in telemetry.points("db.client.operation.duration")
        if p.attributes["db.operation.name"] == "commit"
    ]
    assert point.attributes["db.system.name"] == "statepact.memory"
    assert "statepact.tenant" not in point.attributes


async def test_queue_depth_is_what_the_last_stats_call_read() -> None:
    """The gauge reports the queued counts of the last ``stats()``; per tenant on request."""
    for per_tenant in (False, True):
        with instrumented(tenant_in_metrics=per_tenant) as telemetry:
            queue = MemoryWorkQueue(clock=_clock(), name="jobs")
            for tenant, item in (("a", "1"), ("a", "2"), ("b", "3")):
                await queue.enqueue(WorkItem(tenant=tenant, item_id=item, payload={}))
            assert telemetry.points("statepact.queue.depth") == []
            await queue.stats()
            depth = {
                p.attributes.get("statepact.tenant"): p.value
                for p in telemetry.points("statepact.queue.depth")
            }
        assert depth == ({"a": 2, "b": 1} if per_tenant else {None: 3})


# -- the retry paths ---------------------------------------------------------------------------


async def test_failover_retries_are_logged_and_counted(
    caplog: pytest.LogCaptureFixture, telemetry: Telemetry
) -> None:
    """Each retry a WARNING on statepact.retry with its fields, the give-up an ERROR."""
    attempts = 0

    async def flaky() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise ConnectionRefusedError("refused by redis://:s3cret@cache:6379/0")
        return "ok"

    def give_up(exc: BaseException) -> StatePersistenceError:
        return StatePersistenceError("gave up", reason="unavailable")

    policy = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.001)
    with caplog.at_level(logging.DEBUG, logger="statepact"):
        assert (
            await call_with_failover(
                flaky,
                policy=policy,
                is_transient=lambda _e: True,
                give_up=give_up,
                what="put_run",
                backing="redis",
            )
            == "ok"
        )
        attempts = -10
        with pytest.raises(StatePersistenceError):
            await call_with_failover(
                flaky, policy=policy, is_transient=lambda _e: True, give_up=give_up
            )
    records = [r for r in caplog.records if r.name == "statepact.retry"]
    assert [r.levelno for r in records] == [logging.WARNING] * 4 + [logging.ERROR]
    first = records[0]
    assert first.getMessage().startswith("redis put_run: attempt 1 of 3 failed with ")
    assert (first.backing, first.operation, first.attempt, first.max_attempts) == (  # type: ignore[attr-defined]
        "redis",
        "put_run",
        1,
        3,
    )
    assert first.error_type == "ConnectionRefusedError"  # type: ignore[attr-defined]
    assert all("s3cret" not in r.getMessage() for r in records)
    assert telemetry.total("statepact.client.retries", {"statepact.retry.reason": "failover"}) == 4


async def test_transaction_reruns_are_logged_and_counted(
    caplog: pytest.LogCaptureFixture, telemetry: Telemetry
) -> None:
    """A conflict re-run is a DEBUG record and a retry with reason "conflict"; giving up a
    WARNING."""
    manager = TransactionManager(MemoryBackend(clock=_clock()))
    runs = 0

    async def bump(tx: Transaction) -> None:
        nonlocal runs
        runs += 1
        value = await tx.read("counters", "c") or 0
        if runs == 1:  # a rival commits under the first run
            async with manager.transaction() as rival:
                rival.write("counters", "c", 100)
        tx.write("counters", "c", value + 1)

    with caplog.at_level(logging.DEBUG, logger="statepact.tx"):
        await manager.run(bump)
        runs = 0
        with pytest.raises(ConflictError):
            await manager.run(bump, retries=0)
    records = [r for r in caplog.records if r.name == "statepact.tx"]
    assert [r.levelno for r in records] == [logging.DEBUG, logging.WARNING]
    assert records[0].error_type == "ConflictError"  # type: ignore[attr-defined]
    assert records[0].backing == "memory"  # type: ignore[attr-defined]
    assert telemetry.total("statepact.client.retries", {"statepact.retry.reason": "conflict"}) == 1


async def test_a_stale_fencing_token_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    manager = TransactionManager(MemoryBackend(clock=_clock()))
    old = await manager.acquire_lease("jobs", "w1", 5)
    assert old is not None
    await manager.release_lease(old)
    assert await manager.acquire_lease("jobs", "w2", 5) is not None
    with caplog.at_level(logging.WARNING, logger="statepact.tx"), pytest.raises(FencingError):
        async with manager.transaction(fencing=old) as tx:
            tx.write("orders", "o1", {"by": "w1"})
    [record] = [r for r in caplog.records if r.name == "statepact.tx"]
    assert "fencing token" in record.getMessage()
    assert record.backing == "memory"  # type: ignore[attr-defined]


# -- refusals ---------------------------------------------------------------------------------


async def test_an_oversized_value_is_logged_as_refused(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStateStore(clock=_clock(), max_value_bytes=64)
    queue = MemoryWorkQueue(clock=store.clock, max_value_bytes=64)
    with caplog.at_level(logging.WARNING, logger="statepact.limits"):
        with pytest.raises(StatePersistenceError):
            await store.put_run(RunRecord(tenant="acme", run_id="big", data={"x": "y" * 100}))
        with pytest.raises(StatePersistenceError):
            await queue.enqueue(WorkItem(tenant="acme", item_id="big", payload={"x": "y" * 100}))
    records = [r for r in caplog.records if r.name == "statepact.limits"]
    assert [r.levelno for r in records] == [logging.WARNING, logging.WARNING]
    assert "data of run 'big'" in records[0].getMessage()
    assert "nothing was sent" in records[0].getMessage()
    assert records[1].field == "payload"  # type: ignore[attr-defined]
    assert records[1].limit == 64  # type: ignore[attr-defined]
    assert await store.get_run("acme", "big") is None


# -- library hygiene ----------------------------------------------------------------------


def test_the_library_configures_no_handler_and_names_every_logger() -> None:
    """A NullHandler on ``statepact`` only; every logger in the source is in LOGGERS."""
    root = logging.getLogger("statepact")
    assert [type(h) for h in root.handlers] == [logging.NullHandler]
    for name in LOGGERS:
        assert logging.getLogger(name).handlers == []
    used: set[str] = set()
    for path in SRC.rglob("*.py"):
        used.update(re.findall(r"logging\.getLogger\(\"([^\"]+)\"\)", path.read_text()))
    assert used - {"statepact"} == set(LOGGERS)


def test_log_calls_use_lazy_formatting() -> None:
    """No f-string or ``%`` applied before a logging call: the record formats itself."""
    eager = re.compile(r"_log\.\w+\(\s*f\"|_log\.\w+\([^)]*\"\s*%\s")
    offenders = [
        str(path.relative_to(SRC)) for path in SRC.rglob("*.py") if eager.search(path.read_text())
    ]
    assert offenders == []


def test_the_otel_module_exports_what_it_documents() -> None:
    assert list(otel.__all__) == sorted(otel.__all__)
    assert all(hasattr(otel, name) for name in otel.__all__)


def test_import_statepact_does_not_import_opentelemetry() -> None:
    probe = (
        "import json, sys, statepact, statepact.storage.memory\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('opentelemetry'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
