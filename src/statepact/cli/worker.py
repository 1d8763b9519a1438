"""``statepact worker MODULE:OBJECT --redis URL | --postgres URL``: run a Worker until SIGTERM.

Imports ``MODULE`` (from the current directory too, as ``python -m`` would),
takes ``OBJECT`` (a dotted attribute path) and opens the queue on the server:
a :class:`~statepact.worker.Worker` defined without a queue is bound to it, a
factory is called with the queue and returns the Worker (or an awaitable of
one). Then ``Worker.run()``: SIGTERM or SIGINT drains it (docs/worker.md). This
module must never print a DSN unredacted, and never reach into a backing's
private modules.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import os
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
from statepact.queue import WorkQueue
from statepact.worker import Worker

__all__ = ["DESCRIPTION", "add_arguments", "command", "load_worker", "load_worker_object"]

DESCRIPTION = """\
Run a statepact Worker on a Redis or PostgreSQL queue until SIGTERM or SIGINT.
MODULE:OBJECT names a Worker (defined with no queue: this command binds it) or a
factory called with the queue that returns one. On SIGTERM/SIGINT the worker stops
claiming, lets handlers finish within the grace period, then cancels and releases
what is left, and exits 0. Each queue needs its tables (PostgreSQL: run
`statepact db upgrade` first). Passwords in URLs are never printed.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target", metavar="MODULE:OBJECT", help="the Worker, or a factory taking the queue"
    )
    add_queue_arguments(parser)
    parser.add_argument(
        "--concurrency", type=int, metavar="N", help="handlers at once (default: the Worker's)"
    )
    parser.add_argument(
        "--grace-period", type=float, metavar="S", help="seconds handlers get on SIGTERM"
    )
    add_debug_argument(parser)


def load_worker_object(target: str) -> Any:
    """The object ``MODULE:OBJECT`` names; a ``CommandError`` saying what is wrong."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise CommandError(f"MODULE:OBJECT: {target!r} is not of the form package.module:name")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise CommandError(f"MODULE:OBJECT: no module named {exc.name!r}") from exc
        raise
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise CommandError(f"MODULE:OBJECT: {module_name!r} has no {attribute!r}") from None
    return found


async def load_worker(found: object, queue: WorkQueue) -> Worker:
    """Bind a Worker to ``queue``, or build one with a factory; refuse anything else."""
    worker: object = found
    if not isinstance(found, Worker) and callable(found):
        worker = found(queue)
        if inspect.isawaitable(worker):
            worker = await worker
        if not isinstance(worker, Worker):
            raise CommandError(
                f"MODULE:OBJECT: the factory returned a {type(worker).__name__}, not a Worker"
            )
    elif not isinstance(found, Worker):
        raise CommandError(
            f"MODULE:OBJECT: names a {type(found).__name__}; name a Worker or a factory "
            "taking the queue"
        )
    assert isinstance(worker, Worker)
    try:
        return worker.bind(queue)
    except RuntimeError:
        raise CommandError(
            "MODULE:OBJECT: that Worker already has a queue of its own; define it with "
            "Worker() and no queue, or a factory taking the queue"
        ) from None


def command(args: argparse.Namespace, *, out: TextIO | None = None) -> int:
    stream = out or sys.stdout
    where = queue_where(args)

    async def body() -> int:
        found = load_worker_object(args.target)
        concurrency = args.concurrency
        if concurrency is None and isinstance(found, Worker):
            concurrency = found.concurrency
        if concurrency is not None and concurrency < 1:
            raise CommandError(f"--concurrency: must be 1 or more, got {concurrency}")
        # A worker holds at most concurrency + 2 connections (its items and claim, the
        # LISTEN, the reaper), + 3 with schedules (docs/worker.md): size for the most.
        pool_size = (concurrency or 10) + 3
        async with open_queue(args, pool_size=pool_size, clock=SystemClock()) as queue:
            worker = await load_worker(found, queue)
            if args.concurrency is not None:
                worker.concurrency = args.concurrency
            if worker.concurrency + 3 > pool_size:
                print(
                    f"note: concurrency {worker.concurrency} needs {worker.concurrency + 3} "
                    f"connections, the pool has {pool_size}; pass --concurrency to size it",
                    file=sys.stderr,
                )
            if args.grace_period is not None:
                if not args.grace_period >= 0:
                    raise CommandError("--grace-period: must be 0 or more seconds")
                worker.grace_period = args.grace_period
            print(
                f"statepact worker {worker.worker_id}: queue {queue.name!r} on {where}, "
                f"concurrency {worker.concurrency}, tasks: {', '.join(worker.tasks) or '-'}",
                file=stream,
                flush=True,
            )
            await worker.run()
            print(f"statepact worker {worker.worker_id}: stopped", file=stream, flush=True)
        return 0

    return run_command("worker", body, debug=args.debug)
