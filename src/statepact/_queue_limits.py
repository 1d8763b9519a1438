"""``QueueLimits`` and ``Rate``: a queue's flow control, and the one rule of its rate windows.

Concurrency caps count leased items; rates count the ``weight`` of items claimed.
Every backing applies the same rules (docs/work-queue.md#flow-control), stored with
the queue so that every process claims under the same limits. This module must
never reach a backing or do I/O.

A rate is a sliding window counted in ``RATE_BUCKETS`` buckets of ``per /
RATE_BUCKETS`` each, conservatively: a claim at ``t`` of weight ``w`` is allowed when
``w`` plus the weight claimed in the buckets of ``t`` and the ``RATE_BUCKETS`` before
it is at most ``weight``. Those buckets cover more than ``(t - per, t]``, so the weight
started in *any* window of length ``per`` never exceeds ``weight`` (a token bucket
would let ``2 * weight`` through across a refill); the price is at most one bucket
(a tenth of the rate) of headroom left unused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import timedelta
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from statepact._codec import require_id, require_limit, require_seconds
from statepact._limits import MAX_CAP, MAX_LIMIT_KEYS, MAX_RATE_PERIOD, MAX_RATE_WEIGHT

__all__ = ["RATE_BUCKETS", "QueueLimits", "Rate", "admissible_at", "bucket_of", "window_start"]

#: Buckets per rate period: the window is counted in ``per / RATE_BUCKETS`` slices.
RATE_BUCKETS = 10

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Rate(BaseModel):
    """At most ``weight`` (sum of items' ``weight``) claimed in any window of ``per``."""

    model_config = _FROZEN

    weight: int = Field(ge=1, le=MAX_RATE_WEIGHT)
    per: timedelta

    @field_validator("per", mode="before")
    @classmethod
    def _period(cls, value: object) -> timedelta:
        seconds = require_seconds("per", value, most=MAX_RATE_PERIOD)
        if seconds < 0.01:
            raise ValueError(f"per: must be at least 0.01 s, got {seconds:g} s")
        return timedelta(seconds=seconds)

    @field_serializer("per")
    def _seconds(self, per: timedelta) -> float:
        return per.total_seconds()

    @cached_property
    def bucket_micros(self) -> int:
        """The width of one bucket in microseconds (at least 1 ms); computed once (every
        limited claim asks)."""
        return max(1000, (self.per // timedelta(microseconds=1)) // RATE_BUCKETS)


def bucket_of(rate: Rate, micros: int) -> int:
    """The bucket of an instant (epoch microseconds) under ``rate``."""
    return micros // rate.bucket_micros


def window_start(rate: Rate, micros: int) -> int:
    """The first bucket a claim at ``micros`` counts (``RATE_BUCKETS`` before its own)."""
    return bucket_of(rate, micros) - RATE_BUCKETS


def _caps(field: str, value: object) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{field}: must be a mapping of limit key to int")
    if len(value) > MAX_LIMIT_KEYS:
        raise ValueError(f"{field}: names {len(value)} keys; at most {MAX_LIMIT_KEYS}")
    return {
        require_id(f"{field}[{key!r}]", key): require_limit(cap, MAX_CAP, field=f"{field}[{key!r}]")
        for key, cap in value.items()
    }


class QueueLimits(BaseModel):
    """A queue's flow control; ``None`` / empty means no limit of that kind.

    - ``per_tenant``: at most this many leased items per tenant (``tenant_caps``
      overrides it for the tenants it names).
    - ``per_key``: at most this many leased items per ``limit_key`` (``key_caps``
      overrides it per key); items without a key are not counted.
    - ``per_tenant_key``: at most this many leased items per (tenant, limit key).
    - ``key_rates``: at most ``Rate.weight`` of weight claimed per ``Rate.per`` per
      limit key (``key_rate`` for every key it does not name).
    - ``tenant_rate``: the same per tenant.
    """

    model_config = _FROZEN

    per_tenant: int | None = None
    tenant_caps: dict[str, int] = Field(default_factory=dict)
    per_key: int | None = None
    key_caps: dict[str, int] = Field(default_factory=dict)
    per_tenant_key: int | None = None
    key_rate: Rate | None = None
    key_rates: dict[str, Rate] = Field(default_factory=dict)
    tenant_rate: Rate | None = None

    @field_validator("per_tenant", "per_key", "per_tenant_key", mode="before")
    @classmethod
    def _one_cap(cls, value: object, info: Any) -> int | None:
        return None if value is None else require_limit(value, MAX_CAP, field=info.field_name)

    @field_validator("tenant_caps", "key_caps", mode="before")
    @classmethod
    def _many_caps(cls, value: object, info: Any) -> dict[str, int]:
        return _caps(str(info.field_name), value)

    @field_validator("key_rates", mode="before")
    @classmethod
    def _rates(cls, value: object) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise TypeError("key_rates: must be a mapping of limit key to Rate")
        if len(value) > MAX_LIMIT_KEYS:
            raise ValueError(f"key_rates: names {len(value)} keys; at most {MAX_LIMIT_KEYS}")
        return {require_id(f"key_rates[{key!r}]", key): rate for key, rate in value.items()}

    @cached_property
    def empty(self) -> bool:
        """Whether nothing is limited (claims then cost what they cost without limits);
        computed once (every claim asks, and comparing models is not free)."""
        return self == _NONE

    def tenant_cap(self, tenant: str) -> int | None:
        return self.tenant_caps.get(tenant, self.per_tenant)

    def key_cap(self, key: str | None) -> int | None:
        return None if key is None else self.key_caps.get(key, self.per_key)

    def tenant_key_cap(self, key: str | None) -> int | None:
        return None if key is None else self.per_tenant_key

    def rate_of_key(self, key: str | None) -> Rate | None:
        return None if key is None else self.key_rates.get(key, self.key_rate)

    def to_json(self) -> str:
        """The form stored on the server (PostgreSQL's control row, Redis's limits key)."""
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> QueueLimits:
        return _NONE if not text else cls.model_validate(json.loads(text))


_NONE = QueueLimits()


def admissible_at(
    rate: Rate, buckets: Mapping[int, int], now_micros: int, weight: int
) -> int | None:
    """The earliest instant (epoch µs, ``now_micros`` when at once) a claim of ``weight``
    fits ``rate``, given the weight claimed per bucket; ``None`` when it never can
    (``weight`` above the rate's)."""
    if weight > rate.weight:
        return None
    if sum(buckets.values()) + weight <= rate.weight:
        return now_micros  # fits even counting every bucket given: the common case, cheap
    current = bucket_of(rate, now_micros)
    for ahead in range(RATE_BUCKETS + 2):
        first = current + ahead - RATE_BUCKETS
        used = sum(spent for bucket, spent in buckets.items() if first <= bucket <= current)
        if used + weight <= rate.weight:
            return now_micros if ahead == 0 else (current + ahead) * rate.bucket_micros
    return None  # unreachable: past RATE_BUCKETS + 1 buckets nothing claimed counts
