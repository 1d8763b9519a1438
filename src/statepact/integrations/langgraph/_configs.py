"""Reading LangGraph's configs and ids for ``StatepactCheckpointSaver``: each refused with a
``ValueError``/``TypeError`` naming the field, before anything is sent.

This module must never do I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig

from statepact._codec import MAX_ID_BYTES, plain_str, require_id

__all__ = [
    "config_for",
    "configurable_of",
    "ids_of",
    "limit_of",
    "mapping_of",
    "namespace_of",
    "thread_id_of",
    "version_text",
]


def configurable_of(config: object, *, field: str = "config") -> Mapping[str, Any]:
    configurable = config.get("configurable") if isinstance(config, Mapping) else None
    if not isinstance(configurable, Mapping):
        raise TypeError(f"{field}: must be a RunnableConfig with a 'configurable' dict")
    return configurable


def thread_id_of(value: object, *, field: str = "thread_id") -> str:
    """A thread id: a ``str``, or an ``int`` or ``UUID`` taken as its text."""
    if isinstance(value, int | uuid.UUID) and not isinstance(value, bool):
        value = str(value)
    if value is None:
        raise ValueError(f"{field}: the config names no thread_id (configurable['thread_id'])")
    return require_id(field, value)


def namespace_of(value: object, *, field: str = "checkpoint_ns") -> str:
    """A namespace (or a task path): any ``str`` an id may be, or empty (the root)."""
    if isinstance(value, str) and not value:
        return ""
    return require_id(field, value)


def mapping_of(field: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{field}: must be a dict, got {type(value).__name__}")
    return value


def version_text(version: object) -> str:
    """A channel version as the text its blob is stored under: a ``str`` as it is, an
    ``int`` or ``float`` as its digits."""
    if isinstance(version, str):
        if not version or "\x00" in version or len(version.encode("utf-8")) > MAX_ID_BYTES:
            raise ValueError(f"channel version: {version!r} is not a version id")
        return plain_str(version)
    if isinstance(version, int) and not isinstance(version, bool):
        return str(int(version))
    if isinstance(version, float):
        return repr(float(version))
    raise TypeError(f"channel version: must be a str, int or float, got {type(version).__name__}")


def ids_of(field: str, values: object, *, convert: Any = None) -> list[str]:
    if isinstance(values, str) or not isinstance(values, Sequence | set | frozenset):
        raise TypeError(f"{field}: must be a sequence of ids, not a {type(values).__name__}")
    convert = convert or (lambda value, field: require_id(field, value))
    return sorted({convert(value, field=field) for value in values})


def limit_of(limit: object) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit: must be an int or None, got {type(limit).__name__}")
    if limit < 0:
        raise ValueError(f"limit: must not be negative, got {limit}")
    return int(limit)


def config_for(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }
