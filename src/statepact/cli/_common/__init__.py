"""What the ``statepact`` commands share: opening the three protocols on a backing from
a URL (under a scratch namespace or schema removed afterwards), opening an existing
work queue on a server (``worker``, ``queue``), a Redis client from a URL, the
``--redis``/``--postgres``/``--debug`` options and where a server's URL comes from
(the option, else ``STATEPACT_REDIS_URL`` / ``STATEPACT_POSTGRES_URL``); and, from
``cli._common.errors``, turning an error into one line on stderr.

It must never print a DSN in clear (``redact_dsn``), never leave data behind on a
server, and never import redis or SQLAlchemy unless a server was asked for.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from statepact._cancel import finish
from statepact.cli._common.errors import CommandError, describe_error, run_command
from statepact.cli._common.logs import add_logging_arguments
from statepact.clock import Clock
from statepact.errors import PreflightError
from statepact.queue import QueuePolicy, WorkQueue
from statepact.settings import PostgresStoreSettings, RedisStoreSettings, redact_dsn
from statepact.state import StateStore
from statepact.storage import Backing
from statepact.tx import TransactionManager

__all__ = [
    "CLI_STATEMENT_TIMEOUT_MS",
    "FROM_ENVIRONMENT",
    "POSTGRES_URL_ALIAS",
    "URL_ENV",
    "Backings",
    "CommandError",
    "add_debug_argument",
    "add_queue_arguments",
    "add_server_arguments",
    "delete_keys",
    "describe_error",
    "environment_url",
    "first_line",
    "open_backings",
    "open_queue",
    "option_url",
    "postgres_engine_url",
    "queue_client",
    "queue_settings",
    "queue_where",
    "redis_client",
    "resolve_queue_server",
    "run_command",
]


def add_debug_argument(parser: argparse.ArgumentParser) -> None:
    if not any(action.dest == "debug" for action in parser._actions):
        parser.add_argument(
            "--debug",
            action="store_true",
            help="the same as --log-level debug: every log line, and the full traceback "
            "when something fails",
        )
    add_logging_arguments(parser)


# -- where a server's URL comes from --------------------------------------------------

#: The environment variable holding each server's URL, read when no option gives one.
URL_ENV = {"redis": "STATEPACT_REDIS_URL", "postgres": "STATEPACT_POSTGRES_URL"}
#: The older name of ``STATEPACT_POSTGRES_URL`` (``statepact db`` read it first), kept.
POSTGRES_URL_ALIAS = "STATEPACT_DATABASE_URL"
#: What a bare ``--redis`` / ``--postgres`` (no URL after it) stands for: the variable's URL.
FROM_ENVIRONMENT = "\x00environment"


def environment_url(kind: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The URL of ``kind``'s server in the environment, or ``None``.

    PostgreSQL's is ``STATEPACT_POSTGRES_URL``, else ``STATEPACT_DATABASE_URL``; both
    set to different URLs is refused, since which database is meant cannot be told.
    """
    env = os.environ if environ is None else environ
    url = env.get(URL_ENV[kind]) or None
    if kind != "postgres":
        return url
    alias = env.get(POSTGRES_URL_ALIAS) or None
    if url is not None and alias is not None and url != alias:
        raise CommandError(
            f"{URL_ENV['postgres']} and {POSTGRES_URL_ALIAS} (its older name) name different "
            "databases; unset one"
        )
    return url or alias


def option_url(value: str | None, kind: str) -> str | None:
    """The URL a ``--redis`` / ``--postgres`` option gave: its own, the environment's when
    it was given bare, ``None`` when it was not given."""
    if value != FROM_ENVIRONMENT:
        return value
    url = environment_url(kind)
    if url is None:
        raise CommandError(
            f"--{kind} was given without a URL, so it reads {URL_ENV[kind]}, which is not set"
        )
    return url


def _server_option(parser: Any, kind: str, help_text: str) -> None:
    """``--redis [URL]`` / ``--postgres [URL]`` on ``parser`` (or a group)."""
    example = {
        "redis": "redis://[:password@]host:port/db",
        "postgres": "postgresql://user[:password]@host:port/db",
    }[kind]
    parser.add_argument(
        f"--{kind}",
        metavar="URL",
        nargs="?",
        const=FROM_ENVIRONMENT,
        help=f"{help_text} ({example}); given bare, the URL is ${URL_ENV[kind]}'s. Its "
        "password is never printed",
    )


def add_server_arguments(parser: argparse.ArgumentParser, *, verb: str) -> None:
    """``--redis [URL]`` and ``--postgres [URL]``; ``verb`` says what is done there
    ("measure on"). A bare option reads the server's environment variable."""
    _server_option(parser, "redis", f"{verb} this Redis")
    _server_option(parser, "postgres", f"{verb} this PostgreSQL")


def add_queue_arguments(parser: argparse.ArgumentParser) -> None:
    """Where an existing queue lives: ``--redis [URL] | --postgres [URL]`` (at most one;
    neither: the server whose environment variable is set), ``--queue``,
    ``--namespace`` (Redis), ``--schema`` (PostgreSQL) and ``--no-durable``; and the
    logging options, so they follow an action too (``statepact queue stats --log-level
    debug``)."""
    where = parser.add_mutually_exclusive_group()
    _server_option(where, "redis", "the Redis")
    _server_option(where, "postgres", "the PostgreSQL")
    parser.add_argument(
        "--queue", default="default", metavar="NAME", help="the queue's name (default: default)"
    )
    parser.add_argument(
        "--namespace", default=None, metavar="NS", help="Redis key namespace (default: adk)"
    )
    parser.add_argument(
        "--schema",
        default=None,
        metavar="NAME",
        help="PostgreSQL schema holding the tables (default: the connection's search_path)",
    )
    parser.add_argument(
        "--no-durable",
        action="store_true",
        help="accept a Redis that would forget recent writes on a restart (one that evicts "
        "keys is still refused)",
    )
    add_logging_arguments(parser)


def resolve_queue_server(args: argparse.Namespace) -> None:
    """Fill ``args.redis`` / ``args.postgres`` with the one server the queue lives on: the
    option's URL; with no option, the one whose environment variable is set."""
    redis, postgres = option_url(args.redis, "redis"), option_url(args.postgres, "postgres")
    if FROM_ENVIRONMENT in (args.redis, args.postgres):
        args.url_source = URL_ENV["redis" if args.redis == FROM_ENVIRONMENT else "postgres"]
    if redis is None and postgres is None:
        redis, postgres = environment_url("redis"), environment_url("postgres")
        args.url_source = URL_ENV["redis" if redis is not None else "postgres"]
        if redis is not None and postgres is not None:
            raise CommandError(
                f"both {URL_ENV['redis']} and {URL_ENV['postgres']} are set: say which server "
                "holds the queue with --redis or --postgres (bare, the URL is still read from "
                "the environment)"
            )
        if redis is None and postgres is None:
            raise CommandError(
                f"no server given: pass --redis URL or --postgres URL, or set {URL_ENV['redis']} "
                f"or {URL_ENV['postgres']} (which keeps the password out of the process list)"
            )
    args.redis, args.postgres = redis, postgres


def postgres_engine_url(url: str, source: str = "--postgres") -> Any:
    """The asyncpg URL of ``url`` (see ``create_engine``); one it refuses is a
    ``CommandError`` naming ``source``, the option or variable it came from."""
    from statepact.storage.postgres import asyncpg_url

    try:
        return asyncpg_url(url)
    except ValueError as exc:
        why = str(exc).removeprefix("dsn: ")
        raise CommandError(f"{source} {redact_dsn(url)!r}: {why}") from None


def _settings_error(exc: Exception) -> CommandError:
    """A settings model's refusal of an option, as the option's own one line."""
    from pydantic import ValidationError

    options = {"namespace": "--namespace", "queue_name": "--queue", "db_schema": "--schema"}
    if isinstance(exc, ValidationError):
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            if field in options:
                message = str(error["msg"]).removeprefix("Value error, ")
                return CommandError(f"{options[field]}: {message.removeprefix(field + ': ')}")
    return CommandError(redact_dsn(str(exc)).splitlines()[0])


def queue_settings(
    args: argparse.Namespace, *, pool_size: int
) -> RedisStoreSettings | PostgresStoreSettings:
    """The settings of the queue the ``add_queue_arguments`` options name (the server
    resolved first: ``resolve_queue_server``): Redis's when ``--redis`` is given, else
    PostgreSQL's with a pool of ``pool_size`` (its URL checked first); an option they
    refuse is a ``CommandError`` naming it."""
    if args.redis:
        options: dict[str, Any] = {"queue_name": args.queue, "durable": not args.no_durable}
        if args.namespace:
            options["namespace"] = args.namespace
        try:
            return RedisStoreSettings(**options)
        except ValueError as exc:
            raise _settings_error(exc) from None
    postgres_engine_url(args.postgres, getattr(args, "url_source", "--postgres"))
    try:
        return PostgresStoreSettings(
            dsn=args.postgres, queue_name=args.queue, pool_size=pool_size, db_schema=args.schema
        )
    except ValueError as exc:
        raise _settings_error(exc) from None


@asynccontextmanager
async def queue_client(
    args: argparse.Namespace,
    settings: RedisStoreSettings | PostgresStoreSettings,
    *,
    max_connections: int,
) -> AsyncIterator[Any]:
    """The client of the server ``queue_settings`` chose: a Redis client for ``--redis``
    (at most ``max_connections``), else an engine; closed on exit, whatever ended the
    command."""
    if isinstance(settings, RedisStoreSettings):
        client = redis_client(args.redis, max_connections=max_connections)
        try:
            yield client
        finally:
            await finish(client.aclose())
        return
    from statepact.storage.postgres import create_engine

    engine = create_engine(settings)
    try:
        yield engine
    finally:
        await finish(engine.dispose())


def queue_where(args: argparse.Namespace) -> str:
    """Where the queue the arguments name lives, its URL's password masked."""
    resolve_queue_server(args)
    if args.redis:
        return f"Redis at {redact_dsn(args.redis)}, namespace {args.namespace or 'adk'!r}"
    schema = f", schema {args.schema!r}" if args.schema else ""
    return f"PostgreSQL at {redact_dsn(args.postgres)}{schema}"


@asynccontextmanager
async def open_queue(
    args: argparse.Namespace,
    *,
    pool_size: int,
    clock: Clock,
    policy: QueuePolicy | None = None,
) -> AsyncIterator[WorkQueue]:
    """The existing queue the ``add_queue_arguments`` options name, with ``policy`` (else
    the default), through its ``open()`` (Redis preflight, PostgreSQL verify); its client
    is closed on exit, whatever ended the command. Nothing is created: on PostgreSQL the
    tables must be migrated."""
    resolve_queue_server(args)
    settings = queue_settings(args, pool_size=pool_size)
    async with queue_client(args, settings, max_connections=max(pool_size, 10)) as client:
        if isinstance(settings, RedisStoreSettings):
            from statepact.storage.redis import RedisWorkQueue

            yield await RedisWorkQueue.open(client, clock=clock, settings=settings, policy=policy)
        else:
            from statepact.storage.postgres import PostgresWorkQueue

            yield await PostgresWorkQueue.open(
                client, clock=clock, settings=settings, policy=policy
            )


@dataclass
class Backings:
    """The three protocols on one backing, plus where they live (already redacted)."""

    kind: str
    where: str
    state: StateStore
    queue: WorkQueue
    manager: TransactionManager
    clock: Clock
    # A fresh, empty queue on the same backing (bench runs each scenario on its own).
    new_queue: Callable[[str, QueuePolicy], Awaitable[WorkQueue]]
    # The raw client under the backing (redis-py client, SQLAlchemy engine), for bench floors.
    raw: Any = None

    @classmethod
    def of(
        cls,
        backing: Backing[Any, Any, Any],
        *,
        kind: str,
        where: str,
        new_queue: Callable[[str, QueuePolicy], Awaitable[WorkQueue]],
    ) -> Backings:
        """The three of an ``open_backing``, on its manager's clock and its client."""
        return cls(
            kind=kind,
            where=where,
            state=backing.state,
            queue=backing.queue,
            manager=backing.manager,
            clock=backing.manager.clock,
            new_queue=new_queue,
            raw=backing.client,
        )


@asynccontextmanager
async def open_backings(
    kind: str,
    url: str | None,
    *,
    clock: Clock,
    policy: QueuePolicy,
    tag: str | None = None,
    notes: TextIO | None = None,
    connections: int = 0,
) -> AsyncIterator[Backings]:
    """State store, work queue and transaction manager on ``kind``, removed again on exit.

    On a server everything lives under a namespace (Redis) or schema
    (PostgreSQL) named after ``tag`` (a fresh one by default), and the exit
    deletes it, whatever happened inside. The client keeps at least
    ``connections`` connections (the bench's callers that each hold one).
    """
    tag = tag or f"statepact_cli_{uuid.uuid4().hex[:10]}"
    notes = notes or sys.stderr
    if kind == "memory":
        from statepact.settings import MemoryStoreSettings
        from statepact.storage.memory import MemoryWorkQueue, open_backing

        settings = MemoryStoreSettings()

        async def new_queue(name: str, queue_policy: QueuePolicy) -> WorkQueue:
            named = settings.replace(queue_name=name)
            return await MemoryWorkQueue.open(clock=clock, settings=named, policy=queue_policy)

        async with await open_backing(settings, clock=clock, policy=policy) as backing:
            where = "in-process memory"
            yield Backings.of(backing, kind="memory", where=where, new_queue=new_queue)
        return
    if url is None:
        raise CommandError(f"--{kind} URL is needed for the {kind} backing")
    if kind == "redis":
        async with _redis_backings(
            url, clock=clock, policy=policy, tag=tag, notes=notes, connections=connections
        ) as b:
            yield b
        return
    if kind == "postgres":
        async with _postgres_backings(
            url, clock=clock, policy=policy, tag=tag, notes=notes, connections=connections
        ) as b:
            yield b
        return
    raise CommandError(f"unknown backing {kind!r}; use memory, redis or postgres")


async def _server_durability(client: Any, notes: TextIO) -> bool:
    """Whether the Redis passes the durable preflight; refuses (PreflightError) one that evicts.

    The CLI's own data is deleted when the command ends, so a server that would
    forget writes on a restart is fine for it; it says so, since production
    state is not.
    """
    from statepact.storage.redis.preflight import read_server_configs, refusals

    configs = await read_server_configs(client)
    evicting = [r for c in configs for r in refusals(c, durable=False)]
    if evicting:
        raise PreflightError(evicting, server="Redis")
    if any(refusals(c, durable=True) for c in configs):
        print(
            "note: this Redis would forget recent writes on a restart (no append-only file "
            "synced by Redis); fine here (everything this command writes is deleted when it "
            "ends), refused for real state: see `statepact doctor`",
            file=notes,
        )
        return False
    return True


def redis_client(url: str, **options: Any) -> Any:
    """A ``redis.asyncio.Redis`` for ``url`` from ``create_client`` (its timeouts, redis-py's
    retry off); a URL it refuses (unreadable, a database that is not an index) is a
    ``CommandError`` saying why."""
    from pydantic import SecretStr

    from statepact.settings import RedisStoreSettings
    from statepact.storage.redis import create_client

    try:
        return create_client(RedisStoreSettings(dsn=SecretStr(url)), **options)
    except ValueError as exc:
        # create_client's message masks the password; "dsn" is --redis here.
        raise CommandError(f"--redis: {str(exc).removeprefix('dsn: ')}") from None


@asynccontextmanager
async def _redis_backings(
    url: str, *, clock: Clock, policy: QueuePolicy, tag: str, notes: TextIO, connections: int
) -> AsyncIterator[Backings]:
    from redis import exceptions as rex

    from statepact.settings import RedisStoreSettings
    from statepact.storage.redis import RedisWorkQueue, open_backing

    client: Any = redis_client(
        url, socket_connect_timeout=5.0, max_connections=max(200, connections)
    )
    try:
        try:
            await client.ping()
        except rex.RedisError as exc:
            raise CommandError(
                f"cannot reach Redis at {redact_dsn(url)}: {type(exc).__name__}: {exc}; check "
                "the URL and that the server is running"
            ) from exc
        durable = await _server_durability(client, notes)
        settings = RedisStoreSettings(namespace=tag, tx_prefix=tag, durable=durable)

        async def new_queue(name: str, queue_policy: QueuePolicy) -> WorkQueue:
            named = settings.replace(queue_name=name)
            return await RedisWorkQueue.open(
                client, clock=clock, settings=named, policy=queue_policy
            )

        backing = await open_backing(settings, clock=clock, policy=policy, client=client)
        try:
            where = f"Redis at {redact_dsn(url)}, namespace {tag!r}"
            yield Backings.of(backing, kind="redis", where=where, new_queue=new_queue)
        finally:
            # The scratch namespace goes whatever ended the command, a cancellation included.
            await finish(_clear_redis(backing.backend, client, tag))
            await backing.close()
    finally:
        await finish(client.aclose())


async def _clear_redis(backend: Any, client: Any, tag: str) -> None:
    await backend.clear()
    await _delete_redis_namespace(client, tag)


#: The statement timeout the CLI's own connections carry (verify() refuses none).
CLI_STATEMENT_TIMEOUT_MS = 30_000


@asynccontextmanager
async def _postgres_backings(
    url: str, *, clock: Clock, policy: QueuePolicy, tag: str, notes: TextIO, connections: int
) -> AsyncIterator[Backings]:
    """Everything in a PostgreSQL schema of its own, built by the packaged migrations.

    The schema is first on the connections' ``search_path``, so the tables, the
    commit functions and Alembic's version table all land there, and dropping it
    (``CASCADE``) removes every trace of the run.
    """
    from sqlalchemy import exc as sa_exc
    from sqlalchemy import pool, text
    from sqlalchemy.ext.asyncio import create_async_engine

    from statepact.settings import PostgresStoreSettings
    from statepact.storage.postgres import (
        PostgresWorkQueue,
        create_engine,
        migrate,
        open_backing,
    )

    where = redact_dsn(url)
    plain = postgres_engine_url(url).render_as_string(hide_password=False)
    admin = create_async_engine(plain, poolclass=pool.NullPool)
    quoted = f'"{tag}"'  # tag is [a-z0-9_] only: safe to quote as an identifier
    try:
        try:
            async with admin.begin() as conn:
                await conn.execute(text(f"CREATE SCHEMA {quoted}"))
        except (sa_exc.SQLAlchemyError, OSError) as exc:
            raise CommandError(
                f"cannot create a scratch schema on PostgreSQL at {where}: "
                f"{type(exc).__name__}: {first_line(exc)}; check the URL, that the server is "
                "running, and that the user may CREATE SCHEMA in that database"
            ) from exc
        settings = PostgresStoreSettings(
            dsn=plain, pool_size=max(50, connections), pool_timeout=30.0
        )
        engine = create_engine(
            settings,
            connect_args={
                "server_settings": {
                    "search_path": tag,
                    "statement_timeout": str(CLI_STATEMENT_TIMEOUT_MS),
                }
            },
        )
        try:
            await migrate.upgrade(engine)

            async def new_queue(name: str, queue_policy: QueuePolicy) -> WorkQueue:
                return await PostgresWorkQueue.open(
                    engine,
                    clock=clock,
                    settings=settings.replace(queue_name=name),
                    policy=queue_policy,
                )

            backing = await open_backing(settings, clock=clock, policy=policy, client=engine)
            try:
                yield Backings.of(
                    backing,
                    kind="postgres",
                    where=f"PostgreSQL at {where}, schema {tag!r}",
                    new_queue=new_queue,
                )
            finally:
                await backing.close()
        finally:
            # The scratch schema goes whatever ended the command, a cancellation included.
            await finish(_drop_postgres_schema(engine, admin, quoted))
    finally:
        await finish(admin.dispose())


async def _drop_postgres_schema(engine: Any, admin: Any, quoted: str) -> None:
    from sqlalchemy import text

    await engine.dispose()
    async with admin.begin() as conn:
        await conn.execute(text(f"DROP SCHEMA IF EXISTS {quoted} CASCADE"))


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (a driver error's own, not SQLAlchemy's wrapper)."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def _delete_redis_namespace(client: Any, tag: str) -> None:
    """Delete this run's keys: every key under the namespace (and transaction prefix)
    ``tag``, as the key codec lays them out (``namespace_patterns``).

    ``tag`` is unique to the run, so the match cannot reach anyone else's keys.
    """
    from statepact.storage.redis import namespace_patterns

    await delete_keys(client, namespace_patterns(tag))


async def delete_keys(client: Any, patterns: Iterable[str]) -> None:
    """Delete every key matching one of the SCAN ``MATCH`` ``patterns``, 500 at a time."""
    batch: list[bytes] = []
    for pattern in patterns:
        async for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                await client.delete(*batch)
                batch.clear()
    if batch:
        await client.delete(*batch)
