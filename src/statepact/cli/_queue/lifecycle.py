"""``statepact queue cancel | pause | resume | prune | show | queues`` and ``dead-letters``
across tenants: stop work, hold a queue, clean it up, look at one item or every queue.

Each action takes any ``WorkQueue`` (the operator's reads need a ``BaseWorkQueue``,
which every shipped backing is) and prints lines for a person, or one JSON document
with ``--json``. It must never delete what the retention it was given keeps.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import TextIO

from statepact.cli._common import CommandError
from statepact.cli._queue.shown import clip, item_json, refused
from statepact.models import ItemStatus, QueueStats, WorkItem
from statepact.queue import MAX_BATCH, BaseWorkQueue, QueuePolicy, WorkQueue

__all__ = ["KEEP_OPTIONS", "LIFECYCLE", "keep_seconds", "policy_of"]

#: The retention options of ``prune``: option, policy field, the status it keeps.
KEEP_OPTIONS = (
    ("--keep-done", "keep_done", ItemStatus.DONE),
    ("--keep-cancelled", "keep_cancelled", ItemStatus.CANCELLED),
    ("--keep-dead", "keep_dead", ItemStatus.DEAD),
)


def keep_seconds(text: str) -> timedelta | None:
    """A ``--keep-*`` value: seconds (0 or more), or ``forever``."""
    if text == "forever":
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be seconds or 'forever', got {text!r}") from None
    if not 0 <= seconds <= 10 * 365 * 86_400:
        raise argparse.ArgumentTypeError(f"must be 0 to ten years in seconds, got {text!r}")
    return timedelta(seconds=seconds)


def policy_of(args: argparse.Namespace) -> QueuePolicy | None:
    """The policy ``prune`` runs with: the defaults, but for the ``--keep-*`` given."""
    given = {
        field: getattr(args, field)
        for _option, field, _status in KEEP_OPTIONS
        if getattr(args, field, ...) is not ...
    }
    return QueuePolicy(**given) if given else None


def _operator(queue: WorkQueue, action: str) -> BaseWorkQueue:
    if not isinstance(queue, BaseWorkQueue):
        raise CommandError(f"{action}: needs one of statepact's queues, got {type(queue).__name__}")
    return queue


async def _cancel(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    ids: list[str] = list(args.item_ids)
    answers: list[WorkItem | None] = []
    try:
        for start in range(0, len(ids), MAX_BATCH):
            chunk = ids[start : start + MAX_BATCH]
            answers += await queue.cancel_many(args.tenant, chunk, reason=args.reason)
    except (ValueError, TypeError) as exc:
        raise refused(exc) from None
    missing = [item_id for item_id, item in zip(ids, answers, strict=True) if item is None]
    if args.json:
        document = {
            "queue": queue.name,
            "tenant": args.tenant,
            "items": [
                {"item_id": item_id, "status": None if item is None else item.status.value}
                for item_id, item in zip(ids, answers, strict=True)
            ],
        }
        print(json.dumps(document), file=out)
        return 1 if missing else 0
    for item_id, item in zip(ids, answers, strict=True):
        if item is None:
            state = "no such item"
        elif item.status is ItemStatus.CANCELLED:
            state = "cancelled"
        else:
            state = f"{item.status.value} already, left as it was"
        print(f"{item_id!r} of tenant {args.tenant!r} in queue {queue.name!r}: {state}", file=out)
    return 1 if missing else 0


async def _pause(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    await queue.pause()
    _said(queue, args, out, paused=True)
    return 0


async def _resume(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    await queue.resume()
    _said(queue, args, out, paused=False)
    return 0


def _said(queue: WorkQueue, args: argparse.Namespace, out: TextIO, *, paused: bool) -> None:
    if args.json:
        print(json.dumps({"queue": queue.name, "paused": paused}), file=out)
    elif paused:
        print(f"queue {queue.name!r} paused: no worker claims from it until resume", file=out)
    else:
        print(f"queue {queue.name!r} resumed: workers claim from it again", file=out)


async def _prune(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    policy = policy_of(args) or QueuePolicy()
    kept = {status: getattr(policy, field) for _option, field, status in KEEP_OPTIONS}
    if args.dry_run:
        counts = await _operator(queue, "prune --dry-run").prunable()
        total = sum(counts.values())
        if args.json:
            document = {
                "queue": queue.name,
                "dry_run": True,
                "would_prune": total,
                **{status.value: counts.get(status, 0) for status in kept},
            }
            print(json.dumps(document), file=out)
            return 0
        parts = ", ".join(
            f"{counts.get(status, 0)} {status.value}"
            if keep is not None
            else f"no {status.value} (kept forever)"
            for status, keep in kept.items()
        )
        print(f"queue {queue.name!r}: prune would delete {total} item(s): {parts}", file=out)
        return 0
    pruned = await queue.prune()
    if args.json:
        print(json.dumps({"queue": queue.name, "pruned": pruned}), file=out)
        return 0
    print(f"queue {queue.name!r}: pruned {pruned} finished item(s)", file=out)
    return 0


async def _show(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    try:
        item = await queue.get_item(args.tenant, args.item_id)
    except (ValueError, TypeError) as exc:
        raise refused(exc) from None
    if item is None:
        raise CommandError(
            f"no item {args.item_id!r} of tenant {args.tenant!r} in queue {queue.name!r}"
        )
    # Only statepact's own queues keep a history; another WorkQueue's item shows without.
    history = (
        await queue.error_history(args.tenant, args.item_id)
        if isinstance(queue, BaseWorkQueue)
        else None
    )
    document = item_json(item)
    if args.json:
        if history is not None:
            document["error_history"] = [entry.model_dump(mode="json") for entry in history]
        print(json.dumps(document), file=out)
        return 0
    width = max(len(field) for field in document)
    for field, value in document.items():
        shown = json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value
        print(f"{field:<{width}}  {'-' if shown is None else shown}", file=out)
    if history:
        print(f"error history, oldest first ({len(history)}):", file=out)
        for entry in history:
            at = entry.at.isoformat(timespec="seconds")
            print(f"  attempt {entry.attempt}  {at}  {entry.kind}  {clip(entry.error)}", file=out)
    return 0


async def dead_letters_all(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    """``dead-letters`` without a tenant: every tenant's dead items, a page at a time."""
    try:
        page = await _operator(queue, "dead-letters").dead_letters_all(
            after=args.after, limit=args.limit
        )
    except (ValueError, TypeError) as exc:
        raise refused(exc) from None
    if args.json:
        document = {
            "queue": queue.name,
            "items": [item_json(item) for item in page.items],
            "next": page.next,
        }
        print(json.dumps(document), file=out)
        return 0
    print(f"queue {queue.name!r}: {len(page.items)} dead item(s), by tenant", file=out)
    for item in page.items:
        died = item.updated_at.isoformat() if item.updated_at else "-"
        print(
            f"  {item.tenant}  {item.item_id}  attempts {item.attempts}  died {died}  "
            f"error: {clip(item.last_error or '-')}",
            file=out,
        )
    if page.next is not None:
        print(f"more: --after '{page.next}'", file=out)
    return 0


def _queue_row(stats: QueueStats) -> tuple[str, int, int, int, int]:
    return (stats.queue, stats.queued, stats.leased, stats.dead, stats.cancelled)


async def _queues(queue: WorkQueue, args: argparse.Namespace, out: TextIO) -> int:
    found = await _operator(queue, "queues").queues()
    if args.json:
        document = [
            dict(
                zip(("queue", "queued", "leased", "dead", "cancelled"), _queue_row(s), strict=True)
            )
            for s in found
        ]
        print(json.dumps({"queues": document}), file=out)
        return 0
    if not found:
        print("no queue holds any item", file=out)
        return 0
    rows = [_queue_row(stats) for stats in found]
    width = max(len("queue"), *(len(row[0]) for row in rows))
    heads = ("queued", "leased", "dead", "cancelled")
    print(f"  {'queue':<{width}}  " + "  ".join(f"{h:>9}" for h in heads), file=out)
    for name, *counts in rows:
        print(f"  {name:<{width}}  " + "  ".join(f"{c:>9}" for c in counts), file=out)
    return 0


#: The actions of this module, by name: (help, what runs it).
LIFECYCLE = {
    "cancel": ("cancel items of a tenant: queued ones at once, running ones told", _cancel),
    "pause": ("stop every worker claiming from the queue, until resume", _pause),
    "resume": ("let workers claim from a paused queue again", _resume),
    "prune": ("delete finished items past their retention (--dry-run counts them)", _prune),
    "show": ("one item, every field", _show),
    "queues": ("every queue holding items, with its counts", _queues),
}
