"""The one Redis key codec of the three Redis backings (state, queue, transactions).

Every key is built here (by the parts in ``_key_layout/``, one module per layout:
the grammar, the state store, the queue, the transaction backing, the integrations,
the worker registry), each variable segment length-prefixed, so no tenant
or id can make two records build the same key; the scripts build only the keys
that depend on what they read, with ``seg``/``ref`` of ``lua/_common.lua``,
which follow the same grammar. Grammar and cluster slots:
docs/backings.md#key-layout.

This module is the one import of those parts, and holds what spans them all. It
must never do I/O, and nothing else may build a key by string formatting.
"""

from __future__ import annotations

from statepact.storage.redis._key_layout.grammar import glob_escape, parse_ref, ref, seg
from statepact.storage.redis._key_layout.integrations import (
    AdkKeys,
    LangGraphKeys,
    adk_prefix,
    langgraph_prefix,
)
from statepact.storage.redis._key_layout.queue import QueueKeys
from statepact.storage.redis._key_layout.state import StateKeys, state_prefix
from statepact.storage.redis._key_layout.tx import TxKeys
from statepact.storage.redis._key_layout.workers import WorkerKeys

__all__ = [
    "AdkKeys",
    "LangGraphKeys",
    "QueueKeys",
    "StateKeys",
    "TxKeys",
    "WorkerKeys",
    "glob_escape",
    "namespace_patterns",
    "parse_ref",
    "ref",
    "seg",
]


def namespace_patterns(namespace: str) -> tuple[str, ...]:
    """SCAN ``MATCH`` patterns covering every key statepact writes under ``namespace`` (as
    ``RedisStoreSettings.namespace``, and as a ``RedisBackend``'s ``tx_prefix``) and no
    other namespace's: the per-tenant prefixes of the state store, the ADK sessions and
    LangGraph up to their tenant tag, the queue's hash tag, the transaction backend's
    whole tag, and the worker registry's key. Read off each layout's builders, so
    the patterns follow the layout."""
    tenant_free = (
        prefix[: prefix.rindex("{")]
        for prefix in (
            state_prefix(namespace, ""),
            adk_prefix(namespace, ""),
            langgraph_prefix(namespace, ""),
        )
    )
    queue = QueueKeys(namespace=namespace).prefix
    return (
        *(f"{glob_escape(prefix)}*" for prefix in tenant_free),
        f"{glob_escape(queue[: queue.index('}') + 1])}:*",
        TxKeys(namespace).match_all,
        glob_escape(WorkerKeys(namespace).registry),
    )
