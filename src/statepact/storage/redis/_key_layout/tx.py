"""The keys of ``RedisBackend``, the transaction backing: all under one hash tag."""

from __future__ import annotations

from dataclasses import dataclass

from statepact.storage.redis._key_layout.grammar import glob_escape, seg

__all__ = ["TxKeys"]


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
