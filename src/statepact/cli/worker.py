"""``statepact worker MODULE:OBJECT --redis URL | --postgres URL``: run a Worker until SIGTERM.

Imports ``MODULE`` (from the current directory too, as ``python -m`` would),
takes ``OBJECT`` (a dotted attribute path) and opens the queue on the server
(the option's URL, else ``STATEPACT_REDIS_URL`` / ``STATEPACT_POSTGRES_URL``)
with the retry policy :func:`queue_policy` settles: a
:class:`~statepact.worker.Worker` defined without a queue is bound to it, a
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
from statepact.cli._common.supervisor import CHILD_ENV, Supervisor, child_arguments
from statepact.clock import SystemClock
from statepact.queue import QueuePolicy, WorkQueue
from statepact.worker import Worker
from statepact.worker._policy import PolicyMismatchError, describe_policy, settle_policy

__all__ = [
    "DESCRIPTION",
    "POLICY_OPTIONS",
    "add_arguments",
    "carried_policy",
    "command",
    "describe_policy",
    "load_worker",
    "load_worker_object",
    "queue_policy",
]

DESCRIPTION = """\
Run a statepact Worker on a Redis or PostgreSQL queue until SIGTERM or SIGINT.
MODULE:OBJECT names a Worker (defined with no queue: this command binds it) or a
factory called with the queue that returns one. On SIGTERM/SIGINT the worker stops
claiming, lets handlers finish within the grace period, then cancels and releases
what is left, and exits 0. Each queue needs its tables (PostgreSQL: run
`statepact db upgrade` first). Passwords in URLs are never printed.

The server: --redis URL or --postgres URL, else the one of STATEPACT_REDIS_URL and
STATEPACT_POSTGRES_URL that is set (a bare --redis or --postgres picks one when
both are). The retry policy, field by field: the option given here
(--max-attempts, --backoff-base, --backoff-cap, --jitter), else the policy the
Worker carries (Worker.policy), else QueuePolicy's default. Each failure, retry,
dead letter and lost lease is a log line on stderr (--log-level, --log-format).
"""

#: The policy options, each a ``QueuePolicy`` field: (option, field, type, help).
POLICY_OPTIONS: tuple[tuple[str, str, type, str], ...] = (
    ("--max-attempts", "max_attempts", int, "claims of an item before its failure is dead"),
    ("--backoff-base", "backoff_base", float, "seconds before the first retry"),
    ("--backoff-cap", "backoff_cap", float, "the longest wait between retries, in seconds"),
    ("--jitter", "jitter", float, "the share (0 to 1) of each wait cut at random"),
)


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
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        metavar="N",
        help="worker processes under one supervisor, each with its own pool (default 1)",
    )
    default = QueuePolicy()
    for option, field, kind, help_text in POLICY_OPTIONS:
        parser.add_argument(
            option,
            dest=field,
            type=kind,
            metavar="N" if kind is int else "S" if "seconds" in help_text else "F",
            help=f"{help_text} (default: the Worker's policy, else {getattr(default, field)})",
        )
    add_debug_argument(parser)


def carried_policy(found: object) -> QueuePolicy | None:
    """The ``QueuePolicy`` a Worker carries (``Worker(policy=)``), or ``None``."""
    return found.policy if isinstance(found, Worker) else None


def queue_policy(args: argparse.Namespace, carried: QueuePolicy | None) -> QueuePolicy:
    """The queue's policy by the one rule (:func:`statepact.worker._policy.settle_policy`):
    the option given, else ``carried`` (the Worker's), else ``QueuePolicy``'s default. A
    value the policy refuses is a ``CommandError`` naming the option."""
    from pydantic import ValidationError

    given = {field: getattr(args, field, None) for _, field, _, _ in POLICY_OPTIONS}
    try:
        return settle_policy(given, carried)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "backoff_cap"
        option = next((o for o, f, _, _ in POLICY_OPTIONS if f == field), "--backoff-cap")
        message = str(error["msg"]).removeprefix("Value error, ").removeprefix(field + ": ")
        raise CommandError(f"{option}: {message}") from None


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


def _factory_policy(own: QueuePolicy, runs: QueuePolicy) -> str:
    return (
        f"MODULE:OBJECT: the factory's Worker carries a policy ({describe_policy(own)}) other "
        f"than its queue's ({describe_policy(runs)}); pass it as options (--max-attempts, "
        "--backoff-base, --backoff-cap, --jitter), or define the Worker with no queue for this "
        "command to bind"
    )


async def load_worker(found: object, queue: WorkQueue) -> Worker:
    """Bind a Worker to ``queue``, or build one with a factory; refuse anything else."""
    worker: object = found
    if not isinstance(found, Worker) and callable(found):
        try:
            worker = found(queue)
        except PolicyMismatchError as exc:
            # A factory's Worker: its queue was opened (with the options and the default)
            # before the factory could say what it wanted.
            raise CommandError(_factory_policy(exc.wanted, exc.runs)) from None
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
    if args.processes > 1 and os.environ.get(CHILD_ENV) is None:
        arguments = child_arguments(getattr(args, "arguments", sys.argv[1:]))
        return Supervisor(arguments, args.processes, out=stream).run()

    async def body() -> int:
        where = queue_where(args)
        found = load_worker_object(args.target)
        policy = queue_policy(args, carried_policy(found))
        concurrency = args.concurrency
        if concurrency is None and isinstance(found, Worker):
            concurrency = found.concurrency
        if concurrency is not None and concurrency < 1:
            raise CommandError(f"--concurrency: must be 1 or more, got {concurrency}")
        if args.processes < 1:
            raise CommandError(f"--processes: must be 1 or more, got {args.processes}")
        # A worker holds at most concurrency + 2 connections (its items and claim, the
        # LISTEN, the reaper), + 3 with schedules (docs/worker.md): size for the most.
        pool_size = (concurrency or 10) + 3
        clock = SystemClock()
        if isinstance(found, Worker) and found.policy is not None:
            found._settled(policy)  # the options override the Worker's, field by field
        async with open_queue(args, pool_size=pool_size, clock=clock, policy=policy) as queue:
            worker = await load_worker(found, queue)
            own = carried_policy(worker)
            if worker is not found and own is not None and own != policy:
                raise CommandError(_factory_policy(own, policy))
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
                f"concurrency {worker.concurrency}, {describe_policy(policy)}, "
                f"tasks: {', '.join(worker.tasks) or '-'}",
                file=stream,
                flush=True,
            )
            await worker.run()
            print(f"statepact worker {worker.worker_id}: stopped", file=stream, flush=True)
        return 0

    return run_command("worker", body, debug=args.debug)
