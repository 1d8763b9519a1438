"""OpenTelemetry spans and metrics on every backing, read back from the SDK's in-memory exporter
and metric reader; failovers through a fault proxy with a password in the DSN, which no span,
event or metric point may hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy.engine import make_url

from statepact._observe import Target
from statepact.clock import ManualClock
from statepact.models import RunRecord
from statepact.queue import BaseWorkQueue
from statepact.state import BaseStateStore
from statepact.tx import StorageBackend, TransactionManager
from tests.integration.test_logging import (
    BACKINGS,
    PASSWORD,
    Secured,
    exercise_queue,
    postgres_failover,
    postgres_with_password,  # noqa: F401 - a fixture
    queue_policy,  # noqa: F401 - a fixture
    redis_failover,
    redis_with_password,  # noqa: F401 - a fixture
)
from tests.unit.test_observe import Telemetry, instrumented


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    with instrumented() as running:
        yield running


SYSTEMS = {"memory": "statepact.memory", "redis": "redis", "postgres": "postgresql"}


@dataclass
class Fronts:
    backing: str
    store: BaseStateStore
    queue: BaseWorkQueue
    backend: StorageBackend
    expected: Target


def _expected(request: pytest.FixtureRequest, backing: str) -> Target:
    """Where the fixtures' clients point: the plugin server's host and port, the database."""
    if backing == "redis":
        url = urlsplit(request.getfixturevalue("statepact_redis_url"))
        return Target(
            "redis", address=url.hostname, port=url.port, namespace=url.path.strip("/") or "0"
        )
    if backing == "postgres":
        pg = make_url(request.getfixturevalue("pg_database_url"))
        return Target("postgres", address=pg.host, port=pg.port or 5432, namespace=pg.database)
    return Target("memory")


@pytest.fixture(params=BACKINGS)
def fronts(request: pytest.FixtureRequest) -> Iterator[Fronts]:
    backing = request.param
    yield Fronts(
        backing=backing,
        store=request.getfixturevalue(f"{backing}_state_store"),
        queue=request.getfixturevalue(f"{backing}_work_queue"),
        backend=request.getfixturevalue(f"{backing}_backend"),
        expected=_expected(request, backing),
    )


async def test_spans_and_metrics_on_every_backing(fronts: Fronts, telemetry: Telemetry) -> None:
    """Each call one span with the conventions' attributes and the server as the fixtures'
    clients reach it; durations, messages, dead letters, reaps, lost leases and depth counted."""
    backing, expected = fronts.backing, fronts.expected
    clock = fronts.queue.clock
    assert isinstance(clock, ManualClock)
    store = fronts.store
    await store.put_run(RunRecord(tenant="acme", run_id="r1"))
    await store.patch_run("acme", "r1", iterations=1)
    assert await store.get_run("acme", "r1") is not None
    await exercise_queue(fronts.queue, clock)
    await fronts.queue.stats()
    manager = TransactionManager(fronts.backend, clock=clock)
    async with manager.transaction() as tx:
        await tx.read("orders", "o1")
        tx.write("orders", "o1", {"state": "paid"})

    spans = telemetry.spans()
    where = (
        expected.namespace
        if expected.namespace is not None
        else (None if expected.address is None else f"{expected.address}:{expected.port}")
    )
    tx_suffix = "" if where is None else f" {where}"
    names = [span.name for span in spans]
    assert names[:3] == ["put_run runs", "patch_run runs", "get_run runs"]
    # The first read takes the snapshot: async with sends no begin of its own.
    assert names[-2:] == ["read orders", f"commit{tx_suffix}"]
    queue_names = [name for name in names if name.endswith(" default")]
    assert queue_names == [
        f"{op} default"
        for op in (
            "enqueue",
            "enqueue",
            "claim",
            "fail",
            "claim",
            "reap",
            "ack",
            "claim",
            "reap",
            "requeue",
            "enqueue",
            "stats",
        )
    ]
    for span in spans:
        attributes = dict(span.attributes or {})
        assert attributes["statepact.backing"] == backing
        if expected.address is not None:
            assert attributes["server.address"] == expected.address
            assert attributes["server.port"] == expected.port
        else:
            assert "server.address" not in attributes
        if span.name.endswith(" default"):
            assert attributes["messaging.system"] == "statepact"
            assert attributes["messaging.destination.name"] == "default"
        else:
            assert attributes["db.system.name"] == SYSTEMS[backing]
            assert attributes.get("db.namespace") == expected.namespace
    [put] = telemetry.named("put_run runs")
    assert put.kind is SpanKind.CLIENT
    assert dict(put.attributes or {})["statepact.run.id"] == "r1"
    sends = [s for s in spans if s.name == "enqueue default"]
    assert all(s.kind is SpanKind.PRODUCER for s in sends)
    refused = sends[-1]
    assert refused.status.status_code is StatusCode.ERROR
    assert dict(refused.attributes or {})["error.type"] == (
        "statepact.errors.StatePersistenceError"
    )
    [lost] = [s for s in spans if s.name == "ack default"]
    assert dict(lost.attributes or {})["error.type"] == "statepact.errors.LeaseLostError"
    [commit] = telemetry.named(f"commit{tx_suffix}")
    assert dict(commit.attributes or {})["statepact.tx.replayed"] is False

    assert telemetry.total("db.client.operation.duration", {"db.operation.name": "put_run"}) == 1
    assert telemetry.total("db.client.operation.duration", {"db.operation.name": "commit"}) == 1
    assert telemetry.total("messaging.client.operation.duration") == len(queue_names)
    assert telemetry.total("messaging.client.sent.messages") == 3  # the refused one included
    assert telemetry.total("messaging.client.sent.messages", {"error.type": None}) == 2
    assert telemetry.total("messaging.client.consumed.messages") == 3
    assert (
        telemetry.total("statepact.queue.dead_letters", {"statepact.dead_letter.reason": "failed"})
        == 1
    )
    assert (
        telemetry.total("statepact.queue.dead_letters", {"statepact.dead_letter.reason": "lapsed"})
        == 1
    )
    assert telemetry.total("statepact.queue.reaped") == 1
    assert telemetry.total("statepact.queue.leases_lost", {"messaging.operation.name": "ack"}) == 1
    # After the run: "poison" requeued (queued), "slow" dead.
    assert [p.value for p in telemetry.points("statepact.queue.depth")] == [1]
    for point in telemetry.points("db.client.operation.duration"):
        assert point.attributes["db.system.name"] == SYSTEMS[backing]
        assert "statepact.tenant" not in point.attributes


async def test_redis_failover_spans_and_retries_hold_no_password(
    redis_with_password: Secured,  # noqa: F811 - the fixture imported above
    telemetry: Telemetry,
) -> None:
    """Retries are span events and a counter; the give-up is the span's error; the server is
    the proxy's host and port. Nothing recorded holds the DSN's password."""
    await redis_failover(redis_with_password)
    failed, recovered = telemetry.named("get_run runs")
    assert failed.status.status_code is StatusCode.ERROR
    assert [e.name for e in failed.events] == ["statepact.retry", "statepact.retry", "exception"]
    assert [e.name for e in recovered.events] == ["statepact.retry"]
    assert recovered.status.status_code is StatusCode.UNSET
    assert dict(failed.attributes or {})["server.port"] == redis_with_password.proxy.port
    [stats] = telemetry.named("stats default")
    assert dict(stats.attributes or {})["error.type"] == "statepact.errors.QueueUnavailableError"
    retries = {"statepact.backing": "redis", "statepact.retry.reason": "failover"}
    assert telemetry.total("statepact.client.retries", retries) == 5
    assert telemetry.total("statepact.client.retries", {"statepact.operation": "get_run"}) == 3
    assert PASSWORD not in telemetry.everything_as_text()


async def test_postgres_failover_spans_and_retries_hold_no_password(
    postgres_with_password: Secured,  # noqa: F811 - the fixture imported above
    telemetry: Telemetry,
) -> None:
    await postgres_failover(postgres_with_password)
    [put] = telemetry.named("put_run runs")
    [failed] = telemetry.named("get_run runs")
    attributes = dict(failed.attributes or {})
    assert attributes["db.system.name"] == "postgresql"
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["server.port"] == postgres_with_password.proxy.port
    assert attributes["db.namespace"] == dict(put.attributes or {})["db.namespace"]
    assert attributes["error.type"] == "statepact.errors.StatePersistenceError"
    assert [e.name for e in failed.events] == ["statepact.retry", "statepact.retry", "exception"]
    assert telemetry.total("statepact.client.retries", {"statepact.backing": "postgres"}) == 2
    assert PASSWORD not in telemetry.everything_as_text()
