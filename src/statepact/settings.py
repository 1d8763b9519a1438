"""Settings for the server-backed stores, as plain pydantic models.

Backings take these (or explicit arguments) and an injected client; nothing
here reads the environment: that happens at the edges (the CLI, a factory in the
user's code). A DSN is a ``SecretStr`` and is never printed or logged in clear;
use :func:`redact_dsn` to show one.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from statepact._limits import DEFAULT_MAX_VALUE_BYTES
from statepact._retry import RetryPolicy

__all__ = [
    "MemoryStoreSettings",
    "PostgresStoreSettings",
    "RedisStoreSettings",
    "StoreSettings",
    "redact_dsn",
]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")

# Fields more than one settings model has, each defined once.
_MaxValueBytes = Annotated[
    int, Field(gt=0, description="Largest serialized blob, payload or value accepted.")
]
_QueueName = Annotated[str, Field(min_length=1, max_length=200)]
_LockTimeout = Annotated[
    float,
    Field(ge=0, description="Seconds a transaction's lock() given no timeout waits (tx.lock)."),
]
_SerializationWindow = Annotated[
    int,
    Field(
        ge=1,
        strict=True,
        description="Writing commits the memory backing's serializable audit looks back "
        "over; PostgreSQL accepts it and validates serializable commits in full instead.",
    ),
]


class _Settings(BaseModel):
    """The configuration every settings model shares, and :meth:`replace`."""

    # hide_input_in_errors: a refused value (a DSN of the wrong type, a password passed
    # as an unknown field) must not be echoed in the ValidationError.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    def replace(self, **changes: Any) -> Self:
        """A copy with each field of ``changes`` that is not ``None`` replaced, validated
        again: a refused value raises ``ValidationError`` (a ``ValueError``) naming the field.
        """
        given = {name: value for name, value in changes.items() if value is not None}
        if not given:
            return self
        return self.model_validate({**dict(self), **given})


class MemoryStoreSettings(_Settings):
    """Settings of the memory backings: ``MemoryStateStore``, ``MemoryWorkQueue`` and
    ``MemoryBackend`` (the transaction backing)."""

    max_value_bytes: _MaxValueBytes = DEFAULT_MAX_VALUE_BYTES
    queue_name: _QueueName = "default"
    lock_timeout: _LockTimeout = 5.0
    serialization_window: _SerializationWindow = 512
    retain_versions: int | None = Field(
        default=None,
        ge=1,
        strict=True,
        description="Versions of each key kept whatever the live snapshots need (history, "
        "tests); None keeps only what they need.",
    )
    gc: bool = Field(
        default=True, description="Drop versions no live snapshot needs; False keeps every one."
    )


class StoreSettings(_Settings):
    """What every server-backed store shares."""

    dsn: SecretStr | None = Field(
        default=None,
        description="Server URL, read by the factories (create_engine, create_client); "
        "optional when a client is injected.",
    )
    max_value_bytes: _MaxValueBytes = DEFAULT_MAX_VALUE_BYTES
    durable: bool = Field(
        default=True,
        description="Refuse a Redis that would forget acknowledged writes on a crash: no "
        "append-only file, or appendfsync no (Redis preflight).",
    )
    queue_name: _QueueName = "default"
    failover_attempts: int = Field(default=6, ge=1, le=100)
    failover_base_delay: float = Field(default=0.05, ge=0)
    failover_max_delay: float = Field(default=2.0, ge=0)
    pool_size: int = Field(
        default=10,
        ge=1,
        description="Connections a factory opens at most: create_engine's pool_size, "
        "create_client's max_connections (per node on a cluster).",
    )

    # The transaction backing (RedisBackend, PostgresBackend).
    lock_timeout: _LockTimeout = 5.0
    lock_ttl_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A lock expires this long after its grant, by the server's clock, so a "
        "crashed holder cannot keep a key.",
    )
    history_retention_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="prune_history() drops each key's versions superseded by one committed "
        "longer ago than this (injected clock); a snapshot that needs a dropped version gets "
        "ConflictError. An hour: far above any transaction's life (the 30 s statement "
        "timeout, the 60 s lock TTL), so no live transaction is refused.",
    )

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            attempts=self.failover_attempts,
            base_delay=self.failover_base_delay,
            max_delay=self.failover_max_delay,
        )

    def replace(self, *, failover: RetryPolicy | None = None, **changes: Any) -> Self:
        """:meth:`_Settings.replace`; ``failover`` stands for the three ``failover_*`` fields."""
        if failover is not None:
            changes.update(
                failover_attempts=failover.attempts,
                failover_base_delay=failover.base_delay,
                failover_max_delay=failover.max_delay,
            )
        return super().replace(**changes)


class RedisStoreSettings(StoreSettings):
    """Settings of ``RedisStateStore``, ``RedisWorkQueue`` and ``RedisBackend``.

    ``namespace`` prefixes every key of the state store and the queue
    (``adk:state:...``, ``{adk:queue}:...``): run more than one namespace to
    shard queues across cluster slots. ``RedisBackend`` (transactions) keeps its
    keys under ``{tx_prefix}:`` and reads ``history_limit``,
    ``idempotency_ttl_seconds``, ``lock_ttl_seconds`` and ``lock_timeout``.

    The client-side fields (``dsn``, ``pool_size``, ``socket_timeout``,
    ``socket_connect_timeout``) are read only by
    ``statepact.storage.redis.create_client(settings)``, which builds the
    ``redis.asyncio.Redis`` (or, with ``cluster=True``, ``RedisCluster``) the
    stores take; a client you build yourself carries its own. The stores read
    the rest: ``namespace``, ``queue_name``, ``max_value_bytes``, ``durable``
    and the failover budget.
    """

    namespace: str = Field(default="adk", min_length=1, max_length=100)
    tx_prefix: str = Field(
        default="statepact",
        min_length=1,
        description="RedisBackend's keys start with {tx_prefix}: (the cluster hash tag: one "
        "slot per prefix).",
    )
    history_limit: int = Field(
        default=512,
        ge=1,
        strict=True,
        description="Versions RedisBackend keeps per key; a snapshot needing a trimmed one "
        "gets ConflictError.",
    )
    idempotency_ttl_seconds: int = Field(
        default=30 * 24 * 3600,
        ge=1,
        strict=True,
        description="How long RedisBackend keeps a commit's idempotency record; a replay "
        "after that is a new commit.",
    )
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

    @field_validator("namespace", "tx_prefix")
    @classmethod
    def _no_braces(cls, value: str, info: ValidationInfo) -> str:
        if any(ch in value for ch in "{}\x00"):
            raise ValueError(f"{info.field_name}: must not contain '{{', '}}' or NUL")
        return value


class PostgresStoreSettings(StoreSettings):
    """Settings of ``PostgresStateStore``, ``PostgresWorkQueue`` and ``PostgresBackend``.

    ``create_engine(settings)`` reads the client-side fields (``dsn``, the pool
    fields, ``statement_timeout``); an engine you build yourself carries its own.
    ``PostgresBackend`` (transactions) reads ``lock_timeout``,
    ``lock_ttl_seconds``, ``serialization_window`` and the failover budget; its
    ``statepact_*`` tables are the ones on the connection's ``search_path``
    (``db_schema`` names the schema of the ``adk_*`` tables).
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
    serialization_window: _SerializationWindow = 512

    @field_validator("db_schema")
    @classmethod
    def _plain_identifier(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError(f"db_schema: {value!r} is not a plain SQL identifier")
        return value


# Where a URL starts in a text: its scheme.
_SCHEME = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://")
# The start of a URL that names no password: its host(s), each with its port, then a path.
_HOST = r"(?:\[[^\]\s/@]*\]|[^\s:/@\[\],]*)(?::\d+)?"
_HOSTS = re.compile(rf"{_HOST}(?:,{_HOST})*/")
_WORD = re.compile(r"\S*")
# A keyword password (libpq "password = 'x y'", a URL's "?password=x"), quoted or not.
_KEYWORD = re.compile(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^&\s]*)")


def _url_end(text: str, start: int) -> int:
    """Where the URL whose scheme ends at ``start`` ends: at the next whitespace, unless
    its authority was cut short there by a password holding whitespace (``u:Hunter
    2xyz@host``: a ``:`` but no ``@`` yet, not ``host:port/...``, and an ``@`` further on
    the same line, before any other URL), which runs on to the end of the word holding
    that ``@``. Masking a few words too many is the safe way to be wrong."""
    token = _WORD.match(text, start)
    assert token is not None
    end = token.end()
    word = text[start:end]
    if "@" in word or ":" not in word or _HOSTS.match(word):
        return end
    line_end = text.find("\n", end)
    bound = len(text) if line_end < 0 else line_end
    after = _SCHEME.search(text, end, bound)
    bound = after.start() if after is not None else bound
    at = text.find("@", end, bound)
    if at < 0:
        return end
    holding = _WORD.match(text, at)
    assert holding is not None
    return min(holding.end(), bound)


def _mask_userinfo(scheme: str, rest: str) -> str:
    first = rest.find("@")
    if first < 0:
        return scheme + rest
    # Passwords hold '@', '/', '?', '#' unescaped often enough: the userinfo runs to the
    # LAST '@' before the query, where the query is what follows the first '@' and a
    # '?' or '#' ("u:p@ss/w@host/db?app=me@laptop" keeps "host/db?app=me@laptop").
    stops = [i for i in (rest.find("?", first), rest.find("#", first)) if i >= 0]
    last = rest.rfind("@", 0, min(stops, default=len(rest)))
    userinfo, host = rest[:last], rest[last + 1 :]
    if ":" not in userinfo:
        return scheme + rest  # a user name alone is not a secret
    return f"{scheme}{userinfo.split(':', 1)[0]}:***@{host}"


def redact_dsn(dsn: str | SecretStr | None) -> str:
    """A DSN (or a text holding one) with every password masked: a URL's userinfo
    password, whatever characters it holds (whitespace too), and ``password=`` keyword
    values."""
    if dsn is None:
        return "<no dsn>"
    text = dsn.get_secret_value() if isinstance(dsn, SecretStr) else dsn
    shown: list[str] = []
    position = 0
    while (scheme := _SCHEME.search(text, position)) is not None:
        end = _url_end(text, scheme.end())
        shown.append(text[position : scheme.start()])
        shown.append(_mask_userinfo(scheme.group(0), text[scheme.end() : end]))
        position = end
    shown.append(text[position:])
    return _KEYWORD.sub(r"\1***", "".join(shown))
