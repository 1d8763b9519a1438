"""``statepact queue`` actions on the memory queue, through ``run_action`` (what the command runs).

A new process has no memory queue to look into, so the command itself takes a
server (tests/integration/test_cli_queue.py); the actions take any
``WorkQueue``, and here they run on the reference.
"""

from __future__ import annotations

import argparse
import io
import json
from datetime import timedelta

import pytest

from statepact import cli
from statepact.cli._common import CommandError
from statepact.cli.queue import run_action
from statepact.clock import ManualClock
from statepact.models import ItemStatus, WorkItem
from statepact.queue import QueuePolicy
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
        ["tenant", "queued", "leased", "dead", "cancelled"],
        ["acme", "1", "0", "2", "0"],
        ["beta", "0", "0", "1", "0"],
        ["total", "1", "0", "3", "0"],
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


async def test_cancel_each_item_says_what_became_of_it(queue: MemoryWorkQueue) -> None:
    """cancel: a line per item (cancelled, finished already, no such item); exit 1 when an
    item was missing; --reason lands in last_error; --json the statuses."""
    await queue.enqueue(WorkItem(tenant="acme", item_id="q1"))
    out = io.StringIO()
    code = await run_action(
        queue, _args("cancel", "acme", "a3", "q1", "a1", "nope", "--reason", "ops"), out
    )
    assert code == 1
    assert out.getvalue().splitlines() == [
        "'a3' of tenant 'acme' in queue 'default': cancelled",
        "'q1' of tenant 'acme' in queue 'default': cancelled",
        "'a1' of tenant 'acme' in queue 'default': dead already, left as it was",
        "'nope' of tenant 'acme' in queue 'default': no such item",
    ]
    item = await queue.get_item("acme", "q1")
    assert item is not None and item.status is ItemStatus.CANCELLED and item.last_error == "ops"
    document = json.loads(await _run(queue, "cancel", "acme", "q1", "--json"))
    assert document["items"] == [{"item_id": "q1", "status": "cancelled"}]
    with pytest.raises(CommandError, match=r"item_ids\[1\]"):
        await run_action(queue, _args("cancel", "acme", "q1", "q1"), io.StringIO())


async def test_pause_and_resume(queue: MemoryWorkQueue) -> None:
    """pause stops claims and says so; resume lets them through again."""
    assert "paused" in await _run(queue, "pause")
    assert await queue.paused() and await queue.claim("w", lease_for=5) is None
    assert json.loads(await _run(queue, "resume", "--json")) == {
        "queue": "default",
        "paused": False,
    }
    assert await queue.claim("w", lease_for=5) is not None


async def test_prune_dry_run_counts_and_prune_deletes() -> None:
    """prune --dry-run counts what is past retention per status and deletes nothing; prune
    deletes it; a status kept forever is said to be."""
    clock = ManualClock()
    policy = QueuePolicy(keep_done=timedelta(hours=1), keep_dead=None)
    work = MemoryWorkQueue(clock=clock, policy=policy)
    await work.enqueue_many([WorkItem(tenant="acme", item_id=f"i{n}") for n in range(4)])
    for lease in await work.claim_batch("w", lease_for=60, limit=2):
        await work.ack(lease)
    dead = await work.claim("w", lease_for=60)
    assert dead is not None
    await work.fail(dead, "x", retryable=False)
    await work.cancel("acme", "i3")
    clock.advance(timedelta(days=2))
    dry = await _run(work, "prune", "--dry-run", "--keep-dead", "forever")
    assert dry == (
        "queue 'default': prune would delete 3 item(s): 2 done, 1 cancelled, "
        "no dead (kept forever)\n"
    )
    document = json.loads(await _run(work, "prune", "--dry-run", "--json"))
    assert document == {
        "queue": "default",
        "dry_run": True,
        "would_prune": 3,
        "done": 2,
        "cancelled": 1,
        "dead": 0,
    }
    assert await work.get_item("acme", "i0") is not None
    assert await _run(work, "prune") == "queue 'default': pruned 3 finished item(s)\n"
    assert await work.get_item("acme", "i0") is None
    assert await work.get_item("acme", "i2") is not None


def test_prune_refuses_a_bad_keep(capsys: pytest.CaptureFixture[str]) -> None:
    """--keep-done takes seconds or 'forever', nothing else."""
    with pytest.raises(SystemExit):
        _args("prune", "--keep-done", "soon")
    assert "--keep-done: must be seconds or 'forever'" in capsys.readouterr().err


async def test_show_prints_every_field(queue: MemoryWorkQueue) -> None:
    """show: one line per field of the item, then its error history; --json the record
    with the history; a missing item is refused."""
    lines = (await _run(queue, "show", "acme", "a1")).splitlines()
    fields = [line.split()[0] for line in lines[: len(WorkItem.model_fields)]]
    assert fields == list(WorkItem.model_fields)
    assert lines[fields.index("status")].split() == ["status", "dead"]
    assert lines[fields.index("unique_key")].split() == ["unique_key", "-"]
    history = lines[len(WorkItem.model_fields) :]
    assert history[0] == "error history, oldest first (1):"
    assert history[1].split()[:2] == ["attempt", "1"]
    assert history[1].split()[3] == "failed"
    assert history[1].endswith("...") and len(history) == 2  # the 300-x error, clipped
    document = json.loads(await _run(queue, "show", "acme", "a1", "--json"))
    entries = await queue.error_history("acme", "a1")
    assert entries is not None and len(entries) == 1
    assert document.pop("error_history") == [entries[0].model_dump(mode="json")]
    assert document == (await queue.get_item("acme", "a1")).model_dump(mode="json")  # type: ignore[union-attr]
    fresh = json.loads(await _run(queue, "show", "acme", "a3", "--json"))
    assert fresh["error_history"] == []
    with pytest.raises(CommandError, match="no item 'zz' of tenant 'acme'"):
        await run_action(queue, _args("show", "acme", "zz"), io.StringIO())


async def test_dead_letters_of_every_tenant_page_by_tenant(queue: MemoryWorkQueue) -> None:
    """dead-letters without a tenant: every tenant's dead items by (tenant, item id), a page
    at a time, the next page named by --after."""
    first = json.loads(await _run(queue, "dead-letters", "--limit", "2", "--json"))
    assert [(i["tenant"], i["item_id"]) for i in first["items"]] == [
        ("acme", "a1"),
        ("acme", "a2"),
    ]
    assert first["next"] is not None
    lines = (await _run(queue, "dead-letters", "--limit", "2")).splitlines()
    assert lines[-1] == f"more: --after '{first['next']}'"
    rest = json.loads(
        await _run(queue, "dead-letters", "--limit", "2", "--after", first["next"], "--json")
    )
    assert [(i["tenant"], i["item_id"]) for i in rest["items"]] == [("beta", "b1")]
    assert rest["next"] is None
    with pytest.raises(CommandError, match="after"):
        await run_action(queue, _args("dead-letters", "--after", "junk"), io.StringIO())
    with pytest.raises(CommandError, match="--after"):
        await run_action(queue, _args("dead-letters", "acme", "--after", "x"), io.StringIO())


async def test_queues_lists_the_queue_with_its_counts(queue: MemoryWorkQueue) -> None:
    """queues: a row per queue holding items, with queued, leased, dead, cancelled."""
    lines = (await _run(queue, "queues")).splitlines()
    assert [line.split() for line in lines] == [
        ["queue", "queued", "leased", "dead", "cancelled"],
        ["default", "1", "0", "3", "0"],
    ]
    assert json.loads(await _run(queue, "queues", "--json")) == {
        "queues": [{"queue": "default", "queued": 1, "leased": 0, "dead": 3, "cancelled": 0}]
    }
    assert await _run(MemoryWorkQueue(), "queues") == "no queue holds any item\n"
