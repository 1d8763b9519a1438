"""``statepact queue cancel | pause | resume | prune | show | queues | dead-letters`` (every
tenant) on real Redis and PostgreSQL, through the installed console script.

Each test fills a queue through the library (tests/integration/test_cli_queue.py's
``fill``: acme has dead-1, dead-2, ready and busy (leased); beta has dead-b and b1),
runs ``statepact queue ...`` in a process of its own, and reads the queue back
through the library.
"""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest

from statepact.models import ItemStatus, WorkItem
from statepact.queue import BaseWorkQueue
from tests._cli import run_statepact
from tests.integration.test_cli_queue import PASSWORD, fill, served

pytestmark = pytest.mark.integration

__all__ = ["served"]  # the fixture, shared with test_cli_queue.py


async def statepact(options: list[str], *argv: str) -> subprocess.CompletedProcess[str]:
    done = await asyncio.to_thread(run_statepact, "queue", *argv, *options)
    assert PASSWORD not in done.stdout + done.stderr
    return done


async def test_cancel_stops_queued_and_leased_items(
    served: tuple[list[str], BaseWorkQueue],
) -> None:
    """cancel TENANT ITEM...: queued and leased items become cancelled with the reason, the
    leased one's lease is void; a dead one is left as it was; a missing one exits 1."""
    options, view = served
    busy = await fill(view)
    done = await statepact(options, "cancel", "acme", "ready", "busy", "dead-1", "--reason", "ops")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "'ready' of tenant 'acme' in queue 'jobs': cancelled",
        "'busy' of tenant 'acme' in queue 'jobs': cancelled",
        "'dead-1' of tenant 'acme' in queue 'jobs': dead already, left as it was",
    ]
    for item_id in ("ready", "busy"):
        item = await view.get_item("acme", item_id)
        assert item is not None and item.status is ItemStatus.CANCELLED
        assert item.last_error == "ops"
    from statepact.errors import LeaseLostError

    with pytest.raises(LeaseLostError):
        await view.ack(busy)
    missing = await statepact(options, "cancel", "acme", "nope")
    assert missing.returncode == 1
    assert "no such item" in missing.stdout


async def test_pause_and_resume_across_processes(
    served: tuple[list[str], BaseWorkQueue],
) -> None:
    """pause from the command stops this process's claims; resume lets them through."""
    options, view = served
    await fill(view)
    done = await statepact(options, "pause")
    assert done.returncode == 0, done.stderr
    assert await view.paused() is True
    assert await view.claim("w", lease_for=30) is None
    done = await statepact(options, "resume", "--json")
    assert (done.returncode, json.loads(done.stdout)) == (0, {"queue": "jobs", "paused": False})
    assert await view.claim("w", lease_for=30) is not None


async def test_prune_dry_run_then_prune(served: tuple[list[str], BaseWorkQueue]) -> None:
    """prune --dry-run --keep-dead 0 counts the dead items and deletes nothing; prune with
    it deletes them; the default retention keeps them (they died just now)."""
    options, view = served
    await fill(view)
    await asyncio.sleep(0.01)
    keep = ["--keep-dead", "0"]
    dry = await statepact(options, "prune", "--dry-run", "--json", *keep)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["dead"] == 3
    assert (await view.stats()).dead == 3
    default = await statepact(options, "prune", "--json")
    assert json.loads(default.stdout) == {"queue": "jobs", "pruned": 0}
    pruned = await statepact(options, "prune", "--json", *keep)
    assert json.loads(pruned.stdout) == {"queue": "jobs", "pruned": 3}
    assert (await view.stats()).dead == 0


async def test_show_queues_and_every_tenants_dead_letters(
    served: tuple[list[str], BaseWorkQueue],
) -> None:
    """show prints every field of one item; queues lists the queue with its counts;
    dead-letters without a tenant pages every tenant's dead items."""
    options, view = served
    await fill(view)
    await view.enqueue(WorkItem(tenant="acme", item_id="u", unique_key="k", timeout=9.5))
    shown = await statepact(options, "show", "acme", "u", "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document.pop("error_history") == []
    assert document == (await view.get_item("acme", "u")).model_dump(mode="json")  # type: ignore[union-attr]
    listed = await statepact(options, "queues", "--json")
    assert json.loads(listed.stdout) == {
        "queues": [{"queue": "jobs", "queued": 3, "leased": 1, "dead": 3, "cancelled": 0}]
    }
    page = json.loads((await statepact(options, "dead-letters", "--limit", "2", "--json")).stdout)
    assert [(i["tenant"], i["item_id"]) for i in page["items"]] == [
        ("acme", "dead-1"),
        ("acme", "dead-2"),
    ]
    rest = await statepact(options, "dead-letters", "--after", page["next"], "--json")
    assert [(i["tenant"], i["item_id"]) for i in json.loads(rest.stdout)["items"]] == [
        ("beta", "dead-b")
    ]
