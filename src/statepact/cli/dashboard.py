"""``statepact dashboard``: serve the operator's dashboard for a queue on Redis or PostgreSQL.

Opens the backing the options name (as ``statepact queue`` does: ``open()``'s
preflight or verify, nothing created), builds ``statepact.dashboard.create_app``
over it and serves it with uvicorn. Bound to loopback by default; any other
address is refused unless a credential is configured (``--token`` or
``STATEPACT_DASHBOARD_TOKEN``), which every request must then present.

It must never print a DSN in clear (``redact_dsn``) nor the token, and never
serve a non-loopback address without a credential.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TextIO

from statepact.cli._common import (
    CommandError,
    add_debug_argument,
    add_queue_arguments,
    queue_client,
    queue_settings,
    queue_where,
    resolve_queue_server,
    run_command,
)
from statepact.clock import SystemClock
from statepact.settings import RedisStoreSettings

__all__ = ["DEFAULT_PORT", "DESCRIPTION", "TOKEN_ENV", "add_arguments", "command", "is_loopback"]

DESCRIPTION = """\
Serve statepact's operator dashboard (queues, items, runs, workers, /metrics) for a
queue on Redis or PostgreSQL:

  statepact dashboard --postgres URL [--host 127.0.0.1] [--port 8765]

It listens on 127.0.0.1 unless --host says otherwise; a host that is not loopback
is refused unless a credential is set with --token or $STATEPACT_DASHBOARD_TOKEN
(the variable keeps it out of the process list). Every request must then carry it,
as a Bearer token or as the password of HTTP Basic auth. --read-only turns every
action (pause, cancel, requeue, purge) off. Passwords in URLs are never shown.
"""

TOKEN_ENV = "STATEPACT_DASHBOARD_TOKEN"  # noqa: S105 - the variable's name, not a secret
DEFAULT_PORT = 8765


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_queue_arguments(parser)
    parser.add_argument(
        "--also-queue",
        action="append",
        default=[],
        metavar="NAME",
        help="another queue on the same server to show (repeatable)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on")
    parser.add_argument(
        "--token",
        default=None,
        help=f"credential every request must present (else ${TOKEN_ENV}); needed off loopback",
    )
    parser.add_argument("--read-only", action="store_true", help="turn every action off")
    parser.add_argument(
        "--tenant",
        action="append",
        default=[],
        metavar="TENANT",
        help="a tenant whose run totals /metrics reports (repeatable)",
    )
    add_debug_argument(parser)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(args: argparse.Namespace, environ: dict[str, str] | None = None) -> str | None:
    """The credential to require, or ``None``; refuses a non-loopback host without one."""
    env = os.environ if environ is None else environ
    token = args.token or env.get(TOKEN_ENV) or None
    if not is_loopback(args.host) and token is None:
        raise CommandError(
            f"--host {args.host}: refusing to serve the dashboard beyond this machine without "
            f"a credential; set {TOKEN_ENV} (or pass --token), or listen on 127.0.0.1"
        )
    if not 0 < args.port < 65536:
        raise CommandError(f"--port: must be between 1 and 65535, got {args.port}")
    return token


@asynccontextmanager
async def open_dashboard_backing(args: argparse.Namespace) -> AsyncIterator[Any]:
    """The backing (state store, queue) the queue options name, closed on exit."""
    resolve_queue_server(args)
    clock = SystemClock()
    settings = queue_settings(args, pool_size=5)
    async with queue_client(args, settings, max_connections=20) as client:
        backing: Any
        if isinstance(settings, RedisStoreSettings):
            from statepact.storage.redis import open_backing as open_redis

            backing = await open_redis(settings, clock=clock, client=client)
        else:
            from statepact.storage.postgres import open_backing as open_postgres

            backing = await open_postgres(settings, clock=clock, client=client)
        try:
            yield backing
        finally:
            await backing.close()


async def _more_queues(backing: Any, names: list[str]) -> list[Any]:
    """The ``--also-queue`` queues, on the backing's own client and settings."""
    queue = backing.queue
    settings = getattr(queue, "settings", None) or queue._settings
    return [
        await type(queue).open(
            backing.client, clock=queue.clock, settings=settings.replace(queue_name=name)
        )
        for name in names
    ]


def command(args: argparse.Namespace, *, err: TextIO | None = None) -> int:
    async def body() -> int:
        token = check_exposure(args)
        try:
            import uvicorn

            from statepact.dashboard import create_app
        except ImportError as exc:
            raise CommandError(
                f"the dashboard needs its extra: pip install 'statepact[dashboard]' ({exc.name} "
                "is missing)"
            ) from None
        where = queue_where(args)
        async with open_dashboard_backing(args) as backing:
            app = create_app(
                backing,
                queues=await _more_queues(backing, args.also_queue),
                read_only=args.read_only,
                token=token,
                where=where,
                metric_tenants=args.tenant,
            )
            print(
                f"statepact dashboard for {where} at http://{args.host}:{args.port}/ "
                f"({'read-only' if args.read_only else 'actions on'}"
                f"{', credential required' if token else ''})",
                file=sys.stderr,
            )
            config = uvicorn.Config(
                app, host=args.host, port=args.port, log_level="warning", access_log=False
            )
            await uvicorn.Server(config).serve()
        return 0

    return run_command("dashboard", body, debug=args.debug, err=err)
