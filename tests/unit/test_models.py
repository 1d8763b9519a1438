"""The records that cross the protocols: frozen, strict about shape, with honest defaults."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from pydantic import ValidationError

from statepact.models import (
    ItemStatus,
    Lease,
    Page,
    QueueStats,
    RunRecord,
    RunStatus,
    SessionRecord,
    TenantQueueStats,
    WorkItem,
    stored,
    stored_lease,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_run_record_defaults() -> None:
    run = RunRecord(tenant="acme", run_id="r1")
    assert run.session_id is None
    assert run.status is RunStatus.PENDING
    assert run.data == {}
    assert run.version == 0
    assert (run.input_tokens, run.output_tokens, run.iterations, run.cursor) == (0, 0, 0, 0)
    assert run.cost == Decimal(0)
    assert (run.created_at, run.updated_at, run.seq) == (None, None, None)


def test_default_blobs_are_not_shared() -> None:
    one = RunRecord(tenant="acme", run_id="r1")
    two = RunRecord(tenant="acme", run_id="r2")
    assert one.data is not two.data


def test_records_are_frozen() -> None:
    run = RunRecord(tenant="acme", run_id="r1")
    with pytest.raises(ValidationError):
        run.version = 3  # type: ignore[misc]
    changed = run.model_copy(update={"version": 3})
    assert (run.version, changed.version) == (0, 3)


@pytest.mark.parametrize(
    "fields",
    [
        {"version": -1},
        {"input_tokens": -1},
        {"cost": Decimal("-0.1")},
        {"status": "sleeping"},
        {"surprise": 1},
        {"data": [1, 2]},
    ],
)
def test_run_record_refuses_bad_shape(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RunRecord(tenant="acme", run_id="r1", **fields)  # type: ignore[arg-type]


def test_status_strings_become_enums() -> None:
    run = RunRecord(tenant="acme", run_id="r1", status="running")  # type: ignore[arg-type]
    assert run.status is RunStatus.RUNNING
    assert RunStatus.RUNNING == "running"
    assert [s.value for s in RunStatus] == [
        "pending",
        "running",
        "succeeded",
        "failed",
        "cancelled",
    ]
    assert [s.value for s in ItemStatus] == ["queued", "leased", "done", "dead", "cancelled"]


def test_session_record_defaults() -> None:
    session = SessionRecord(tenant="acme", session_id="s1")
    assert (session.version, session.data, session.seq) == (0, {}, None)


def test_work_item_defaults() -> None:
    item = WorkItem(tenant="acme", item_id="job-1")
    assert item.queue is None
    assert item.payload == {}
    assert item.priority == 0
    assert item.attempts == 0
    assert item.status is ItemStatus.QUEUED
    assert item.last_error is None


def test_lease_carries_its_item() -> None:
    item = WorkItem(tenant="acme", item_id="job-1", status=ItemStatus.LEASED, attempts=1)
    lease = Lease(item=item, worker_id="w1", token=7, expires_at=NOW, lease_seconds=30.0)
    assert lease.item == item
    with pytest.raises(ValidationError):
        lease.token = 8  # type: ignore[misc]


def test_page_is_generic() -> None:
    page = Page[RunRecord](items=[RunRecord(tenant="acme", run_id="r1")], next="5")
    assert page.items[0].run_id == "r1"
    assert page.next == "5"
    assert Page[RunRecord](items=[]).next is None


def test_queue_stats_totals() -> None:
    stats = QueueStats(
        queue="default",
        tenants={
            "a": TenantQueueStats(queued=3, leased=1, dead=0),
            "b": TenantQueueStats(queued=2, leased=0, dead=4),
        },
    )
    assert (stats.queued, stats.leased, stats.dead) == (5, 1, 4)
    assert QueueStats(queue="default").queued == 0


def test_a_stored_record_is_the_validated_one() -> None:
    """``stored`` (a backing's record from its own reply) equals, dumps, prints and copies as
    the validated record of the same values does."""
    fields: dict[str, object] = {
        "tenant": "t",
        "run_id": "r",
        "session_id": "s",
        "status": RunStatus.RUNNING,
        "data": {"a": [1, "x"]},
        "version": 3,
        "input_tokens": 1,
        "output_tokens": 2,
        "cost": Decimal("0.000000001"),
        "iterations": 4,
        "cursor": 5,
        "created_at": NOW,
        "updated_at": NOW,
        "seq": 9,
    }
    fast, checked = stored(RunRecord, dict(fields)), RunRecord(**fields)  # type: ignore[arg-type]
    assert type(fast) is RunRecord
    assert fast == checked
    assert repr(fast) == repr(checked)
    assert fast.model_dump() == checked.model_dump()
    assert fast.model_dump_json() == checked.model_dump_json()
    assert fast.model_fields_set == checked.model_fields_set
    assert fast.model_copy(update={"version": 4}) == checked.model_copy(update={"version": 4})
    with pytest.raises(ValidationError):
        fast.version = 5  # type: ignore[misc]
    session = {"tenant": "t", "session_id": "s", "data": {}, "version": 1}
    session |= {"created_at": NOW, "updated_at": NOW, "seq": 2}
    assert stored(SessionRecord, dict(session)) == SessionRecord(**session)  # type: ignore[arg-type]


def test_a_stored_lease_is_the_validated_one() -> None:
    """``stored_lease`` (a queue's lease from its own reply) equals, dumps and prints as the
    validated lease of the same values, its item built by ``stored`` as the queues build it."""
    item = {
        "tenant": "t",
        "item_id": "i",
        "payload": {"n": [1, "x"]},
        "queue": "default",
        "priority": 2,
        "available_at": NOW,
        "attempts": 1,
        "status": ItemStatus.LEASED,
        "last_error": None,
        "created_at": NOW,
        "updated_at": NOW,
        "unique_key": "k",
        "unique_for": timedelta(hours=1),
        "timeout": 2.5,
        "limit_key": "openai:gpt-4o",
        "weight": 7,
    }
    fast_item, checked_item = stored(WorkItem, dict(item)), WorkItem(**item)  # type: ignore[arg-type]
    assert fast_item == checked_item and repr(fast_item) == repr(checked_item)
    fast = stored_lease(fast_item, "w1", 7, NOW, 30.0)
    checked = Lease(item=checked_item, worker_id="w1", token=7, expires_at=NOW, lease_seconds=30.0)
    assert type(fast) is Lease
    assert fast == checked
    assert repr(fast) == repr(checked)
    assert fast.model_dump_json() == checked.model_dump_json()
    assert fast.model_fields_set == checked.model_fields_set
