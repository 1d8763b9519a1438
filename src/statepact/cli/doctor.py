"""``statepact doctor``: ask each server whether it is fit to hold statepact's data.

For Redis it runs the checks of ``preflight()`` one by one (reachable, eviction
policy, persistence) and for PostgreSQL those of ``verify()`` (reachable,
schema version, ``statement_timeout``) plus ``migrate.check()`` (head
revision, no drift) and ``missing_privileges()`` (the connected role's grants),
on a connection as the application's ``create_engine`` opens it, and prints each
as passed or refused, with the reason and the fix. The servers are the options'
(``--redis``, ``--postgres``), else those whose ``STATEPACT_*_URL`` is set. The
exit code is 0 when every check passed and 1 when any was refused.

It reads and reports; it must never change a server's configuration, create or
migrate a table, or print a DSN in clear (``redact_dsn``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from statepact.cli._common import (
    URL_ENV,
    CommandError,
    add_debug_argument,
    add_server_arguments,
    environment_url,
    first_line,
    option_url,
    redis_client,
    run_command,
)
from statepact.cli._common.logs import error_line
from statepact.errors import StatepactError
from statepact.settings import PostgresStoreSettings, redact_dsn

__all__ = ["Check", "add_arguments", "check_postgres", "check_redis", "command"]

DESCRIPTION = """\
Check that the given servers are fit to hold statepact's data. For Redis it
runs preflight()'s checks: reachable; maxmemory-policy must not evict; for
durable data, AOF must be on with appendfsync everysec or always (RDB snapshots
alone forget recent writes). For PostgreSQL, verify()'s, on a connection as
statepact's create_engine opens it: reachable; the schema at a version this
release reads; a statement_timeout on the connection (the role's or the
database's, else the one create_engine sets: see --statement-timeout); the
migrations at the head revision with no drift; and the connected role's
privileges on statepact's tables and sequences. Each check is printed as passed
or refused, with the reason and the fix. Exits 1 when any check is refused.
Reads only: it never changes a setting or a table.

With neither --redis nor --postgres, it checks the servers of STATEPACT_REDIS_URL
and STATEPACT_POSTGRES_URL (or STATEPACT_DATABASE_URL), those that are set.
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
    "statement_timeout is 0 (no limit): the role, the database and the server's "
    "configuration set none, and the application sets none either (--statement-timeout "
    "none); a statement that never ends holds a pooled connection until the process dies"
)
_TIMEOUT_FIX = (
    "ALTER ROLE <role> SET statement_timeout = '30s' (or ALTER DATABASE <db> SET ...; new "
    "connections pick it up), or open the engine with statepact's create_engine, which sets "
    "PostgresStoreSettings.statement_timeout (30 s by default) on each connection"
)
#: Where a non-zero statement_timeout came from, by pg_settings.source.
_TIMEOUT_SOURCES = {
    "session": "set on each connection by create_engine (PostgresStoreSettings."
    "statement_timeout); the role and the database set none, so an engine built another "
    "way gets no limit",
    "client": "passed in the connection's options",
    "user": "set for the role",
    "database": "set for the database",
    "database user": "set for the role in this database",
    "configuration file": "set in the server's configuration",
}
_PRIVILEGES_FIX = (
    "as the tables' owner: GRANT USAGE ON SCHEMA <schema> TO <role>; "
    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "
    "<schema> TO <role>; GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA <schema> TO <role> "
    "(docs/operations.md, The application's role)"
)
_UPGRADE_FIX = (
    "run `statepact db upgrade` on the same database (a role allowed to create tables), or "
    "`alembic upgrade head` where the application's Alembic environment applies statepact's "
    "revisions, or apply EXPECTED_SCHEMA in your own migration"
)
_URL_FIX = "use postgresql://user[:password]@host:port/database"
#: What ``--statement-timeout`` stands for when it is not given: create_engine's default.
DEFAULT_STATEMENT_TIMEOUT: float | None = PostgresStoreSettings().statement_timeout


def _refused_connection(exc: BaseException) -> Check:
    from statepact.storage.postgres import connect_refusal

    refusal = connect_refusal(exc)
    return Check(
        "postgres",
        "reachable",
        False,
        refusal or f"cannot connect: {type(exc).__name__}: {first_line(exc)}",
        ""
        if refusal
        else "check the host, port, database, user and password in the URL and "
        "that the server is running",
    )


async def _timeout_check(engine: Any) -> Check:
    """The ``statement_timeout`` of a connection ``engine`` opens, and where it came from."""
    from sqlalchemy import text

    async with engine.connect() as conn:
        shown, source = (
            await conn.execute(
                text(
                    "SELECT current_setting('statement_timeout'), source FROM pg_settings "
                    "WHERE name = 'statement_timeout'"
                )
            )
        ).one()
    if str(shown).strip() in ("0", "0ms", "0s"):  # the test verify() applies
        return Check("postgres", "statement_timeout", False, _TIMEOUT_REFUSED, _TIMEOUT_FIX)
    origin = _TIMEOUT_SOURCES.get(str(source), f"set by {source}")
    return Check("postgres", "statement_timeout", True, f"statement_timeout is {shown}, {origin}")


async def check_postgres(
    url: str, *, statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT
) -> list[Check]:
    """verify()'s checks against the PostgreSQL at ``url``, one ``Check`` each, on a
    connection as the application's ``create_engine`` opens it: ``statement_timeout``
    (seconds) is set on each connection whose role and database set none, as
    ``PostgresStoreSettings.statement_timeout`` does; ``None`` checks a connection of an
    application that sets none (``statement_timeout=None``, or an engine it built
    itself), which verify() refuses when the role and the database set none either.

    verify()'s schema check, then ``statement_timeout`` read with where it came from,
    then ``migrate.check()`` and the role's privileges (after a schema refusal, only
    the privileges, which may be why the tables are not seen).
    """
    from sqlalchemy import exc as sa_exc
    from sqlalchemy import text

    from statepact.errors import PreflightError, SchemaVersionError
    from statepact.storage.postgres import create_engine, migrate
    from statepact.storage.postgres.verify import missing_privileges, verify

    try:
        settings = PostgresStoreSettings(
            dsn=url, pool_size=1, pool_timeout=CONNECT_TIMEOUT, statement_timeout=statement_timeout
        )
        engine = create_engine(settings, connect_args={"timeout": CONNECT_TIMEOUT})
    except ValueError as exc:
        detail = redact_dsn(str(exc)).removeprefix("dsn: ").splitlines()[0]
        return [Check("postgres", "reachable", False, detail, _URL_FIX)]
    checks: list[Check] = []
    try:
        try:
            async with engine.connect() as conn:
                version = (await conn.execute(text("SHOW server_version"))).scalar()
        except (sa_exc.SQLAlchemyError, OSError, TimeoutError) as exc:
            return [_refused_connection(exc)]
        checks.append(Check("postgres", "reachable", True, f"connected (PostgreSQL {version})"))
        schema_ok = True
        try:
            report = await verify(engine)
        except SchemaVersionError as exc:
            schema_ok = False
            checks.append(Check("postgres", "schema version", False, str(exc), _UPGRADE_FIX))
        except PreflightError as exc:
            # verify() reads the schema first: a refusal here is about the timeout, which
            # the next check reports with where it came from.
            if not any("statement_timeout" in reason for reason in exc.reasons):
                checks.append(Check("postgres", "verify", False, "; ".join(exc.reasons)))
            checks.append(
                Check("postgres", "schema version", True, "at a version this release reads")
            )
        else:
            checks.append(
                Check(
                    "postgres",
                    "schema version",
                    True,
                    f"adk_schema holds version {report.version}, which this release reads",
                )
            )
        if not schema_ok:
            # A schema the role may not enter hides its tables: say so beside "missing".
            lacking = await missing_privileges(engine)
            if lacking:
                checks.append(_privileges_check(lacking))
        checks.append(await _timeout_check(engine))
        if schema_ok:
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
    parser.add_argument(
        "--statement-timeout",
        type=_seconds_or_none,
        default=DEFAULT_STATEMENT_TIMEOUT,
        metavar="S|none",
        help="the statement_timeout the application's engine sets on each connection whose "
        "role and database set none, as create_engine does with PostgresStoreSettings."
        f"statement_timeout (default: {DEFAULT_STATEMENT_TIMEOUT:g}, its default); none for "
        "an application that sets none or builds its own engine",
    )
    add_debug_argument(parser)


def _seconds_or_none(text: str) -> float | None:
    if text.strip().lower() == "none":
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds or none") from None
    if not seconds >= 0.001:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0.001 seconds or more, or none")
    return seconds


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
    try:
        urls = _servers(args)
    except CommandError as exc:  # a usage error: nothing was checked
        print(error_line(f"statepact doctor: error: {exc}"), file=err or sys.stderr)
        return 2

    async def body() -> int:
        with _own_reports():
            return await _check_all(urls, args, stream)

    return run_command("doctor", body, debug=args.debug, err=err)


def _servers(args: argparse.Namespace) -> dict[str, str | None]:
    """The servers to check: the options' (a bare one reads its variable), else those of
    ``STATEPACT_REDIS_URL`` and ``STATEPACT_POSTGRES_URL`` that are set."""
    urls = {kind: option_url(getattr(args, kind), kind) for kind in ("redis", "postgres")}
    if urls["redis"] is None and urls["postgres"] is None:
        urls = {kind: environment_url(kind) for kind in urls}
    if urls["redis"] is None and urls["postgres"] is None:
        raise CommandError(
            f"nothing to check: give --redis URL and/or --postgres URL, or set "
            f"{URL_ENV['redis']} and/or {URL_ENV['postgres']}"
        )
    return urls


@contextmanager
def _own_reports() -> Iterator[None]:
    """preflight()'s and verify()'s refusals are this command's report: their WARNING
    lines (``statepact.redis``, ``statepact.postgres``) would say each twice."""
    loggers = [logging.getLogger(name) for name in ("statepact.redis", "statepact.postgres")]
    saved = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, saved, strict=True):
            logger.setLevel(level)


async def _check_all(urls: dict[str, str | None], args: argparse.Namespace, stream: TextIO) -> int:
    """Check each server of ``urls``, printing to ``stream``; the exit code."""
    refused = 0
    for kind, url in urls.items():
        if not url:
            continue
        print(f"{kind} at {redact_dsn(url)}", file=stream)
        try:
            if kind == "redis":
                checks = await check_redis(url, durable=args.durable)
            else:
                checks = await check_postgres(url, statement_timeout=args.statement_timeout)
        except StatepactError as exc:
            checks = [Check(kind, "checks", False, f"{type(exc).__name__}: {exc}")]
        format_checks(checks, stream)
        refused += sum(not c.passed for c in checks)
    if refused:
        print(f"doctor: {refused} check(s) refused", file=stream)
        return 1
    print("doctor: every check passed", file=stream)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m statepact.cli.doctor``: the doctor without the rest of the command line."""
    parser = argparse.ArgumentParser(prog="statepact doctor", description=DESCRIPTION)
    add_arguments(parser)
    return command(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
