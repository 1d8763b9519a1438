"""The Redis backings: ``RedisStateStore`` and ``RedisWorkQueue`` (redis-py asyncio).

Both take a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` the
caller owns; :func:`create_client` builds one from ``RedisStoreSettings``
(``dsn``, ``pool_size`` as ``max_connections``, the socket timeouts, redis-py's
own retry off so the failover budget is the only one).
``await RedisStateStore.open(redis, clock=, settings=)`` and
``await RedisWorkQueue.open(redis, clock=, settings=, policy=)`` run
:func:`preflight` first, which refuses a server that could evict or forget
data; the plain constructors skip it (tests do that). ``RedisBackend`` (the
``TransactionManager`` backing) is built the same way, or with
``await RedisBackend.connect(url, prefix=...)``. Keys come from one codec
(``_keys``, whose ``StateKeys``/``QueueKeys``/``TxKeys`` this package re-exports
for tools that name a namespace's keys), every multi-key change is one Lua
script (``lua/``), and every redis-py error is translated at this package's
boundary (``_client``). An integration keeping keys of its own
(``statepact.integrations``) uses the same pieces through the names re-exported
here: its keys from the codec (``AdkKeys``, ``LangGraphKeys``, ``seg``, ``ref``,
``parse_ref``), its scripts from the registry (``ADK_SCRIPTS``, ``LANGGRAPH_SCRIPTS``), called
through ``ScriptCalls`` (the registry's runner inside the backing's ``Failover``),
its replies read with ``as_text``.

Importing this package imports redis-py; ``import statepact`` never does.
"""

from statepact.settings import RedisStoreSettings
from statepact.storage.redis._client import Failover, as_text, create_client, gate_of
from statepact.storage.redis._keys import (
    AdkKeys,
    LangGraphKeys,
    QueueKeys,
    StateKeys,
    TxKeys,
    WorkerKeys,
    glob_escape,
    namespace_patterns,
    parse_ref,
    ref,
    seg,
)
from statepact.storage.redis._scripts import (
    ADK_SCRIPTS,
    LANGGRAPH_SCRIPTS,
    ScriptCalls,
    ScriptRunner,
    load_scripts,
)
from statepact.storage.redis.backend import RedisBackend
from statepact.storage.redis.backing import open_backing
from statepact.storage.redis.preflight import preflight
from statepact.storage.redis.queue import RedisWorkQueue
from statepact.storage.redis.state import RedisStateStore

__all__ = [
    "ADK_SCRIPTS",
    "LANGGRAPH_SCRIPTS",
    "AdkKeys",
    "Failover",
    "LangGraphKeys",
    "QueueKeys",
    "RedisBackend",
    "RedisStateStore",
    "RedisStoreSettings",
    "RedisWorkQueue",
    "ScriptCalls",
    "ScriptRunner",
    "StateKeys",
    "TxKeys",
    "WorkerKeys",
    "as_text",
    "create_client",
    "gate_of",
    "glob_escape",
    "load_scripts",
    "namespace_patterns",
    "open_backing",
    "parse_ref",
    "preflight",
    "ref",
    "seg",
]
