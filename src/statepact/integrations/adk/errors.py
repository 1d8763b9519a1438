"""The errors the ADK session service adds to statepact's tree (docs/agent-frameworks.md).

``SessionConflictError`` is both statepact's ``StateConflictError`` and ADK's
``StaleSessionError``, so either ``except`` catches a stale append.
"""

from __future__ import annotations

from google.adk.errors import StaleSessionError

from statepact.errors import StateConflictError, StatepactError

__all__ = ["SessionConflictError", "SessionLeasedError"]


class SessionConflictError(StateConflictError, StaleSessionError):
    """An append held a version of the session that another append has moved past.

    Nothing was written. ``expected`` is the version the caller's ``Session``
    was read at, ``actual`` the stored one; reload the session with
    ``get_session`` and apply the event again.
    """

    def __init__(self, *, app_name: str, user_id: str, session_id: str, expected: int, actual: int):
        super().__init__(
            tenant=app_name, record_id=session_id, expected=expected, actual=actual, kind="session"
        )
        self.user_id = user_id
        self.args = (
            f"session {session_id!r} of user {user_id!r} in app {app_name!r} was modified in "
            f"storage since it was loaded (held version {expected}, stored {actual}): nothing "
            "was written; reload it with get_session and apply the event again",
        )


class SessionLeasedError(StatepactError):
    """Another owner holds the session's live lease; the append wrote nothing.

    Retry once the lease has ended (``expires_at``), or append through the
    holder (``StatepactSessionService.with_lease``).
    """

    retryable = True

    def __init__(self, *, app_name: str, user_id: str, session_id: str, owner: str) -> None:
        self.app_name = app_name
        self.user_id = user_id
        self.session_id = session_id
        self.owner = owner
        super().__init__(
            f"session {session_id!r} of user {user_id!r} in app {app_name!r} is leased by "
            f"{owner!r}: only the holder's appends are taken until the lease ends"
        )
