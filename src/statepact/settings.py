"""Settings for the server-backed stores, as plain pydantic models.

Backings take these (or explicit arguments) and an injected client; nothing
here reads the environment: that happens at the edges (the CLI, a factory in the
user's code). A DSN is a ``SecretStr`` and is never printed or logged in clear;
use :func:`redact_dsn` to show one.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from statepact._retry import RetryPolicy

__all__ = ["PostgresStoreSettings", "RedisStoreSettings", "StoreSettings", "redact_dsn"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class StoreSettings(BaseModel):
    """What every server-backed store shares."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dsn: SecretStr | None = Field(
        default=None, description="Server URL; optional when a client is injected."
    )
    max_value_bytes: int = Field(
        default=262_144, gt=0, description="Largest serialized blob or payload accepted."
    )
    durable: bool = Field(
        default=True, description="Refuse a server that keeps nothing on disk (Redis preflight)."
    )
    queue_name: str = Field(default="default", min_length=1, max_length=200)
    failover_attempts: int = Field(default=6, ge=1, le=100)
    failover_base_delay: float = Field(default=0.05, ge=0)
    failover_max_delay: float = Field(default=2.0, ge=0)
    pool_size: int = Field(default=10, ge=1, description="Connections a factory opens at most.")

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
    """

    namespace: str = Field(default="adk", min_length=1, max_length=100)

    @field_validator("namespace")
    @classmethod
    def _no_braces(cls, value: str) -> str:
        if any(ch in value for ch in "{}\x00"):
            raise ValueError("namespace: must not contain '{', '}' or NUL")
        return value


class PostgresStoreSettings(StoreSettings):
    """Settings of ``PostgresStateStore`` and ``PostgresWorkQueue``."""

    db_schema: str | None = Field(
        default=None, description="PostgreSQL schema holding the tables; None uses search_path."
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


_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^@/]*@)")


def redact_dsn(dsn: str | SecretStr | None) -> str:
    """A DSN with its password (and any ``password=`` query value) masked."""
    if dsn is None:
        return "<no dsn>"
    text = dsn.get_secret_value() if isinstance(dsn, SecretStr) else dsn

    def _mask_userinfo(match: re.Match[str]) -> str:
        userinfo = match.group("userinfo")[:-1]
        user = userinfo.split(":", 1)[0] if ":" in userinfo else userinfo
        masked = f"{user}:***@" if ":" in userinfo else f"{user}@"
        return match.group("scheme") + masked

    text = _USERINFO.sub(_mask_userinfo, text)
    return re.sub(r"(?i)(password=)[^&\s]*", r"\1***", text)
