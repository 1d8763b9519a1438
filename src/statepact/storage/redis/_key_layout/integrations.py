"""The keys of the integrations on Redis: the ADK session service and the LangGraph
checkpoint store, each per tenant under the tenant's hash tag."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from statepact.storage.redis._key_layout.grammar import ref, seg

__all__ = ["AdkKeys", "LangGraphKeys", "adk_prefix", "langgraph_prefix"]


@lru_cache(maxsize=4096)
def adk_prefix(namespace: str, app: str) -> str:
    """``AdkKeys.prefix``: the hash tag is ``StateKeys``' tag of the tenant ``app``."""
    return f"{namespace}:adk-sessions:{{{seg(app)}}}:"


@dataclass(frozen=True, slots=True)
class AdkKeys:
    """Keys of the Google ADK session service (``statepact.integrations.adk``) on Redis.

    An ADK app is a statepact tenant, and its keys carry the same hash tag as
    ``StateKeys``' keys of that tenant, ``{seg(app)}``: an append commits the
    event, the session, ``app:`` and ``user:`` state and the session's run
    counters (``StateKeys.run_meta``) in one script, in one cluster slot.
    Per app ``A`` (``P = <ns>:adk-sessions:{seg(A)}:``), with
    ``R = ref(user, session)``:

    ==================  ======  ========================================================
    ``P s:R``           hash    version, seq, created, updated (µs), lut (ADK's
                                last_update_time), head (seq of the oldest event
                                kept), lease owner, token, expires (µs)
    ``P st:R``          hash    the session's state: key -> the value's JSON text
    ``P ev:R``          list    the session's events (JSON), oldest first: seq head..version
    ``P et:R``          list    their timestamps, in the same order
    ``P app``           hash    the ``app:`` state (key without its prefix -> JSON text)
    ``P u:<seg(U)>``    hash    user ``U``'s ``user:`` state
    ``P seq``           string  INCR: the app's session sequence
    ``P all``           zset    every session R of the app, scored by seq
    ``P by:<seg(U)>``   zset    the sessions R of user ``U``, scored by seq
    ``P idle``          zset    every session R, scored by its last write (µs, the
                                caller's clock: session retention)
    ``P heads``         zset    sessions with events, scored by their oldest event's
                                timestamp (event retention)
    ``P op:<seg(id)>``  string  an append's replay key, expiring (lua/_common.lua)
    ==================  ======  ========================================================
    """

    namespace: str = "adk"

    def prefix(self, app: str) -> str:
        """Everything before the kind; scripts build the keys of sessions they read from it."""
        return adk_prefix(self.namespace, app)

    def session(self, app: str, user: str, session: str) -> str:
        return f"{self.prefix(app)}s:{ref(user, session)}"

    def state(self, app: str, user: str, session: str) -> str:
        return f"{self.prefix(app)}st:{ref(user, session)}"

    def events(self, app: str, user: str, session: str) -> str:
        return f"{self.prefix(app)}ev:{ref(user, session)}"

    def timestamps(self, app: str, user: str, session: str) -> str:
        return f"{self.prefix(app)}et:{ref(user, session)}"

    def app_state(self, app: str) -> str:
        return f"{self.prefix(app)}app"

    def user_state(self, app: str, user: str) -> str:
        return f"{self.prefix(app)}u:{seg(user)}"

    def seq(self, app: str) -> str:
        return f"{self.prefix(app)}seq"

    def sessions(self, app: str) -> str:
        return f"{self.prefix(app)}all"

    def user_sessions(self, app: str, user: str) -> str:
        return f"{self.prefix(app)}by:{seg(user)}"

    def idle(self, app: str) -> str:
        return f"{self.prefix(app)}idle"

    def heads(self, app: str) -> str:
        return f"{self.prefix(app)}heads"

    def op(self, app: str, op_id: str) -> str:
        return f"{self.prefix(app)}op:{seg(op_id)}"


@lru_cache(maxsize=4096)
def langgraph_prefix(namespace: str, tenant: str) -> str:
    """``LangGraphKeys.prefix``, built once per tenant."""
    return f"{namespace}:lg:{{{seg(tenant)}}}:"


@dataclass(frozen=True, slots=True)
class LangGraphKeys:
    """Keys of the LangGraph checkpoint store (``statepact.integrations.langgraph``).

    Per tenant ``T`` (prefix ``P = <ns>:lg:{seg(T)}:``, one cluster slot), with a
    thread ``TH``, a namespace ``NS`` and a checkpoint id ``CID``; index members
    join ids with NUL, which no id holds, so lexical order is their tuple order:

    ==================================  ======  ============================================
    ``P cp:<seg(TH)>:<seg(NS)>:<seg(CID)>``  hash  the checkpoint (type, data, meta, at,
                                                    refs, parent, run)
    ``P wr:<seg(TH)>:<seg(NS)>:<seg(CID)>``  hash  its pending writes, by ``ref(task, idx)``
    ``P bl:<seg(TH)>:<seg(NS)>``        hash    blobs by ``ref(channel, version)``
    ``P ix:<seg(TH)>:<seg(NS)>``        zset    CID (lexical)
    ``P ixt:<seg(TH)>``                 zset    ``CID\\0NS``
    ``P ixw:<seg(TH)>``                 zset    ``CID\\0NS`` of every writes hash
    ``P ixa``                           zset    ``CID\\0TH\\0NS``
    ``P run:<seg(RUN)>``                set     ``TH\\0NS\\0CID`` of the run's checkpoints
    ``P threads``                       zset    TH, scored by its last write (µs)
    ==================================  ======  ============================================

    ``lua/langgraph/_prelude.lua`` builds the data-dependent ones the same way.
    """

    namespace: str = "adk"

    def prefix(self, tenant: str) -> str:
        return langgraph_prefix(self.namespace, tenant)

    def checkpoint(
        self, tenant: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str
    ) -> str:
        return f"{self.prefix(tenant)}cp:{seg(thread_id)}:{seg(checkpoint_ns)}:{seg(checkpoint_id)}"

    def writes(self, tenant: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
        return f"{self.prefix(tenant)}wr:{seg(thread_id)}:{seg(checkpoint_ns)}:{seg(checkpoint_id)}"

    def blobs(self, tenant: str, thread_id: str, checkpoint_ns: str) -> str:
        return f"{self.prefix(tenant)}bl:{seg(thread_id)}:{seg(checkpoint_ns)}"

    def in_namespace(self, tenant: str, thread_id: str, checkpoint_ns: str) -> str:
        return f"{self.prefix(tenant)}ix:{seg(thread_id)}:{seg(checkpoint_ns)}"

    def in_thread(self, tenant: str, thread_id: str) -> str:
        return f"{self.prefix(tenant)}ixt:{seg(thread_id)}"

    def writes_of_thread(self, tenant: str, thread_id: str) -> str:
        return f"{self.prefix(tenant)}ixw:{seg(thread_id)}"

    def in_tenant(self, tenant: str) -> str:
        return f"{self.prefix(tenant)}ixa"

    def run(self, tenant: str, run_id: str) -> str:
        return f"{self.prefix(tenant)}run:{seg(run_id)}"

    def threads(self, tenant: str) -> str:
        return f"{self.prefix(tenant)}threads"
