"""The client-side conflict predictor of ``PostgresBackend``: commits this process
knows the server would refuse, refused without the round trip (``LocalOrder``).

What it can know, and why a transaction handed over before is never refused here:
the class docstring; how the refusal reaches the caller: ``_commits``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from statepact.tx import CommitRequest, Isolation, Refusal, Snapshot

__all__ = ["LocalOrder"]


class LocalOrder:
    """The order, as this process saw it, of its own snapshots and commits: enough to know,
    without asking the server, that some commits are bound to be refused.

    A commit sent after a snapshot's reply arrived committed after that snapshot was taken,
    so the snapshot does not see it. A later commit that writes one of its keys from that
    snapshot, under ``snapshot`` or ``serializable`` isolation, is one the server refuses
    (first committer wins): this refuses it first, with the same ``Refusal``, and
    saves the round trip. That is most attempts on a hot key, where the agents read one
    snapshot together and then only one of their commits can land. Events are numbered
    by one counter: a snapshot when its reply arrived, a commit when it was handed over to
    be sent (no later than it was sent). A transaction handed over before (the same
    request sent again) is never refused here: it may have landed, and then the server
    answers with its version. Only the ``remember`` newest snapshots, keys and
    transactions are kept; a transaction forgotten takes its snapshot with it, and what
    is forgotten is left to the server, as is everything other processes do.
    """

    __slots__ = ("_event", "_handed", "_remember", "_taken", "_written")

    def __init__(self, remember: int = 4096) -> None:
        self._event = 0
        self._remember = remember
        self._taken: OrderedDict[str, int] = OrderedDict()  # snapshot token: its event
        # (resource, key): the event of the newest commit known to have written it, and its
        # version.
        self._written: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
        # Each transaction handed over: the event of its first hand-over, its snapshot token.
        self._handed: OrderedDict[str, tuple[int, str | None]] = OrderedDict()

    def next_event(self) -> int:
        self._event += 1
        return self._event

    def taken(self, snapshot: Snapshot) -> None:
        """``snapshot``'s reply has arrived. A token seen before keeps its first event: a
        snapshot is its token (PostgreSQL's own, ``xmin:xmax:xip``), and none taken after
        a commit that started after the token's first reply can have that token (that
        commit's transaction id is past its ``xmax``)."""
        if snapshot.token is not None and snapshot.token not in self._taken:
            self._keep(self._taken, snapshot.token, self.next_event())

    def hand_over(self, request: CommitRequest) -> int:
        """``request`` is handed over to be sent: its event; 0 if the same transaction was
        handed over before (never refused, and its landing, whenever that was, not noted)."""
        if request.txn_id in self._handed:
            return 0
        event = self.next_event()
        token = None if request.snapshot is None else request.snapshot.token
        self._handed[request.txn_id] = (event, token)
        if len(self._handed) > self._remember:
            _txn, (_event, forgotten) = self._handed.popitem(last=False)
            if forgotten is not None:
                self._taken.pop(forgotten, None)  # no refusal without its transaction
        return event

    def committed(self, event: int, request: CommitRequest, version: int) -> None:
        """The commit handed over at ``event`` landed at ``version``."""
        if not event:
            return
        for write in request.writes:
            slot = (write.resource, write.key)
            known = self._written.get(slot)
            if known is None or known[0] < event:
                self._keep(self._written, slot, (event, version))

    def refusal(self, request: CommitRequest, event: int | None = None) -> Refusal | None:
        """The server's refusal of ``request``, if it is certain; else None. ``event``: the
        request's hand-over (None: not handed over yet)."""
        handed = self._handed.get(request.txn_id)
        if handed is not None and handed[0] != event:
            return None  # handed over by an earlier call: it may have landed
        snapshot = request.snapshot
        if (
            snapshot is None
            or snapshot.token is None
            or request.isolation is Isolation.READ_COMMITTED
            or request.idempotency_key is not None  # it may be a replay instead
            or request.fencing is not None  # a stale token is refused first
        ):
            return None
        taken = self._taken.get(snapshot.token)
        if taken is None:
            return None
        for write in request.writes:
            known = self._written.get((write.resource, write.key))
            if known is not None and known[0] > taken:
                return Refusal(
                    "write", write.resource, write.key, latest=known[1], taken_at=snapshot.sequence
                )
        return None

    def _keep(self, kept: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        kept[key] = value
        kept.move_to_end(key)
        if len(kept) > self._remember:
            kept.popitem(last=False)
