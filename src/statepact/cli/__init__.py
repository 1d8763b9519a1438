"""The ``statepact`` command line: one argparse parser, one subcommand per :data:`COMMANDS` entry.

Each subcommand lives in a module that offers ``DESCRIPTION``,
``add_arguments(parser)`` and ``command(args) -> int`` (the exit code); adding
one is adding a :class:`Subcommand` line. The modules are imported only when
their subcommand runs or the help lists them, so ``statepact db`` never loads
redis and ``statepact demo`` never loads SQLAlchemy unless asked for a server.

Every subcommand takes ``--log-level`` and ``--log-format`` (``cli._common.logs``): the
log lines the library writes while it runs go to stderr, INFO and above by
default (``Subcommand.log_level``: the demo, which narrates what the lines would
say, shows errors only; the bench, whose progress is on stderr, warnings).
``--debug`` is ``--log-level debug``, which also prints the traceback of a
command that fails.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from statepact.cli._common.logs import DEFAULT_LEVEL, add_logging_arguments, command_logging

__all__ = ["COMMANDS", "Subcommand", "build_parser", "main"]


@dataclass(frozen=True, slots=True)
class Subcommand:
    """A subcommand: its name, one-line help, and the module implementing it."""

    name: str
    help: str
    module: str
    log_level: str = DEFAULT_LEVEL  # without --log-level


COMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        "demo",
        "run a small multi-tenant agent fleet and show what the library does",
        "statepact.cli.demo",
        log_level="error",
    ),
    Subcommand(
        "bench",
        "measure state, queue and transaction throughput",
        "statepact.cli.bench",
        log_level="warning",
    ),
    Subcommand(
        "doctor", "check that servers are fit to hold statepact's data", "statepact.cli.doctor"
    ),
    Subcommand("db", "apply, undo and inspect the PostgreSQL migrations", "statepact.cli.db"),
    Subcommand("worker", "run a Worker on a Redis or PostgreSQL queue", "statepact.cli.worker"),
    Subcommand(
        "queue",
        "inspect a queue, requeue or purge its dead letters",
        "statepact.cli.queue",
    ),
    Subcommand(
        "dashboard",
        "serve the operator's web dashboard and /metrics for a queue",
        "statepact.cli.dashboard",
    ),
)


# -- the parser -------------------------------------------------------------------------


def _load(spec: Subcommand) -> ModuleType:
    return importlib.import_module(spec.module)


def build_parser(commands: Sequence[Subcommand] = COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="statepact",
        description="Durable state, fair work queues and coordination transactions for "
        "fleets of AI agents, on memory, Redis and PostgreSQL.",
    )
    subcommands = parser.add_subparsers(
        dest="command",
        metavar="COMMAND",
        required=True,
        help="what to run; `statepact COMMAND --help` lists its options",
    )
    for spec in commands:
        module = _load(spec)
        sub = subcommands.add_parser(
            spec.name,
            help=spec.help,
            description=getattr(module, "DESCRIPTION", spec.help),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        add_logging_arguments(sub)
        run: Callable[[argparse.Namespace], int] = module.command
        sub.set_defaults(run=run, default_log_level=spec.log_level)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``statepact`` entry point; returns the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    args: Any = build_parser().parse_args(arguments)
    args.arguments = arguments  # what `worker --processes` hands its children
    level = getattr(args, "log_level", args.default_log_level)
    level = "debug" if getattr(args, "debug", False) else level
    args.debug = level == "debug"  # the traceback of a command that fails, too
    with command_logging(level, getattr(args, "log_format", "text")):
        return int(args.run(args))
