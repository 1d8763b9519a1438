"""``python -m agents_app <command> URL ...``: run a worker, enqueue work, cancel it, read costs.

URL is ``memory`` (one process only), ``redis://...`` or ``postgresql://...``
(migrated: ``statepact db upgrade``). Every process given the same URL (and
``--namespace`` on Redis) shares the queue, the sessions and the checkpoints.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from agents_app.app import AgentsApp, open_backing_for, until
from agents_app.demo import demo
from agents_app.research import Journal, research_payload
from agents_app.support import turn_payload
from statepact.models import WorkItem

IDLE_POLL_SECONDS = 0.2


async def run_worker(app: AgentsApp, args: argparse.Namespace) -> None:
    """Run a worker until stopped (SIGTERM, Ctrl-C) or, with ``--until-idle``, until the
    queue holds nothing queued or leased (a dead worker's lease counts until reaped)."""
    app.model.latency = args.model_latency
    journal = Journal(Path(args.journal)) if args.journal else None
    worker = app.worker(journal=journal, lease_for=args.lease_seconds, concurrency=args.concurrency)
    print(
        json.dumps({"event": "worker", "id": worker.worker_id, "tasks": list(worker.tasks)}),
        flush=True,
    )
    if not args.until_idle:
        await worker.run()
        return
    async with worker:
        await until(app.idle, poll=IDLE_POLL_SECONDS)


async def enqueue(app: AgentsApp, tenant: str, item_id: str, payload: dict[str, Any]) -> None:
    item = await app.backing.queue.enqueue(
        WorkItem(tenant=tenant, item_id=item_id, payload=payload)
    )
    print(json.dumps({"event": "enqueued", "tenant": tenant, "item_id": item.item_id}), flush=True)


async def run_command(app: AgentsApp, args: argparse.Namespace) -> None:
    if args.command == "worker":
        await run_worker(app, args)
    elif args.command == "turn":
        item_id = args.id or f"turn-{uuid.uuid4().hex[:12]}"
        await enqueue(
            app, args.tenant, item_id, turn_payload(args.user, args.session, args.message)
        )
    elif args.command == "research":
        payload = research_payload(args.thread, args.topic, search_seconds=args.search_seconds)
        await enqueue(app, args.tenant, args.id or f"research-{args.thread}", payload)
    elif args.command == "cancel":
        item = await app.backing.queue.cancel(args.tenant, args.item_id, reason=args.reason)
        print(json.dumps({"event": "cancel", "status": None if item is None else str(item.status)}))
    elif args.command == "usage":
        usage = await app.sessions.usage(app_name=args.tenant)
        print(usage.model_dump_json())


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m agents_app", description=__doc__)
    commands = top.add_subparsers(dest="command", required=True)

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_)
        sub.add_argument("url", help="memory, redis://... or postgresql://...")
        sub.add_argument("--namespace", default=None, help="Redis: the keys' namespace")
        return sub

    worker = command("worker", "run a worker for support turns and research runs")
    worker.add_argument("--lease-seconds", type=float, default=30.0)
    worker.add_argument("--concurrency", type=int, default=10)
    worker.add_argument("--journal", default=None, help="file the graph's nodes log to")
    worker.add_argument("--model-latency", type=float, default=0.0, help="seconds per answer")
    worker.add_argument("--until-idle", action="store_true")
    turn = command("turn", "enqueue one support turn")
    for name in ("tenant", "user", "session", "message"):
        turn.add_argument(name)
    turn.add_argument("--id", default=None, help="the item's id (default: a new one)")
    research = command("research", "enqueue one research run")
    for name in ("tenant", "thread", "topic"):
        research.add_argument(name)
    research.add_argument("--search-seconds", type=float, default=0.5)
    research.add_argument("--id", default=None, help="the item's id (default: research-THREAD)")
    cancel = command("cancel", "cancel an item, stopping its handler if one runs it")
    cancel.add_argument("tenant")
    cancel.add_argument("item_id")
    cancel.add_argument("--reason", default="cancelled from the command line")
    usage = command("usage", "what a tenant's support sessions consumed")
    usage.add_argument("tenant")
    demo_ = commands.add_parser("demo", help="the whole walk-through in this process")
    demo_.add_argument("url", nargs="?", default="memory")
    demo_.add_argument("--namespace", default=None)
    return top


async def _main(args: argparse.Namespace) -> None:
    async with await open_backing_for(args.url, namespace=args.namespace) as backing:
        app = await AgentsApp.open(backing)
        if args.command == "demo":
            await demo(app)
        else:
            await run_command(app, args)


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_main(parser().parse_args(argv)))
