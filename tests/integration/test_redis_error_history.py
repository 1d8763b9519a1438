"""The error history on Redis: what only the server shows.

The behaviour every backing shares is the conformance suite's ``history`` part; this
module checks where the history lives (the item hash's ``errors`` field, cut to
``MAX_ERROR_HISTORY``), that no script's reply carries it, and that an item stored
before the field existed reads as one without a history.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from statepact._limits import MAX_ERROR_HISTORY
from statepact._retry import new_op_id
from statepact.clock import ManualClock, to_micros
from statepact.models import WorkItem
from statepact.queue import QueuePolicy
from statepact.storage.redis import RedisWorkQueue
from statepact.storage.redis import queue as queue_module
from statepact.storage.redis._keys import QueueKeys

pytestmark = pytest.mark.integration

LEASE = 30.0


def _flat(reply: Any) -> list[Any]:
    if isinstance(reply, list):
        return [part for value in reply for part in _flat(value)]
    return [reply]


async def test_the_history_is_a_capped_field_no_reply_carries(
    redis_client: Redis, clock: ManualClock
) -> None:
    """Failures past the cap leave MAX_ERROR_HISTORY entries in the hash's errors field;
    the claim script's reply, the settles' and get_item's never hold it."""
    policy = QueuePolicy(max_attempts=MAX_ERROR_HISTORY + 10, backoff_base=1, jitter=0)
    queue = RedisWorkQueue(redis_client, clock=clock, policy=policy)
    await queue.enqueue(WorkItem(tenant="t", item_id="job"))
    for attempt in range(MAX_ERROR_HISTORY + 2):
        lease = await queue.claim("w", lease_for=LEASE)
        assert lease is not None
        await queue.fail(lease, f"boom {attempt} " + "x" * 1000, retry_in=0)
    key = QueueKeys(queue.settings.namespace, queue.name).item("t", "job")
    stored = json.loads(await redis_client.hget(key, "errors") or b"[]")
    assert len(stored) == MAX_ERROR_HISTORY
    assert stored[-1]["error"].startswith(f"boom {MAX_ERROR_HISTORY + 1} ")
    now = clock.now()
    reply = await queue._run(
        "claim",
        "claim",
        now,
        to_micros(now + timedelta(seconds=LEASE)),
        1,
        queue_module._STEP,
        op=new_op_id(),
    )
    assert b"errors" in await redis_client.hkeys(key)
    assert b"errors" not in _flat(reply)
    assert b"tenant" in _flat(reply)


async def test_an_item_stored_before_the_history_has_none(
    redis_client: Redis, clock: ManualClock
) -> None:
    """An item hash without the errors field (stored by an earlier release) answers [], and
    its first failure starts the history."""
    queue = RedisWorkQueue(redis_client, clock=clock)
    await queue.enqueue(WorkItem(tenant="t", item_id="old"))
    key = QueueKeys(queue.settings.namespace, queue.name).item("t", "old")
    assert b"errors" not in await redis_client.hkeys(key)
    assert await queue.error_history("t", "old") == []
    lease = await queue.claim("w", lease_for=LEASE)
    assert lease is not None
    await queue.fail(lease, "boom")
    assert [entry.error for entry in await queue.error_history("t", "old") or []] == ["boom"]
