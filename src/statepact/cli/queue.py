"""``statepact queue stats | dead-letters | requeue | purge-dead``: look into a queue, recover.

The operator's view of an existing queue on Redis or PostgreSQL (opened as the
worker opens it, through ``open()``'s preflight or verify): per-tenant counts,
a tenant's dead letter, one dead item brought back, a tenant's dead letter
deleted. Lines for a person by default, one JSON document with ``--json``.
What each action refuses (an item that is not dead, a purge without ``--yes``)
is one line on stderr and exit 1; docs/operations.md has the details.

It must never delete anything without ``--yes``, never print a DSN in clear
(``redact_dsn``), and never reach into a backing's private modules. The actions
take any ``WorkQueue`` (:func:`run_action`), so they run on memory too.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from typing import Any, TextIO

from statepact.cli._common import (
    CommandError,
    add_debug_argument,
    add_queue_arguments,
    open_queue,
    queue_where,
    run_command,
)
from statepact.clock import SystemClock
from statepact.models import QueueStats, WorkItem
from statepact.queue import WorkQueue

__all__ = ["ACTIONS", "DESCRIPTION", "add_arguments", "command", "run_action"]

DESCRIPTION = """\
Look into a statepact work queue on Redis or PostgreSQL and recover from its dead
letter:

  stats                       queued, leased and dead items per tenant
  dead-letters TENANT         the tenant's dead items, oldest death first (--limit N)
  requeue TENANT ITEM         bring one dead item back, due now, attempts reset
  purge-dead TENANT --yes     delete every dead item of the tenant

Output is lines for a person; --json prints one JSON document instead. requeue
of an item that is not dead, and purge-dead without --yes (it says how many it
would delete), change nothing and exit 1. Passwords in URLs are never printed.
"""

#: Each action: its one-line help.
ACTIONS: dict[str, str] = {
    "stats": "queued, leased and dead items per tenant",
    "dead-letters": "a tenant's dead items, oldest death first",
    "requeue": "bring a dead item back, due now, with its attempts reset",
    "purge-dead": "delete every dead item of a tenant (needs --yes)",
}

#: The most characters of an item's payload or last error a human-readable line shows.
SHOWN_CHARS = 120


def _common_options(parser: argparse.ArgumentParser) -> None:
    add_queue_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    add_debug_argument(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(
        dest="action",
        metavar="ACTION",
        required=True,
        help="what to do; `statepact queue ACTION --help` lists its options",
    )
    for name, help_text in ACTIONS.items():
        sub = actions.add_parser(
            name,
            help=help_text,
            description=f"{help_text[0].upper()}{help_text[1:]}, on the queue the options name.",
        )
        if name != "stats":
            sub.add_argument("tenant", metavar="TENANT", help="the tenant whose dead items")
        if name == "requeue":
            sub.add_argument("item_id", metavar="ITEM", help="the dead item's id (item_id)")
        if name == "dead-letters":
            sub.add_argument(
                "--limit",
                type=int,
                default=100,
                metavar="N",
                help="show at most N items, 1 to 1000 (default: 100)",
            )
        if name == "purge-dead":
            sub.add_argument(
                "--yes",
                action="store_true",
                help="really delete them; without it nothing is deleted and the count is shown",
            )
        _common_options(sub)


# -- the actions, on any WorkQueue -------------------------------------------------


def _clip(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else f"{text[: SHOWN_CHARS - 3]}..."


def _item_json(item: WorkItem) -> dict[str, Any]:
    return item.model_dump(mode="json")


def _stats_json(stats: QueueStats) -> dict[str, Any]:
    return {
        "queue": stats.queue,
        "tenants": {tenant: counts.model_dump() for tenant, counts in stats.tenants.items()},
        "queued": stats.queued,
        "leased": stats.leased,
        "dead": stats.dead,
    }


def _refused(exc: ValueError | TypeError) -> CommandError:
    """A front's refusal of an argument (``tenant: must not be empty``) as the command's."""
    return CommandError(str(exc).splitlines()[0])


async def _stats(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    stats = await queue.stats()
    if args.json:
        print(json.dumps(_stats_json(stats)), file=out)
        return 0
    if not stats.tenants:
        print(f"queue {stats.queue!r}: no queued, leased or dead items", file=out)
        return 0
    width = max(len("tenant"), len("total"), *(len(t) for t in stats.tenants))
    print(f"queue {stats.queue!r}", file=out)
    print(f"  {'tenant':<{width}}  {'queued':>8}  {'leased':>8}  {'dead':>8}", file=out)
    rows = [(t, c.queued, c.leased, c.dead) for t, c in stats.tenants.items()]
    rows.append(("total", stats.queued, stats.leased, stats.dead))
    for tenant, queued, leased, dead in rows:
        print(f"  {tenant:<{width}}  {queued:>8}  {leased:>8}  {dead:>8}", file=out)
    return 0


async def _dead_letters(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    try:
        items = await queue.dead_letters(args.tenant, limit=args.limit)
    except (ValueError, TypeError) as exc:
        raise _refused(exc) from None
    total = (await queue.stats()).tenants.get(args.tenant)
    dead = len(items) if total is None else max(total.dead, len(items))
    if args.json:
        document = {
            "queue": queue.name,
            "tenant": args.tenant,
            "dead": dead,
            "items": [_item_json(item) for item in items],
        }
        print(json.dumps(document), file=out)
        return 0
    shown = "" if len(items) == dead else f", the oldest {len(items)} shown (--limit)"
    print(
        f"queue {queue.name!r}, tenant {args.tenant!r}: {dead} dead item(s){shown}",
        file=out,
    )
    for item in items:
        died = item.updated_at.isoformat() if item.updated_at else "-"
        print(
            f"  {item.item_id}  attempts {item.attempts}  died {died}  "
            f"error: {_clip(item.last_error or '-')}",
            file=out,
        )
        print(f"    payload: {_clip(json.dumps(item.payload, sort_keys=True))}", file=out)
    return 0


async def _requeue(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    try:
        back = await queue.requeue(WorkItem(tenant=args.tenant, item_id=args.item_id))
    except (ValueError, TypeError) as exc:
        # "item_id: 'x' of tenant 't' in queue 'q' is queued, not dead; ...": nothing changed.
        raise _refused(exc) from None
    if args.json:
        print(json.dumps(_item_json(back)), file=out)
        return 0
    print(
        f"requeued item {back.item_id!r} of tenant {back.tenant!r} in queue {queue.name!r}: "
        f"queued, due now, attempts reset (last error kept: {_clip(back.last_error or '-')})",
        file=out,
    )
    return 0


async def _purge_dead(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    if not args.yes:
        try:
            await queue.dead_letters(args.tenant, limit=1)  # checks the tenant, as purge would
        except (ValueError, TypeError) as exc:
            raise _refused(exc) from None
        counts = (await queue.stats()).tenants.get(args.tenant)
        dead = 0 if counts is None else counts.dead
        raise CommandError(
            f"would purge {dead} dead item(s) of tenant {args.tenant!r} from queue "
            f"{queue.name!r}; nothing was deleted: pass --yes to delete them"
        )
    try:
        purged = await queue.purge_dead(args.tenant)
    except (ValueError, TypeError) as exc:
        raise _refused(exc) from None
    if args.json:
        print(json.dumps({"queue": queue.name, "tenant": args.tenant, "purged": purged}), file=out)
        return 0
    print(
        f"purged {purged} dead item(s) of tenant {args.tenant!r} from queue {queue.name!r}",
        file=out,
    )
    return 0


_RUN = {
    "stats": _stats,
    "dead-letters": _dead_letters,
    "requeue": _requeue,
    "purge-dead": _purge_dead,
}


async def run_action(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    """Run ``args.action`` on ``queue``, printing to ``out``; a refusal is a ``CommandError``."""
    return await _RUN[args.action](queue, args, out)


def command(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    stream = out or sys.stdout

    async def body() -> int:
        if args.action == "dead-letters" and not 1 <= args.limit <= 1000:
            raise CommandError(f"--limit: must be between 1 and 1000, got {args.limit}")
        async with open_queue(args, pool_size=2, clock=SystemClock()) as queue:
            # Printed only once the action succeeded: a refusal leaves stdout empty.
            shown = io.StringIO()
            code = await run_action(queue, args, shown)
        if not args.json and args.action in ("stats", "dead-letters"):
            print(queue_where(args), file=stream)
        stream.write(shown.getvalue())
        return code

    return run_command(f"queue {args.action}", body, debug=args.debug, err=err)
