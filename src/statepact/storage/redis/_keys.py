"""The one Redis key codec of the three Redis backings (state, queue, transactions).

Every key is built here, each variable segment length-prefixed, so no tenant
or id can make two records build the same key; the scripts build only the keys
that depend on what they read, with ``seg``/``ref`` of ``lua/_common.lua``,
which follow the same grammar. Grammar and cluster slots:
docs/backings.md#key-layout.

This module must never do I/O, and nothing else may build a key by string
formatting.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from statepact.models import RunStatus

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


def seg(value: str) -> str:
    """One length-prefixed segment: ``acme`` becomes ``4:acme`` (length in UTF-8 bytes)."""
    return f"{len(value.encode('utf-8'))}:{value}"


def ref(tenant: str, item_id: str) -> str:
    """An item's queue-wide reference, ``seg(tenant):seg(item_id)``; members of queue-wide sets."""
    return f"{seg(tenant)}:{seg(item_id)}"


def _take(text: bytes, start: int) -> tuple[str, int]:
    """Read one segment of ``text`` at ``start``; return it and where the next one begins."""
    colon = text.index(b":", start)
    digits = text[start:colon]
    if not digits.isdigit():
        raise ValueError(f"no segment length at {start}")
    length = int(digits)
    end = colon + 1 + length
    if end > len(text):
        raise ValueError(f"segment at {start} runs past the end")
    return text[colon + 1 : end].decode("utf-8"), end


def parse_ref(value: str | bytes) -> tuple[str, str]:
    """The inverse of :func:`ref`: ``(tenant, item_id)``."""
    raw = value.encode("utf-8") if isinstance(value, str) else value
    tenant, end = _take(raw, 0)
    if raw[end : end + 1] != b":":
        raise ValueError(f"{value!r} is not an item reference")
    item_id, end = _take(raw, end + 1)
    if end != len(raw):
        raise ValueError(f"{value!r} is not an item reference")
    return tenant, item_id


@lru_cache(maxsize=4096)
def _state_prefix(namespace: str, tenant: str) -> str:
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
        return _state_prefix(self.namespace, tenant)

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
            tenant, end = _take(raw, len(head))
        except (ValueError, UnicodeDecodeError):
            return None
        return tenant if raw[end:] == b"}:runs" else None


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Keys of one ``RedisWorkQueue``: all under the tag ``{<ns>:queue}``, one cluster slot.

    With ``Q = {<ns>:queue}:seg(queue):`` and ``R = seg(tenant):seg(item_id)``:

    ==========================  ======  ====================================================
    ``Q item:R``                hash    the item's record (tenant, id, payload, status, ...)
    ``Q ready:<seg(T)>``        zset    T's due queued items; member item_id, score
                                        ``(1000 - priority) * 2**42 + enqueue order``
    ``Q delayed``               zset    queued items not yet due; member R, score available_at µs
    ``Q rotation``              zset    tenants with ready work; member T, score T's last turn
    ``Q turns``                 hash    T -> the turn T was last served at (kept when idle)
    ``Q turn``                  string  INCR: the rotation's turn counter
    ``Q order``                 string  INCR: enqueue order
    ``Q token``                 string  the last lease token (fencing; lua/_common.lua)
    ``Q leases``                zset    leased items; member R, score expires_at µs
    ``Q lease-tokens``          hash    R -> the token of its live lease
    ``Q pending``               zset    claimed items whose record is not written yet (left
                                        by the two-script claim of earlier versions)
    ``Q dead:<seg(T)>``         zset    T's dead items; member item_id, score death µs
    ``Q count:<status>``        hash    T -> how many items of T are queued/leased/dead/
                                        cancelled (``stats``: never a scan)
    ``Q finished:<status>``     zset    done / cancelled / dead items; member R, score the
                                        time they finished, µs (what ``prune`` reads)
    ``Q unique``                hash    ``ref(T, slot)`` -> the item_id holding that unique
                                        slot while it blocks (queued, leased; done too for
                                        a slot with a period)
    ``Q dead-ids``              zset    every dead item as ``T NUL item_id``, all scored 0:
                                        ``dead_letters_all`` pages it by (tenant, id)
    ``Q paused``                string  present while the queue is paused (claims read it)
    ``Q limits``                string  the queue's ``QueueLimits`` as JSON (claims read it)
    ``Q count:leased-key``      hash    limit key -> leased items holding it
    ``Q count:leased-pair``     hash    ``ref(T, limit key)`` -> leased items of T holding it
    ``Q spent:<k|t>:<seg(n)>``  hash    rate bucket -> weight claimed in it, per limit key
                                        (k) or tenant (t); expires after two periods
    ``Q rate-wake``             string  µs when the earliest item a rate held back fits
    ``Q prune-lock``            string  the pruning process's token (SET NX PX), expiring
    ``Q op:<seg(call id)>``     string  a write's replay key, expiring (lua/_common.lua);
                                        for a claim a list of what it claimed
    ``Q wake``                  list    wake-up tokens: one per item made ready, at most 64
                                        (``RedisWorkQueue.watch`` pops them)
    ==========================  ======  ====================================================

    ``Q ctl`` is not a key but a pub/sub channel: a cancel of a leased item
    publishes ``<token>:R`` on it (``RedisWorkQueue.watch(on_cancel=...)``).
    """

    namespace: str = "adk"
    queue: str = "default"

    @property
    def prefix(self) -> str:
        return f"{{{self.namespace}:queue}}:{seg(self.queue)}:"

    @property
    def wake(self) -> str:
        return f"{self.prefix}wake"

    def item(self, tenant: str, item_id: str) -> str:
        return f"{self.prefix}item:{ref(tenant, item_id)}"

    def ready(self, tenant: str) -> str:
        return f"{self.prefix}ready:{seg(tenant)}"

    def dead(self, tenant: str) -> str:
        return f"{self.prefix}dead:{seg(tenant)}"

    def count(self, status: str) -> str:
        return f"{self.prefix}count:{status}"

    def op(self, op_id: str) -> str:
        return f"{self.prefix}op:{seg(op_id)}"

    def finished(self, status: str) -> str:
        return f"{self.prefix}finished:{status}"

    @property
    def unique(self) -> str:
        return f"{self.prefix}unique"

    @property
    def dead_ids(self) -> str:
        return f"{self.prefix}dead-ids"

    @property
    def paused(self) -> str:
        return f"{self.prefix}paused"

    @property
    def limits(self) -> str:
        return f"{self.prefix}limits"

    @property
    def rate_wake(self) -> str:
        return f"{self.prefix}rate-wake"

    @property
    def prune_lock(self) -> str:
        return f"{self.prefix}prune-lock"

    @property
    def control(self) -> str:
        """The pub/sub channel of control notices (a leased item cancelled)."""
        return f"{self.prefix}ctl"

    def match_queues(self) -> str:
        """A SCAN ``MATCH`` pattern for the ``order`` key of every queue of the namespace
        (each queue that ever held an item has one); :meth:`queue_of` reads its name."""
        return f"{glob_escape(f'{{{self.namespace}:queue}}:')}*:order"

    def queue_of(self, order_key: str | bytes) -> str | None:
        """The queue whose ``order`` key this is, or ``None`` for another key."""
        raw = order_key.encode("utf-8") if isinstance(order_key, str) else order_key
        head = f"{{{self.namespace}:queue}}:".encode()
        if not raw.startswith(head) or not raw.endswith(b":order"):
            return None
        try:
            name, end = _take(raw, len(head))
        except ValueError:
            return None
        return name if raw[end:] == b":order" else None

    def fixed(self) -> tuple[str, ...]:
        """The KEYS every queue script gets, in the order ``lua/queue/_prelude.lua`` names them."""
        return (
            self.delayed,
            self.rotation,
            self.turns,
            self.turn,
            self.order,
            self.token,
            self.leases,
            self.lease_tokens,
            self.pending,
            self.count("queued"),
            self.count("leased"),
            self.count("dead"),
            self.count("cancelled"),
            self.finished("done"),
            self.finished("cancelled"),
            self.finished("dead"),
            self.unique,
            self.paused,
            self.dead_ids,
        )

    @property
    def delayed(self) -> str:
        return f"{self.prefix}delayed"

    @property
    def rotation(self) -> str:
        return f"{self.prefix}rotation"

    @property
    def turns(self) -> str:
        return f"{self.prefix}turns"

    @property
    def turn(self) -> str:
        return f"{self.prefix}turn"

    @property
    def order(self) -> str:
        return f"{self.prefix}order"

    @property
    def token(self) -> str:
        return f"{self.prefix}token"

    @property
    def leases(self) -> str:
        return f"{self.prefix}leases"

    @property
    def lease_tokens(self) -> str:
        return f"{self.prefix}lease-tokens"

    @property
    def pending(self) -> str:
        return f"{self.prefix}pending"


def glob_escape(value: str) -> str:
    """``value`` as a literal in a SCAN ``MATCH`` pattern.

    Redis glob treats ``* ? [ ] \\`` as special; braces are not, but a backslash
    before any character matches it literally, so they are escaped too (a hash
    tag's braces then never depend on the glob dialect).
    """
    return "".join("\\" + ch if ch in "*?[]\\{}" else ch for ch in value)


@dataclass(frozen=True, slots=True)
class TxKeys:
    """Keys of one ``RedisBackend`` (the transaction backing): all under the tag ``{<prefix>}``.

    The prefix is the cluster hash tag, so every key of one backend is in one
    slot and each ``lua/tx/`` script is atomic on a cluster too. With
    ``P = {<prefix>}``, ``R = seg(resource)``, ``K = seg(key)``:

    ======================  ======  =====================================================
    ``P:seq``               string  the global commit sequence (INCR per writing commit)
    ``P:res``               set     resource names ever registered or written
    ``P:meta:R``            hash    ``version``, ``at`` (µs), ``metadata`` (JSON text)
    ``P:data:R``            hash    key -> its latest entry (see ``lua/tx/_prelude.lua``)
    ``P:hist:R:K``          list    the key's entries, newest first, capped
    ``P:trim:R``            hash    key -> the newest version trimmed from its history
    ``P:idem:<seg(idem)>``  string  ``fingerprint:version:µs:txn_id`` (TTL)
    ``P:fence:R``           string  the highest fencing token ever issued
    ``P:lease:R``           hash    ``owner``, ``token``, ``expires`` (µs), ``ttl``
    ``P:lock:R:K``          set     ``txn_id|shared`` / ``txn_id|exclusive`` (TTL)
    ``P:op:<seg(txn_id)>``  string  a commit's outcome record, its version (expires)
    ======================  ======  =====================================================
    """

    prefix: str = "statepact"

    def __post_init__(self) -> None:
        if not self.prefix or any(ch in self.prefix for ch in "{}\x00"):
            raise ValueError("prefix: must be non-empty and must not contain '{', '}' or NUL")

    @property
    def tag(self) -> str:
        return f"{{{self.prefix}}}"

    @property
    def seq(self) -> str:
        return f"{self.tag}:seq"

    @property
    def resources(self) -> str:
        return f"{self.tag}:res"

    def meta(self, resource: str) -> str:
        return f"{self.tag}:meta:{seg(resource)}"

    def data(self, resource: str) -> str:
        return f"{self.tag}:data:{seg(resource)}"

    def history(self, resource: str, key: str) -> str:
        return f"{self.tag}:hist:{seg(resource)}:{seg(key)}"

    def trimmed(self, resource: str) -> str:
        return f"{self.tag}:trim:{seg(resource)}"

    def idempotency(self, idempotency_key: str) -> str:
        return f"{self.tag}:idem:{seg(idempotency_key)}"

    def fence(self, resource: str) -> str:
        return f"{self.tag}:fence:{seg(resource)}"

    def lease(self, resource: str) -> str:
        return f"{self.tag}:lease:{seg(resource)}"

    def lock(self, resource: str, key: str) -> str:
        return f"{self.tag}:lock:{seg(resource)}:{seg(key)}"

    def op(self, txn_id: str) -> str:
        """A commit's outcome record, found by a resend of the same transaction."""
        return f"{self.tag}:op:{seg(txn_id)}"

    @property
    def match_all(self) -> str:
        """A SCAN ``MATCH`` pattern for every key of this backend and no other."""
        return f"{glob_escape(self.tag)}:*"


@lru_cache(maxsize=4096)
def _adk_prefix(namespace: str, app: str) -> str:
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
        return _adk_prefix(self.namespace, app)

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
def _langgraph_prefix(namespace: str, tenant: str) -> str:
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
        return _langgraph_prefix(self.namespace, tenant)

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


@dataclass(frozen=True, slots=True)
class WorkerKeys:
    """The worker registry's one key (``statepact.dashboard.workers``).

    ``<ns>:workers``: a hash, worker id -> the worker's JSON record (with its
    ``last_seen`` and ``ttl_seconds``); the key itself expires when no worker
    has beaten for longer than the longest time to live.
    """

    namespace: str

    @property
    def registry(self) -> str:
        return f"{self.namespace}:workers"


def namespace_patterns(namespace: str) -> tuple[str, ...]:
    """SCAN ``MATCH`` patterns covering every key statepact writes under ``namespace`` (as
    ``RedisStoreSettings.namespace``, and as a ``RedisBackend``'s ``tx_prefix``) and no
    other namespace's: the per-tenant prefixes of the state store, the ADK sessions and
    LangGraph up to their tenant tag, the queue's hash tag, the transaction backend's
    whole tag, and the worker registry's key. Read off the builders above, so the
    patterns follow the layout."""
    tenant_free = (
        prefix[: prefix.rindex("{")]
        for prefix in (
            _state_prefix(namespace, ""),
            _adk_prefix(namespace, ""),
            _langgraph_prefix(namespace, ""),
        )
    )
    queue = QueueKeys(namespace=namespace).prefix
    return (
        *(f"{glob_escape(prefix)}*" for prefix in tenant_free),
        f"{glob_escape(queue[: queue.index('}') + 1])}:*",
        TxKeys(namespace).match_all,
        glob_escape(WorkerKeys(namespace).registry),
    )
