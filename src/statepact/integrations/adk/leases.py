"""``SessionLeases``: one writer at a time per ADK session, fenced by a token.

A lease lives on the session's own record, so an append checks it in the same
atomic step that checks the session's version: while a lease is live, only
appends made through ``StatepactSessionService.with_lease(lease)`` are taken, and
once it expired or another was issued, those too are refused
(``LeaseLostError``). Expiry is by the service's clock. docs/agent-frameworks.md#adk-leases.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from google.adk.errors.session_not_found_error import SessionNotFoundError

from statepact._cancel import finish
from statepact._codec import require_id, require_seconds
from statepact.clock import Clock, read_clock
from statepact.errors import LeaseLostError
from statepact.integrations.adk._store import LeaseHeld, LeaseRequest, SessionKey, SessionStore
from statepact.integrations.adk._values import adk_id, adk_session_id, require_lease
from statepact.integrations.adk.models import SessionLease

__all__ = ["SessionLeases"]


class SessionLeases:
    """The leases of one service's sessions (``StatepactSessionService.leases``)."""

    def __init__(self, store: SessionStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def acquire(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        owner: str,
        ttl: float | timedelta,
    ) -> SessionLease | None:
        """The session's lease for ``owner`` for ``ttl``, with a token above every token the
        session issued; ``None`` when another owner holds a live one (the same owner
        acquiring again gets a new token). ``SessionNotFoundError`` for no session."""
        key = SessionKey(
            adk_id("app_name", app_name), adk_id("user_id", user_id), adk_session_id(session_id)
        )
        checked_owner = require_id("owner", owner)
        seconds = require_seconds("ttl", ttl)
        now = read_clock(self._clock)
        expires = now + timedelta(seconds=seconds)
        request = LeaseRequest(key=key, owner=checked_owner, token=0, now=now, expires_at=expires)
        granted = await self._store.acquire_lease(request)
        if granted is None:
            raise SessionNotFoundError(f"Session {key.session} not found.")
        if isinstance(granted, LeaseHeld):
            return None
        return SessionLease(
            app_name=key.app,
            user_id=key.user,
            session_id=key.session,
            owner=checked_owner,
            token=granted,
            expires_at=expires,
            ttl=seconds,
        )

    async def renew(
        self, lease: SessionLease, ttl: float | timedelta | None = None
    ) -> SessionLease:
        """Extend a live lease (same token) by ``ttl`` (default: its own) from now; raises
        ``LeaseLostError`` if it expired or another lease was issued since."""
        checked = require_lease(lease)
        seconds = checked.ttl if ttl is None else require_seconds("ttl", ttl)
        now = read_clock(self._clock)
        expires = now + timedelta(seconds=seconds)
        if not await self._store.renew_lease(_request(checked, now, expires)):
            raise LeaseLostError(
                f"lease on session {checked.session_id!r} with token {checked.token} held by "
                f"{checked.owner!r} expired or was taken over; acquire a new one"
            )
        return checked.model_copy(update={"expires_at": expires, "ttl": seconds})

    async def release(self, lease: SessionLease) -> bool:
        """Give the lease up; ``True`` if it was still the session's. Finished even if the
        caller is cancelled meanwhile. The token is kept: the next one is higher."""
        checked = require_lease(lease)
        now = read_clock(self._clock)
        return await finish(self._store.release_lease(_request(checked, now, now)))


def _request(lease: SessionLease, now: datetime, expires: datetime) -> LeaseRequest:
    key = SessionKey(lease.app_name, lease.user_id, lease.session_id)
    return LeaseRequest(key=key, owner=lease.owner, token=lease.token, now=now, expires_at=expires)
