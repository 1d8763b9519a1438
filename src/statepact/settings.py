"""Settings for the server-backed stores, as plain pydantic models.

Backings take these (or explicit arguments) and an injected client; nothing
here reads the environment: that happens at the edges (the CLI, a factory in the
user's code). A DSN is a ``SecretStr`` and is never printed or logged in clear;
use :func:`redact_dsn` to show one.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from statepact._limits import DEFAULT_MAX_VALUE_BYTES
from statepact._retry import RetryPolicy

__all__ = ["PostgresStoreSettings", "RedisStoreSettings", "StoreSettings", "redact_dsn"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class StoreSettings(BaseModel):
    """What every server-backed store shares."""

    # hide_input_in_errors: a refused value (a DSN of the wrong type, a password passed
    # as an unknown field) must not be echoed in the ValidationError.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    dsn: SecretStr | None = Field(
        default=None,
        description="Server URL, read by the factories (create_engine, create_client); "
        "optional when a client is injected.",
    )
    max_value_bytes: int = Field(
        default=DEFAULT_MAX_VALUE_BYTES,
        gt=0,
        description="Largest serialized blob or payload accepted.",
    )
    durable: bool = Field(
        default=True,
        description="Refuse a Redis that would forget acknowledged writes on a crash: no "
        "append-only file, or appendfsync no (Redis preflight).",
    )
    queue_name: str = Field(default="default", min_length=1, max_length=200)
    failover_attempts: int = Field(default=6, ge=1, le=100)
    failover_base_delay: float = Field(default=0.05, ge=0)
    failover_max_delay: float = Field(default=2.0, ge=0)
    pool_size: int = Field(
        default=10,
        ge=1,
        description="Connections a factory opens at most: create_engine's pool_size, "
        "create_client's max_connections (per node on a cluster).",
    )

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            attempts=self.failover_attempts,
            base_delay=self.failover_base_delay,
            max_delay=self.failover_max_delay,
        )


class RedisStoreSettings(StoreSettings):
    """Settings of ``RedisStateStore`` and ``RedisWorkQueue``.

    ``namespace`` prefixes every key (``adk:state:...``, ``{adk:queue}:...``):
    run more than one namespace to shard queues across cluster slots.

    The client-side fields (``dsn``, ``pool_size``, ``socket_timeout``,
    ``socket_connect_timeout``) are read only by
    ``statepact.storage.redis.create_client(settings)``, which builds the
    ``redis.asyncio.Redis`` (or, with ``cluster=True``, ``RedisCluster``) the
    stores take; a client you build yourself carries its own. The stores read
    the rest: ``namespace``, ``queue_name``, ``max_value_bytes``, ``durable``
    and the failover budget.
    """

    namespace: str = Field(default="adk", min_length=1, max_length=100)
    socket_timeout: float | None = Field(
        default=5.0,
        gt=0,
        description="Seconds create_client's client waits for a reply before the call counts "
        "as a dropped connection (and the failover budget takes over); None waits forever.",
    )
    socket_connect_timeout: float | None = Field(
        default=5.0,
        gt=0,
        description="Seconds create_client's client waits to connect; None waits forever.",
    )

    @field_validator("namespace")
    @classmethod
    def _no_braces(cls, value: str) -> str:
        if any(ch in value for ch in "{}\x00"):
            raise ValueError("namespace: must not contain '{', '}' or NUL")
        return value


class PostgresStoreSettings(StoreSettings):
    """Settings of ``PostgresStateStore`` and ``PostgresWorkQueue``.

    ``create_engine(settings)`` reads the client-side fields (``dsn``, the pool
    fields, ``statement_timeout``); an engine you build yourself carries its own.
    """

    db_schema: str | None = Field(
        default=None, description="PostgreSQL schema holding the tables; None uses search_path."
    )
    statement_timeout: float | None = Field(
        default=30.0,
        ge=0.001,
        description="Seconds; create_engine sets it (SET statement_timeout) on each new "
        "connection whose effective statement_timeout is 0 (none), so open() passes on a "
        "database left at PostgreSQL's default. A value set for the role or the database, or "
        "passed in the connection options (connect_args server_settings), is kept. None sets "
        "nothing.",
    )
    max_overflow: int = Field(default=0, ge=0)
    pool_timeout: float = Field(
        default=0.5, ge=0, description="Wait for a pooled connection before PoolExhaustedError."
    )

    @field_validator("db_schema")
    @classmethod
    def _plain_identifier(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError(f"db_schema: {value!r} is not a plain SQL identifier")
        return value


# A URL anywhere in the text: scheme://, then everything up to the next whitespace.
_URL = re.compile(r"(?<![A-Za-z0-9+.\-])(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<rest>\S*)")
# A keyword password (libpq "password = 'x y'", a URL's "?password=x"), quoted or not.
_KEYWORD = re.compile(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^&\s]*)")


def _mask_userinfo(match: re.Match[str]) -> str:
    scheme, rest = match.group("scheme"), match.group("rest")
    first = rest.find("@")
    if first < 0:
        return match.group(0)
    # Passwords hold '@', '/', '?', '#' unescaped often enough: the userinfo runs to the
    # LAST '@' before the query, where the query is what follows the first '@' and a
    # '?' or '#' ("u:p@ss/w@host/db?app=me@laptop" keeps "host/db?app=me@laptop").
    stops = [i for i in (rest.find("?", first), rest.find("#", first)) if i >= 0]
    last = rest.rfind("@", 0, min(stops, default=len(rest)))
    userinfo, host = rest[:last], rest[last + 1 :]
    if ":" not in userinfo:
        return match.group(0)  # a user name alone is not a secret
    return f"{scheme}{userinfo.split(':', 1)[0]}:***@{host}"


def redact_dsn(dsn: str | SecretStr | None) -> str:
    """A DSN (or a text holding one) with every password masked: a URL's userinfo
    password, whatever characters it holds, and ``password=`` keyword values."""
    if dsn is None:
        return "<no dsn>"
    text = dsn.get_secret_value() if isinstance(dsn, SecretStr) else dsn
    text = _URL.sub(_mask_userinfo, text)
    return _KEYWORD.sub(r"\1***", text)
