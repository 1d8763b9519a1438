"""The error history on PostgreSQL: what only the database shows.

The behaviour every backing shares is the conformance suite's ``history`` part; this
module checks that the history moves with ``last_error`` inside a caller's transaction
(bound), that no statement but the three failure writes and the history read names
the column, and that a time zone other than UTC reads back the same instants.
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from statepact.clock import ManualClock
from statepact.models import AttemptError, WorkItem
from statepact.storage.postgres import PostgresWorkQueue
from statepact.storage.postgres.queue import _prepared

pytestmark = pytest.mark.integration

LEASE = 30.0
#: The statements that write the column (each beside ``last_error``) and the one that reads it.
WRITERS = {"fail", "reap", "cancel_many"}
READER = "error_history"


def test_only_the_failure_writes_and_the_history_read_name_the_column(
    postgres_work_queue: PostgresWorkQueue,
) -> None:
    """Claims, settles' answers, get_item and the listings never select error_history; fail,
    reap and cancel_many write it, error_history reads it."""
    naming = {
        name
        for name, statement in _prepared(postgres_work_queue.tables).by_name.items()
        if re.search(r"\berror_history\b", statement.sql)
    }
    assert naming == WRITERS | {READER}


async def test_a_bound_fail_rolled_back_leaves_no_entry(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine, clock: ManualClock
) -> None:
    """A fail inside a caller's transaction appends in that transaction: read there, and
    gone with last_error when it rolls back."""
    await postgres_work_queue.enqueue(WorkItem(tenant="acme", item_id="i1"))
    lease = await postgres_work_queue.claim("w1", lease_for=LEASE)
    assert lease is not None
    async with pg_engine.connect() as conn:
        await conn.begin()
        bound = postgres_work_queue.bound(conn)
        failed = await bound.fail(lease, "boom")
        assert failed.last_error == "boom"
        assert await bound.error_history("acme", "i1") == [
            AttemptError(attempt=1, error="boom", at=clock.now(), kind="failed")
        ]
        await conn.rollback()
    assert await postgres_work_queue.error_history("acme", "i1") == []
    item = await postgres_work_queue.get_item("acme", "i1")
    assert item is not None and item.last_error is None


async def test_the_entries_read_back_the_same_instant_in_any_time_zone(
    postgres_work_queue: PostgresWorkQueue, pg_engine: AsyncEngine, clock: ManualClock
) -> None:
    """An entry written by a session in another time zone reads back the clock's instant, in
    UTC, to the microsecond."""
    clock.advance(0.123456)
    await postgres_work_queue.enqueue(WorkItem(tenant="acme", item_id="i1"))
    lease = await postgres_work_queue.claim("w1", lease_for=LEASE)
    assert lease is not None
    async with pg_engine.connect() as conn:
        await conn.begin()
        await conn.execute(text("SET LOCAL TIME ZONE 'Asia/Kolkata'"))
        await postgres_work_queue.bound(conn).fail(lease, "boom")
        await conn.commit()
    (entry,) = await postgres_work_queue.error_history("acme", "i1") or []
    assert entry.at == clock.now()
    assert entry.at.utcoffset() is not None and entry.at.utcoffset().total_seconds() == 0
