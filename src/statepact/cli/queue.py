"""``statepact queue ACTION``: look into a queue, recover, stop work, clean up.

The operator's view of an existing queue on Redis or PostgreSQL (opened as the
worker opens it, through ``open()``'s preflight or verify): per-tenant counts,
a tenant's dead letter (or every tenant's, paged), one dead item brought back, a
tenant's dead letter deleted; and (cli/_queue/lifecycle.py) cancel, pause,
resume, prune, one item shown whole, every queue listed. Lines for a person by
default, one JSON document with ``--json``.
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
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

from statepact.cli._common import (
    CommandError,
    add_debug_argument,
    add_queue_arguments,
    open_queue,
    queue_where,
    run_command,
)
from statepact.cli._queue.lifecycle import (
    KEEP_OPTIONS,
    LIFECYCLE,
    dead_letters_all,
    keep_seconds,
    policy_of,
)
from statepact.cli._queue.shown import clip as _clip
from statepact.cli._queue.shown import item_json as _item_json
from statepact.cli._queue.shown import refused as _refused
from statepact.clock import SystemClock
from statepact.models import QueueStats, WorkItem
from statepact.queue import QueuePolicy, WorkQueue

__all__ = ["ACTIONS", "DESCRIPTION", "add_arguments", "command", "run_action"]

DESCRIPTION = """\
Look into a statepact work queue on Redis or PostgreSQL and recover from its dead
letter:

  stats                       queued, leased, dead and cancelled items per tenant
  dead-letters [TENANT]       the tenant's dead items, oldest death first (--limit N);
                              without TENANT every tenant's, by tenant, paged (--after)
  requeue TENANT ITEM         bring one dead item back, due now, attempts reset
  purge-dead TENANT --yes     delete every dead item of the tenant
  cancel TENANT ITEM...       cancel items (--reason TEXT); running ones are told
  pause | resume              stop every worker claiming from the queue, or let them
  prune [--dry-run]           delete finished items past retention (--keep-done,
                              --keep-cancelled, --keep-dead: seconds or 'forever')
  show TENANT ITEM            one item, every field, and its error history
  queues                      every queue holding items, with its counts

Output is lines for a person; --json prints one JSON document instead. requeue
of an item that is not dead, and purge-dead without --yes (it says how many it
would delete), change nothing and exit 1; so do show and cancel of an item that
does not exist. Passwords in URLs are never printed.
"""

#: Each action: its one-line help.
ACTIONS: dict[str, str] = {
    "stats": "queued, leased and dead items per tenant",
    "dead-letters": "a tenant's dead items, oldest death first",
    "requeue": "bring a dead item back, due now, with its attempts reset",
    "purge-dead": "delete every dead item of a tenant (needs --yes)",
    **{name: help_text for name, (help_text, _run) in LIFECYCLE.items()},
}


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
        if name in ("requeue", "purge-dead", "cancel", "show"):
            sub.add_argument("tenant", metavar="TENANT", help="the tenant whose items")
        if name in ("requeue", "show"):
            sub.add_argument("item_id", metavar="ITEM", help="the item's id (item_id)")
        if name == "cancel":
            sub.add_argument("item_ids", metavar="ITEM", nargs="+", help="the items' ids")
            sub.add_argument(
                "--reason", metavar="TEXT", help="why; stored as each item's last_error"
            )
        if name == "prune":
            _prune_options(sub)
        if name == "dead-letters":
            sub.add_argument(
                "tenant",
                metavar="TENANT",
                nargs="?",
                help="the tenant whose dead items; without it, every tenant's",
            )
            sub.add_argument(
                "--limit",
                type=int,
                default=100,
                metavar="N",
                help="show at most N items, 1 to 1000 (default: 100)",
            )
            sub.add_argument(
                "--after",
                metavar="CURSOR",
                help="without TENANT: the page after the one that printed this cursor",
            )
        if name == "purge-dead":
            sub.add_argument(
                "--yes",
                action="store_true",
                help="really delete them; without it nothing is deleted and the count is shown",
            )
        _common_options(sub)


def _prune_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="count what would be deleted, per status, and delete nothing",
    )
    for option, field, status in KEEP_OPTIONS:
        kept = getattr(QueuePolicy(), field)
        parser.add_argument(
            option,
            dest=field,
            type=keep_seconds,
            default=...,
            metavar="SECONDS",
            help=f"keep {status.value} items this long after they finished, or 'forever' "
            f"(default: {kept.total_seconds():g}, the QueuePolicy default)",
        )


# -- the actions, on any WorkQueue -------------------------------------------------


def _stats_json(stats: QueueStats) -> dict[str, Any]:
    return {
        "queue": stats.queue,
        "tenants": {tenant: counts.model_dump() for tenant, counts in stats.tenants.items()},
        "queued": stats.queued,
        "leased": stats.leased,
        "dead": stats.dead,
        "cancelled": stats.cancelled,
    }


async def _stats(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    stats = await queue.stats()
    if args.json:
        print(json.dumps(_stats_json(stats)), file=out)
        return 0
    if not stats.tenants:
        print(f"queue {stats.queue!r}: no queued, leased, dead or cancelled items", file=out)
        return 0
    width = max(len("tenant"), len("total"), *(len(t) for t in stats.tenants))
    print(f"queue {stats.queue!r}", file=out)
    heads = ("queued", "leased", "dead", "cancelled")
    print(f"  {'tenant':<{width}}  " + "  ".join(f"{h:>9}" for h in heads), file=out)
    rows = [(t, c.queued, c.leased, c.dead, c.cancelled) for t, c in stats.tenants.items()]
    rows.append(("total", stats.queued, stats.leased, stats.dead, stats.cancelled))
    for tenant, *counts in rows:
        print(f"  {tenant:<{width}}  " + "  ".join(f"{c:>9}" for c in counts), file=out)
    return 0


async def _dead_letters(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    if args.tenant is None:
        return await dead_letters_all(queue, args, out)
    if args.after is not None:
        raise CommandError("--after: pages the listing without TENANT only")
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


_Action = Callable[[WorkQueue, argparse.Namespace, TextIO], Awaitable[int]]

_RUN: dict[str, _Action] = {
    "stats": _stats,
    "dead-letters": _dead_letters,
    "requeue": _requeue,
    "purge-dead": _purge_dead,
    **{name: run for name, (_help, run) in LIFECYCLE.items()},
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
        policy = policy_of(args) if args.action == "prune" else None
        async with open_queue(args, pool_size=2, clock=SystemClock(), policy=policy) as queue:
            # Printed only once the action succeeded: a refusal leaves stdout empty.
            shown = io.StringIO()
            code = await run_action(queue, args, shown)
        if not args.json and args.action in ("stats", "dead-letters", "queues", "prune"):
            print(queue_where(args), file=stream)
        stream.write(shown.getvalue())
        return code

    return run_command(f"queue {args.action}", body, debug=args.debug, err=err)
