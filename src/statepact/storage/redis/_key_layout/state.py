"""The keys of ``RedisStateStore``: per tenant, under the tenant's hash tag."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from statepact.models import RunStatus
from statepact.storage.redis._key_layout.grammar import glob_escape, seg, take

__all__ = ["StateKeys", "state_prefix"]


@lru_cache(maxsize=4096)
def state_prefix(namespace: str, tenant: str) -> str:
    """``StateKeys.prefix``, built once per tenant (a call builds it up to six times)."""
    return f"{namespace}:state:{{{seg(tenant)}}}:"


@dataclass(frozen=True, slots=True)
class StateKeys:
    """Keys of ``RedisStateStore``; ``namespace`` comes from ``RedisStoreSettings``.

    Per tenant ``T`` (prefix ``P = <ns>:state:{seg(T)}:``):

    ============================  ======  ==============================================
    ``P run:<seg(run)>``          string  the run's JSON blob
    ``P runh:<seg(run)>``         hash    version, seq, times, status, session, counters
    ``P session:<seg(s)>``        string  the session's JSON blob
    ``P sessionh:<seg(s)>``       hash    version, seq, times
    ``P seq``                     string  the tenant's INCR sequence (runs and sessions)
    ``P runs``                    zset    every run, scored by seq
    ``P runs-status:<seg(st)>``   zset    runs with that status
    ``P runs-session:<seg(s)>``   zset    runs of that session
    ``P runs-ss:<seg(s)>:<seg(st)>``  zset  runs of that session with that status
    ``P sessions``                zset    every session, scored by seq
    ``P op:<seg(call id)>``       string  a write's replay key, expiring (lua/_common.lua)
    ============================  ======  ==============================================
    """

    namespace: str = "adk"

    def prefix(self, tenant: str) -> str:
        """Everything before the kind; scripts append kinds to it for data-dependent keys."""
        return state_prefix(self.namespace, tenant)

    def run(self, tenant: str, run_id: str) -> str:
        return f"{self.prefix(tenant)}run:{seg(run_id)}"

    def run_meta(self, tenant: str, run_id: str) -> str:
        return f"{self.prefix(tenant)}runh:{seg(run_id)}"

    def session(self, tenant: str, session_id: str) -> str:
        return f"{self.prefix(tenant)}session:{seg(session_id)}"

    def session_meta(self, tenant: str, session_id: str) -> str:
        return f"{self.prefix(tenant)}sessionh:{seg(session_id)}"

    def seq(self, tenant: str) -> str:
        return f"{self.prefix(tenant)}seq"

    def runs(self, tenant: str) -> str:
        return f"{self.prefix(tenant)}runs"

    def runs_by_status(self, tenant: str, status: RunStatus) -> str:
        return f"{self.prefix(tenant)}runs-status:{seg(status.value)}"

    def runs_by_session(self, tenant: str, session_id: str) -> str:
        return f"{self.prefix(tenant)}runs-session:{seg(session_id)}"

    def runs_by_session_status(self, tenant: str, session_id: str, status: RunStatus) -> str:
        return f"{self.prefix(tenant)}runs-ss:{seg(session_id)}:{seg(status.value)}"

    def sessions(self, tenant: str) -> str:
        return f"{self.prefix(tenant)}sessions"

    def op(self, tenant: str, op_id: str) -> str:
        return f"{self.prefix(tenant)}op:{seg(op_id)}"

    def runs_pattern(self) -> str:
        """A SCAN ``MATCH`` pattern of every tenant's ``P runs``: the tenants with runs."""
        return f"{glob_escape(f'{self.namespace}:state:{{')}*{glob_escape('}:runs')}"

    def tenant_of_runs(self, key: str | bytes) -> str | None:
        """The tenant whose ``P runs`` is ``key``, or ``None`` when ``key`` is not one."""
        raw = key.encode("utf-8") if isinstance(key, str) else key
        head = f"{self.namespace}:state:{{".encode()
        if not (raw.startswith(head) and raw.endswith(b"}:runs")):
            return None
        try:
            tenant, end = take(raw, len(head))
        except (ValueError, UnicodeDecodeError):
            return None
        return tenant if raw[end:] == b"}:runs" else None
