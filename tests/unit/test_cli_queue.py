"""``statepact queue`` actions on the memory queue, through ``run_action`` (what the command runs).

A new process has no memory queue to look into, so the command itself takes a
server (tests/integration/test_cli_queue.py); the actions take any
``WorkQueue``, and here they run on the reference.
"""

from __future__ import annotations

import argparse
import io
import json

import pytest

from statepact import cli
from statepact.cli._common import CommandError
from statepact.cli.queue import run_action
from statepact.clock import ManualClock
from statepact.models import ItemStatus, WorkItem
from statepact.storage.memory import MemoryWorkQueue

# The server options are parsed but never used: run_action is handed the queue.
SERVER = ["--redis", "redis://127.0.0.1:1/0"]


def _args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["queue", *argv, *SERVER])


async def _run(queue: MemoryWorkQueue, *argv: str) -> str:
    out = io.StringIO()
    assert await run_action(queue, _args(*argv), out) == 0
    return out.getvalue()


@pytest.fixture
async def queue() -> MemoryWorkQueue:
    """acme: two dead items and one queued; beta: one dead."""
    work = MemoryWorkQueue(clock=ManualClock())
    for tenant, item_id in (("acme", "a1"), ("acme", "a2"), ("beta", "b1"), ("acme", "a3")):
        await work.enqueue(WorkItem(tenant=tenant, item_id=item_id, payload={"x": item_id}))
    for _ in range(3):
        lease = await work.claim("w", lease_for=60)
        assert lease is not None
        await work.fail(lease, "boom " + "x" * 300, retryable=False)
    return work


async def test_stats_and_its_json(queue: MemoryWorkQueue) -> None:
    """stats: a row per tenant and the totals; --json the same numbers."""
    lines = (await _run(queue, "stats")).splitlines()
    assert [line.split() for line in lines[1:]] == [
        ["tenant", "queued", "leased", "dead"],
        ["acme", "1", "0", "2"],
        ["beta", "0", "0", "1"],
        ["total", "1", "0", "3"],
    ]
    document = json.loads(await _run(queue, "stats", "--json"))
    assert document["tenants"]["acme"] == {"queued": 1, "leased": 0, "dead": 2, "cancelled": 0}
    assert (document["queued"], document["leased"], document["dead"]) == (1, 0, 3)


async def test_dead_letters_clips_long_errors(queue: MemoryWorkQueue) -> None:
    """A long last error is cut to a line's worth, ending in '...'; --json keeps it whole."""
    lines = (await _run(queue, "dead-letters", "acme")).splitlines()
    assert lines[0] == "queue 'default', tenant 'acme': 2 dead item(s)"
    assert lines[1].endswith("x...")
    assert len(lines[1].partition("error: ")[2]) == 120
    items = json.loads(await _run(queue, "dead-letters", "acme", "--json"))["items"]
    assert items[0]["last_error"] == "boom " + "x" * 300


async def test_requeue_and_purge(queue: MemoryWorkQueue) -> None:
    """requeue of a dead item works and of a queued one is refused; purge-dead needs --yes,
    then deletes that tenant's dead items only."""
    assert "requeued item 'a1'" in await _run(queue, "requeue", "acme", "a1")
    with pytest.raises(CommandError, match=r"'a1' of tenant 'acme' .* is queued, not dead"):
        await run_action(queue, _args("requeue", "acme", "a1"), io.StringIO())
    with pytest.raises(CommandError, match="would purge 1 dead item"):
        await run_action(queue, _args("purge-dead", "acme"), io.StringIO())
    assert len(await queue.dead_letters("acme")) == 1
    assert await _run(queue, "purge-dead", "acme", "--yes") == (
        "purged 1 dead item(s) of tenant 'acme' from queue 'default'\n"
    )
    assert await queue.dead_letters("acme") == []
    assert [i.item_id for i in await queue.dead_letters("beta")] == ["b1"]
    item = await queue.get_item("acme", "a1")
    assert item is not None and item.status is ItemStatus.QUEUED
