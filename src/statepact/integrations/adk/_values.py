"""Checking and encoding what ADK hands the session service: ids, scoped state, events.

Pure functions of the values, used by ``service.py`` once per call: each refusal is
a ``ValueError``/``TypeError`` naming the field, raised before anything is sent.
How state is split and stored: docs/agent-frameworks.md#adk-state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.adk.events.event import Event
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from pydantic_core import PydanticSerializationError, to_jsonable_python

from statepact._codec import check_size, decode_json, encode_json_value, require_id, utf8_size
from statepact.integrations.adk._store import StateWrite, UsageDelta
from statepact.integrations.adk.models import SessionLease

__all__ = [
    "MAX_ADK_ID_BYTES",
    "adk_id",
    "adk_session_id",
    "check_scopes",
    "cursor",
    "decoded",
    "mark",
    "marked",
    "require_lease",
    "split",
    "usage_of",
]

#: The longest app name, user id or session id, in UTF-8 bytes (two of them make a run id).
MAX_ADK_ID_BYTES = 256
_MARKER = "statepact:"


def adk_id(field: str, value: object) -> str:
    checked = require_id(field, value)
    if utf8_size(checked) > MAX_ADK_ID_BYTES:
        raise ValueError(f"{field}: is longer than {MAX_ADK_ID_BYTES} bytes")
    return checked


def adk_session_id(value: object) -> str:
    """ADK's reference strips a session id (``InMemorySessionService``); so do we."""
    if isinstance(value, str):
        value = value.strip()
    return adk_id("session_id", value)


def mark(session: Session, version: int) -> None:
    """Record on the session the version it reflects (ADK's slot for a revision marker)."""
    session._storage_update_marker = f"{_MARKER}{version}"


def marked(session: Session) -> int | None:
    marker = session._storage_update_marker
    if isinstance(marker, str) and marker.startswith(_MARKER):
        digits = marker.removeprefix(_MARKER)
        if digits.isascii() and digits.isdigit():
            return int(digits)
    return None


def _encode_value(field: str, value: object) -> str:
    """A state value as JSON text: rich values as pydantic renders them (a datetime as ISO
    text, a model as its fields), then held to statepact's JSON rules."""
    try:
        plain = to_jsonable_python(value)
    except PydanticSerializationError as exc:
        raise TypeError(
            f"{field}: a {type(value).__name__} is not JSON-serializable; store plain data"
        ) from exc
    return encode_json_value(field, plain)


def split(state: Mapping[str, Any], field: str) -> StateWrite:
    """State keys by scope, each value encoded; ``temp:`` keys dropped."""
    if not isinstance(state, Mapping):
        raise TypeError(f"{field}: must be a dict, got {type(state).__name__}")
    scoped = StateWrite()
    for key, value in state.items():
        if not isinstance(key, str):
            raise TypeError(f"{field}: keys must be str, got {type(key).__name__}")
        if key.startswith(State.TEMP_PREFIX):
            continue
        if key.startswith(State.APP_PREFIX):
            name, target = key.removeprefix(State.APP_PREFIX), scoped.app
        elif key.startswith(State.USER_PREFIX):
            name, target = key.removeprefix(State.USER_PREFIX), scoped.user
        else:
            name, target = key, scoped.session
        require_id(f"{field}[{key!r}]", name)
        target[name] = _encode_value(f"{field}[{key!r}]", value)
    return scoped


def check_scopes(scoped: StateWrite, limit: int, where: str, field: str) -> None:
    for scope, values in (("session", scoped.session), ("app", scoped.app), ("user", scoped.user)):
        if values:
            size = sum(utf8_size(k) + utf8_size(v) + 4 for k, v in values.items())
            check_size(f"{field} ({scope} scope)", size, limit, where=where)


def decoded(values: Mapping[str, str], prefix: str = "") -> dict[str, Any]:
    return {prefix + key: decode_json(value) for key, value in values.items()}


def usage_of(event: Event) -> UsageDelta:
    meta = event.usage_metadata
    if meta is None:
        return UsageDelta()
    prompt = (meta.prompt_token_count or 0) + (meta.tool_use_prompt_token_count or 0)
    output = (meta.candidates_token_count or 0) + (meta.thoughts_token_count or 0)
    if min(prompt, output) < 0:
        raise ValueError("usage_metadata: token counts must not be negative")
    return UsageDelta(input_tokens=prompt, output_tokens=output, iterations=1)


def require_lease(lease: object) -> SessionLease:
    if not isinstance(lease, SessionLease):
        raise TypeError(f"lease: must be a SessionLease, got {type(lease).__name__}")
    return lease


def cursor(after: object) -> int:
    if after is None:
        return 0
    if not isinstance(after, str) or not (after.isascii() and after.isdigit()) or len(after) > 19:
        raise ValueError(f"after: {after!r} is not a cursor returned by this service")
    return int(after)
