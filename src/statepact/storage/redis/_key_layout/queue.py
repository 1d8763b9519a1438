"""The keys of ``RedisWorkQueue``: one queue's keys under one hash tag."""

from __future__ import annotations

from dataclasses import dataclass

from statepact.storage.redis._key_layout.grammar import glob_escape, ref, seg, take

__all__ = ["QueueKeys"]


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
            name, end = take(raw, len(head))
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
