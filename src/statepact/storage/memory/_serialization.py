"""The serialization-graph audit of ``MemoryBackend``'s ``serializable`` commits.

The footprints (what each commit read, at which version, and wrote) of the
last ``serialization_window`` writing commits, and a search for a cycle of
ww/wr/rw dependencies through a new commit: a second, independent check behind
full backward validation (docs/backings.md#memory). It only answers; the
backend decides what a cycle means, and nothing here reads a clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from statepact.storage.memory._locks import Slot
from statepact.tx import ReadRecord

__all__ = ["Footprint", "SerializationGraph", "depends", "find_serialization_cycle"]


@dataclass(frozen=True, slots=True)
class Footprint:
    """What one committed transaction read (with versions observed) and wrote, at ``seq``."""

    txn_id: str
    seq: int
    reads: dict[Slot, int]
    writes: frozenset[Slot]

    @classmethod
    def of(
        cls, txn_id: str, seq: int, reads: Iterable[ReadRecord], writes: Iterable[Slot]
    ) -> Footprint:
        """The footprint of a commit (made, or to make, at ``seq``) from its read records and
        the keys it writes."""
        return cls(
            txn_id=txn_id,
            seq=seq,
            reads={(r.resource, r.key): r.version for r in reads},
            writes=frozenset(writes),
        )


def depends(before: Footprint, after: Footprint) -> bool:
    """Whether the serialization graph has an edge ``before -> after`` (ww, wr or rw).

    This is the definition; :class:`SerializationGraph` finds the same edges
    through its indexes.
    """
    if before.writes:
        if before.seq < after.seq and not before.writes.isdisjoint(after.writes):
            return True  # ww: after overwrote before's write
        for slot, version in after.reads.items():
            if version == before.seq and slot in before.writes:
                return True  # wr: after read before's write
    for slot, version in before.reads.items():
        if slot in after.writes and after.seq > version:
            return True  # rw: before read a version that after replaced
    return False


#: A commit retained but not indexed yet: ``(txn_id, seq, reads, writes)`` as the commit
#: had them (its ``Footprint`` is made when the graph is next searched or listed). The
#: written keys, not the request: a request holds the values, which a window of commits
#: must not keep alive after the versions are collected.
_Commit = tuple[str, int, tuple[ReadRecord, ...], list[Slot]]


class SerializationGraph:
    """The footprints of the last ``window`` writing commits, and a cycle search through a new one.

    Footprints are indexed by the slots they wrote (in ``seq`` order) and by
    the ``(slot, version)`` pairs they read, so the edges leaving a footprint
    are found by looking up its own slots rather than by comparing it with the
    whole window. The backend hands each commit over with :meth:`add_commit`,
    which only queues it: the queue is indexed when a search or a listing
    needs it, so commits that are never audited (every isolation but
    ``serializable``) cost a queue entry, and the window is the same either
    way. ``audits`` counts the searches run and ``examined`` the footprints
    they entered (statistics for tests and operators).
    """

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError("window: must be at least 1")
        self.window = window
        self.audits = 0
        self.examined = 0
        self._footprints: deque[Footprint] = deque()  # indexed, oldest first
        # After them in commit order, not indexed. Bounded by the window: a commit never
        # indexed falls off the front as a newer one comes (nothing else refers to it).
        self._pending: deque[_Commit] = deque(maxlen=window)
        self._newest = 0  # the highest seq retained
        self._writers: dict[Slot, deque[Footprint]] = {}
        self._readers: dict[tuple[Slot, int], list[Footprint]] = {}

    def __len__(self) -> int:
        return len(self._footprints) + len(self._pending)

    def footprints(self) -> list[Footprint]:
        """The retained footprints, oldest first (a copy)."""
        self._index_pending()
        return list(self._footprints)

    def add(self, footprint: Footprint) -> None:
        """Retain a committed footprint, dropping the oldest beyond ``window``.

        Footprints arrive in commit order: ``seq`` never goes down.
        """
        self._check_order(footprint.txn_id, footprint.seq)
        self._index_pending()
        self._index(footprint)
        self._trim()

    def add_commit(
        self, txn_id: str, seq: int, reads: tuple[ReadRecord, ...], writes: list[Slot]
    ) -> None:
        """Retain a commit as :meth:`add` retains its footprint, indexed when first needed."""
        if seq < self._newest:
            self._check_order(txn_id, seq)
        self._newest = seq
        pending = self._pending
        pending.append((txn_id, seq, reads, writes))  # a full queue drops its oldest itself
        if self._footprints and len(self._footprints) + len(pending) > self.window:
            self._trim()

    def _check_order(self, txn_id: str, seq: int) -> None:
        if seq < self._newest:
            raise ValueError(
                f"footprint {txn_id!r}: seq {seq} is below the newest retained seq {self._newest}"
            )
        self._newest = seq

    def _trim(self) -> None:
        while len(self._footprints) + len(self._pending) > self.window:
            if self._footprints:
                self._drop(self._footprints.popleft())
            else:
                self._pending.popleft()  # never indexed: nothing else refers to it

    def _index_pending(self) -> None:
        pending = self._pending
        while pending:
            self._index(Footprint.of(*pending.popleft()))

    def _index(self, footprint: Footprint) -> None:
        self._footprints.append(footprint)
        for slot in footprint.writes:
            self._writers.setdefault(slot, deque()).append(footprint)
        for read in footprint.reads.items():
            self._readers.setdefault(read, []).append(footprint)

    def _drop(self, old: Footprint) -> None:
        for slot in old.writes:
            writers = self._writers[slot]
            writers.popleft()  # the oldest retained writer of the slot is ``old``
            if not writers:
                del self._writers[slot]
        for read in old.reads.items():
            readers = self._readers[read]
            readers.remove(old)
            if not readers:
                del self._readers[read]

    def _writers_after(self, slot: Slot, seq: int) -> Iterator[Footprint]:
        for writer in reversed(self._writers.get(slot, ())):
            if writer.seq <= seq:
                return
            yield writer

    def _successors(self, node: Footprint) -> Iterator[Footprint]:
        """Retained footprints ``x`` with an edge ``node -> x`` (maybe repeated)."""
        for slot in node.writes:
            yield from self._writers_after(slot, node.seq)  # ww
            yield from self._readers.get((slot, node.seq), ())  # wr
        for slot, version in node.reads.items():
            yield from self._writers_after(slot, version)  # rw

    def cycle_through(self, candidate: Footprint) -> list[str] | None:
        """A cycle through ``candidate`` (not retained yet) in the graph of the window + it.

        Returns the transaction ids along the cycle, starting at the
        candidate, or ``None``. A cycle means no serial order explains what
        the transactions saw. A depth-first walk from the candidate: a
        footprint fully explored without reaching the candidate cannot reach
        it by another path either, so each is entered at most once.
        """
        self.audits += 1
        self._index_pending()
        seen = {candidate.txn_id}
        path = [candidate]
        pending = [self._successors(candidate)]
        while pending:
            nxt = next(pending[-1], None)
            if nxt is None:
                pending.pop()
                path.pop()
                continue
            if nxt.txn_id in seen:
                continue
            self.examined += 1
            seen.add(nxt.txn_id)
            path.append(nxt)
            if depends(nxt, candidate):
                return [f.txn_id for f in path]
            pending.append(self._successors(nxt))
        return None


def find_serialization_cycle(window: Iterable[Footprint], candidate: Footprint) -> list[str] | None:
    """A cycle through ``candidate`` in the dependency graph of ``window`` + it, or ``None``.

    The same search the commit path runs (:meth:`SerializationGraph.cycle_through`),
    over a graph built from ``window``.
    """
    footprints = sorted(window, key=lambda f: f.seq)
    graph = SerializationGraph(max(1, len(footprints)))
    for footprint in footprints:
        graph.add(footprint)
    return graph.cycle_through(candidate)
