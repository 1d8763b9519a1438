"""``statepact doctor``: ask each server whether it is fit to hold statepact's data.

For Redis it runs the checks of ``preflight()`` one by one (reachable, eviction
policy, persistence) and for PostgreSQL those of ``verify()`` (reachable,
schema version, ``statement_timeout``) plus ``migrate.check()`` (head
revision, no drift) and ``missing_privileges()`` (the connected role's grants),
and prints each as passed or refused, with the reason and
the fix. The exit code is 0 when every check passed and 1
when any was refused.

It reads and reports; it must never change a server's configuration, create or
migrate a table, or print a DSN in clear (``redact_dsn``).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from statepact.cli._common import (
    CommandError,
    add_debug_argument,
    add_server_arguments,
    first_line,
    redis_client,
    run_command,
)
from statepact.errors import StatepactError
from statepact.settings import redact_dsn

__all__ = ["Check", "add_arguments", "check_postgres", "check_redis", "command"]

DESCRIPTION = """\
Check that the given servers are fit to hold statepact's data. For Redis it
runs preflight()'s checks: reachable; maxmemory-policy must not evict; for
durable data, AOF must be on with appendfsync everysec or always (RDB snapshots
alone forget recent writes). For PostgreSQL, verify()'s:
reachable; the schema at a version this release reads; a statement_timeout on
the connection; the migrations at the head revision with no drift; and the
connected role's privileges on statepact's tables and sequences. Each
check is printed as passed or refused, with the reason and the fix. Exits 1
when any check is refused. Reads only: it never changes a setting or a table.
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
    "turn the append-only file on: appendonly yes with appendfsync everysec or always "
    "(CONFIG SET, and the same lines in redis.conf); RDB save points alone are not enough; "
    "or, only for data that can be recreated, open the stores with "
    "RedisStoreSettings(durable=False) and run doctor with --no-durable"
)


async def check_redis(url: str, *, durable: bool = True) -> list[Check]:
    """preflight()'s checks against the Redis at ``url``, one ``Check`` each."""
    from redis import exceptions as rex

    from statepact.storage.redis.preflight import read_server_configs, refusals

    try:
        client = redis_client(
            url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=CONNECT_TIMEOUT
        )
    except CommandError as exc:
        return [
            Check(
                "redis",
                "reachable",
                False,
                str(exc).removeprefix("--redis: "),
                "use redis://[:password@]host:port/db (or rediss:// for TLS)",
            )
        ]
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
        return (
            f"appendonly is 'yes' with appendfsync {config.appendfsync!r}: every acknowledged "
            "write is in the append-only file"
        )
    return "INFO persistence shows AOF enabled (appendfsync cannot be read without CONFIG)"


# -- PostgreSQL -----------------------------------------------------------------------


_TIMEOUT_REFUSED = (
    "statement_timeout is 0 (no limit) on a plain connection: a statement that never ends "
    "holds a pooled connection until the process dies"
)
_TIMEOUT_FIX = (
    "ALTER ROLE <role> SET statement_timeout = '30s' (or ALTER DATABASE <db> SET ...; new "
    "connections pick it up), or pass it in the application's connection options"
)
_PRIVILEGES_FIX = (
    "as the tables' owner: GRANT USAGE ON SCHEMA <schema> TO <role>; "
    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
    "<schema> TO <role>; GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA <schema> TO <role> "
    "(docs/operations.md, The application's role)"
)
_UPGRADE_FIX = (
    "run `statepact db upgrade --url <the same URL>` with a role allowed to create tables, "
    "or apply EXPECTED_SCHEMA in your own migration"
)


async def check_postgres(url: str) -> list[Check]:
    """verify()'s checks against the PostgreSQL at ``url``, one ``Check`` each.

    ``verify()`` stops at its first refusal (schema, then ``statement_timeout``),
    so after a schema refusal the timeout is read on its own to report it too.
    The connection is a plain one: a ``statement_timeout`` an application sets
    in its own connection options is not seen here (one set for the role or the
    database is).
    """
    from sqlalchemy import exc as sa_exc
    from sqlalchemy import pool, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.ext.asyncio import create_async_engine

    from statepact.errors import PreflightError, SchemaVersionError
    from statepact.storage.postgres import migrate
    from statepact.storage.postgres.verify import missing_privileges, verify

    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError:
        return [
            Check(
                "postgres",
                "reachable",
                False,
                "the --postgres value is not a database URL",
                "use postgresql://user[:password]@host:port/database",
            )
        ]
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    engine = create_async_engine(
        parsed, poolclass=pool.NullPool, connect_args={"timeout": CONNECT_TIMEOUT}
    )
    checks: list[Check] = []
    try:
        try:
            async with engine.connect() as conn:
                version = (await conn.execute(text("SHOW server_version"))).scalar()
        except (sa_exc.SQLAlchemyError, OSError, TimeoutError) as exc:
            return [
                Check(
                    "postgres",
                    "reachable",
                    False,
                    f"cannot connect: {type(exc).__name__}: {first_line(exc)}",
                    "check the host, port, database, user and password in the --postgres URL "
                    "and that the server is running",
                )
            ]
        checks.append(Check("postgres", "reachable", True, f"connected (PostgreSQL {version})"))
        timeout: str | None = None
        schema_ok = False
        try:
            report = await verify(engine)
        except SchemaVersionError as exc:
            checks.append(Check("postgres", "schema version", False, str(exc), _UPGRADE_FIX))
        except PreflightError as exc:
            # verify() reads the schema first: a refusal here is about the timeout.
            schema_ok = True
            checks.append(
                Check("postgres", "schema version", True, "at a version this release reads")
            )
            checks.append(
                Check("postgres", "statement_timeout", False, _TIMEOUT_REFUSED, _TIMEOUT_FIX)
                if any("statement_timeout" in reason for reason in exc.reasons)
                else Check("postgres", "verify", False, "; ".join(exc.reasons))
            )
        else:
            schema_ok = True
            timeout = report.statement_timeout
            checks.append(
                Check(
                    "postgres",
                    "schema version",
                    True,
                    f"adk_schema holds version {report.version}, which this release reads",
                )
            )
            checks.append(
                Check(
                    "postgres",
                    "statement_timeout",
                    True,
                    f"statement_timeout is {timeout} on a plain connection",
                )
            )
        if not schema_ok:
            # A schema the role may not enter hides its tables: say so beside "missing".
            lacking = await missing_privileges(engine)
            if lacking:
                checks.append(_privileges_check(lacking))
            async with engine.connect() as conn:
                shown = str((await conn.execute(text("SHOW statement_timeout"))).scalar())
            # The same test verify() applies, so both checks show even when the schema failed.
            refused = shown.strip() in ("0", "0ms", "0s")
            checks.append(
                Check(
                    "postgres",
                    "statement_timeout",
                    not refused,
                    _TIMEOUT_REFUSED if refused else f"statement_timeout is {shown}",
                    _TIMEOUT_FIX if refused else "",
                )
            )
        else:
            problems = await migrate.check(engine)
            checks.append(
                Check(
                    "postgres",
                    "migrations",
                    not problems,
                    "; ".join(problems)
                    or f"at the head revision ({migrate.head()}); the tables match this release",
                    _UPGRADE_FIX if problems else "",
                )
            )
            checks.append(_privileges_check(await missing_privileges(engine)))
    finally:
        await engine.dispose()
    return checks


def _privileges_check(lacking: list[str]) -> Check:
    if not lacking:
        return Check(
            "postgres",
            "privileges",
            True,
            "the role may read and write every statepact table and sequence",
        )
    return Check(
        "postgres",
        "privileges",
        False,
        "the connected role lacks " + "; ".join(lacking),
        _PRIVILEGES_FIX,
    )


# -- command line ---------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``statepact doctor``."""
    add_server_arguments(parser, verb="check")
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
    """``python -m statepact.cli.doctor``: the doctor without the rest of the command line."""
    parser = argparse.ArgumentParser(prog="statepact doctor", description=DESCRIPTION)
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
