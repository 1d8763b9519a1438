"""The ``statepact`` command line: one argparse parser, one subcommand per :data:`COMMANDS` entry.

Each subcommand lives in a module that offers ``DESCRIPTION``,
``add_arguments(parser)`` and ``command(args) -> int`` (the exit code); adding
one is adding a :class:`Subcommand` line. The modules are imported only when
their subcommand runs or the help lists them, so ``statepact db`` never loads
redis and ``statepact demo`` never loads SQLAlchemy unless asked for a server.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["COMMANDS", "Subcommand", "build_parser", "main"]


@dataclass(frozen=True, slots=True)
class Subcommand:
    """A subcommand: its name, one-line help, and the module implementing it."""

    name: str
    help: str
    module: str


COMMANDS: tuple[Subcommand, ...] = (
    Subcommand(
        "demo",
        "run a small multi-tenant agent fleet and show what the library does",
        "statepact.cli.demo",
    ),
    Subcommand("bench", "measure state, queue and transaction throughput", "statepact.cli.bench"),
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
        run: Callable[[argparse.Namespace], int] = module.command
        sub.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``statepact`` entry point; returns the exit code."""
    args: Any = build_parser().parse_args(argv)
    return int(args.run(args))
