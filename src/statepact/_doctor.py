"""``statepact doctor``: ask each server whether it is fit to hold statepact's data.

For Redis it runs the checks of ``preflight()`` one by one (reachable, eviction
policy, persistence) and for PostgreSQL those of ``verify()`` (reachable,
schema version, ``statement_timeout``), and prints each as passed or refused,
with the reason and the fix. The exit code is 0 when every check passed and 1
when any was refused.

It reads and reports; it must never change a server's configuration, create or
migrate a table, or print a DSN in clear (``redact_dsn``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from statepact._demo import CommandError, add_debug_argument, add_server_arguments, run_command
from statepact.errors import StatepactError
from statepact.settings import redact_dsn

__all__ = ["Check", "add_arguments", "check_postgres", "check_redis", "command"]

DESCRIPTION = """\
Check that the given servers are fit to hold statepact's data. For Redis it
runs preflight()'s checks (reachable; maxmemory-policy must not evict; with
durable data, AOF or RDB persistence must be on); for PostgreSQL verify()'s
(reachable; the schema at the version this release reads; a statement_timeout
on the connection). Each check is printed as passed or refused, with the
reason and the fix. Exits 1 when any check is refused. Reads only: it never
changes a setting or a table.
"""

CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class Check:
    """One check's outcome; ``fix`` is set when it was refused."""

    server: str
    name: str
    passed: bool
    detail: str
    fix: str = ""


# -- Redis ----------------------------------------------------------------------------

_EVICTION_FIX = (
    "set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, and the same "
    "line in redis.conf so a restart keeps it)"
)
_PERSISTENCE_FIX = (
    "turn persistence on: appendonly yes (CONFIG SET appendonly yes, and in redis.conf) or RDB "
    "save points; or, only for data that can be recreated, open the stores with "
    "RedisStoreSettings(durable=False) and run doctor with --no-durable"
)


async def check_redis(url: str, *, durable: bool = True) -> list[Check]:
    """preflight()'s checks against the Redis at ``url``, one ``Check`` each."""
    from redis import exceptions as rex
    from redis.asyncio import Redis

    from statepact.storage.redis.preflight import read_server_configs, refusals

    client: Any = Redis.from_url(
        url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=CONNECT_TIMEOUT
    )
    checks: list[Check] = []
    try:
        try:
            await client.ping()
            info = await client.info("server")
        except rex.AuthenticationError as exc:
            return [
                Check(
                    "redis",
                    "reachable",
                    False,
                    f"the server refused the credentials ({exc})",
                    "put the right user and password in the --redis URL",
                )
            ]
        except (rex.ConnectionError, rex.TimeoutError, OSError) as exc:
            return [
                Check(
                    "redis",
                    "reachable",
                    False,
                    f"cannot connect: {type(exc).__name__}: {exc}",
                    "check the host, port and database in the --redis URL and that the server "
                    "is running",
                )
            ]
        except rex.RedisError as exc:
            return [
                Check(
                    "redis",
                    "reachable",
                    False,
                    f"the server answered with an error: {type(exc).__name__}: {exc}",
                    "check that the URL points at a Redis server and the user may run PING",
                )
            ]
        version = info.get("redis_version", "unknown") if isinstance(info, dict) else "unknown"
        checks.append(Check("redis", "reachable", True, f"answered PING (Redis {version})"))
        try:
            configs = await read_server_configs(client)
        except rex.RedisError as exc:
            checks.append(
                Check(
                    "redis",
                    "configuration",
                    False,
                    f"neither CONFIG GET nor INFO could be read: {type(exc).__name__}: {exc}",
                    "allow this user CONFIG GET (or at least INFO) so the settings can be checked",
                )
            )
            return checks
        for config in configs:
            where = "" if len(configs) == 1 else f"{config.server}: "
            eviction = refusals(config, durable=False)
            checks.append(
                Check(
                    "redis",
                    f"{where}eviction",
                    not eviction,
                    "; ".join(eviction)
                    or f"maxmemory-policy is {config.maxmemory_policy!r}: no key is evicted "
                    f"(read with {config.source})",
                    _EVICTION_FIX if eviction else "",
                )
            )
            if not durable:
                checks.append(
                    Check(
                        "redis",
                        f"{where}persistence",
                        True,
                        "not required (--no-durable: the data can be recreated)",
                    )
                )
                continue
            persistence = [r for r in refusals(config, durable=True) if r not in eviction]
            checks.append(
                Check(
                    "redis",
                    f"{where}persistence",
                    not persistence,
                    "; ".join(persistence) or _persistence_detail(config),
                    _PERSISTENCE_FIX if persistence else "",
                )
            )
    finally:
        await client.aclose()
    return checks


def _persistence_detail(config: Any) -> str:
    if config.source == "CONFIG":
        parts = []
        if config.appendonly:
            parts.append("appendonly is 'yes'")
        if config.save:
            parts.append(f"save is {config.save!r}")
        return " and ".join(parts) + ": writes reach disk"
    return "INFO persistence shows AOF enabled or an RDB snapshot taken"


# -- PostgreSQL -----------------------------------------------------------------------


async def check_postgres(url: str) -> list[Check]:
    """verify()'s checks against the PostgreSQL at ``url``, one ``Check`` each."""
    raise CommandError("the PostgreSQL checks are not available in this build yet")


# -- command line ---------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``statepact doctor``."""
    add_server_arguments(parser, verb="check the server")
    parser.add_argument(
        "--no-durable",
        dest="durable",
        action="store_false",
        help="the Redis holds only data that can be recreated (RedisStoreSettings("
        "durable=False)): do not require persistence",
    )
    add_debug_argument(parser)


def format_checks(checks: list[Check], out: TextIO) -> None:
    for check in checks:
        mark = "ok     " if check.passed else "REFUSED"
        print(f"  {mark}  {check.name}: {check.detail}", file=out)
        if not check.passed and check.fix:
            print(f"           fix: {check.fix}", file=out)


def command(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``statepact doctor`` with parsed ``args``; the exit code."""
    stream = out or sys.stdout
    if not args.redis and not args.postgres:
        print(
            "statepact doctor: error: nothing to check; give --redis URL and/or --postgres URL",
            file=err or sys.stderr,
        )
        return 2

    async def body() -> int:
        refused = 0
        for kind, url in (("redis", args.redis), ("postgres", args.postgres)):
            if not url:
                continue
            print(f"{kind} at {redact_dsn(url)}", file=stream)
            try:
                if kind == "redis":
                    checks = await check_redis(url, durable=args.durable)
                else:
                    checks = await check_postgres(url)
            except StatepactError as exc:
                checks = [Check(kind, "checks", False, f"{type(exc).__name__}: {exc}")]
            format_checks(checks, stream)
            refused += sum(not c.passed for c in checks)
        if refused:
            print(f"doctor: {refused} check(s) refused", file=stream)
            return 1
        print("doctor: every check passed", file=stream)
        return 0

    return run_command("doctor", body, debug=args.debug, err=err)


def main(argv: list[str] | None = None) -> int:
    """``python -m statepact._doctor``: the doctor without the rest of the command line."""
    parser = argparse.ArgumentParser(prog="statepact doctor", description=DESCRIPTION)
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
