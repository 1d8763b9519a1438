"""An isolation checker for list-append histories, in the manner of Adya's anomalies.

Transactions append unique integers to JSON lists under keys and read whole
lists. Because every append writes the list, the longest list read for a key
is that key's version order, and every read names exactly which version it
saw. From a history of such transactions this module builds the dependency
graph (``ww``: one append followed another in a key's order; ``wr``: a
transaction read a list whose last element another appended; ``rw``: a
transaction read a list that another's append later extended) and searches
it for cycles:

- ``G0`` (dirty write): a cycle of ``ww`` edges only;
- ``G1a`` (aborted read): a committed read saw an aborted transaction's append;
- ``G1b`` (intermediate read): a read ended on an append its writer later
  followed with another append to the same key;
- ``G1c`` (circular information flow): a cycle of ``ww``/``wr`` edges;
- ``G-single`` (read skew and kin): a cycle with exactly one ``rw`` edge;
- ``G2`` (write skew and kin): a cycle with two or more ``rw`` edges.

Plus three non-cycle findings: ``lost-append`` (a committed append missing
from its key's final order), ``incompatible-order`` (two reads of a key that
are not prefixes of one another) and ``garbage`` (a value nobody appended).

:func:`record_append` and :func:`record_read` run the operations through a
``statepact.tx.Transaction`` and note them in a :class:`TxnRecord`, so a test
builds its history while it runs. Nothing here does I/O of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from statepact.tx import Transaction

__all__ = [
    "Anomaly",
    "Op",
    "TxnRecord",
    "check_history",
    "record_append",
    "record_read",
]

EdgeKind = Literal["ww", "wr", "rw"]


@dataclass(frozen=True, slots=True)
class Op:
    """``append`` of ``value`` to ``key``, or ``read`` of ``key`` that returned ``value``."""

    kind: Literal["append", "read"]
    key: str
    value: int | tuple[int, ...]


@dataclass(slots=True)
class TxnRecord:
    """One attempted transaction and what it did; ``committed`` once its commit succeeded."""

    txn_id: str
    ops: list[Op] = field(default_factory=list)
    committed: bool = False


@dataclass(frozen=True, slots=True)
class Anomaly:
    """A finding: its name (``G0``, ``G1a``, ...), the transactions involved, and why."""

    name: str
    txns: tuple[str, ...]
    detail: str


async def record_append(
    tx: Transaction, record: TxnRecord, resource: str, key: str, value: int
) -> None:
    """Append ``value`` to the list at ``key`` (a read-modify-write) and note it."""
    current = await tx.read(resource, key)
    tx.write(resource, key, [*(current or []), value])
    record.ops.append(Op("append", key, value))


async def record_read(
    tx: Transaction, record: TxnRecord, resource: str, key: str
) -> tuple[int, ...]:
    """Read the list at ``key`` and note what was seen."""
    seen = tuple(await tx.read(resource, key) or [])
    record.ops.append(Op("read", key, seen))
    return seen


class _Graph:
    def __init__(self) -> None:
        self.edges: dict[str, dict[str, set[EdgeKind]]] = {}

    def add(self, source: str, target: str, kind: EdgeKind) -> None:
        if source != target:
            self.edges.setdefault(source, {}).setdefault(target, set()).add(kind)

    def restricted(self, kinds: set[EdgeKind]) -> dict[str, set[str]]:
        return {
            source: {t for t, ks in targets.items() if ks & kinds}
            for source, targets in self.edges.items()
        }


def _components(adjacency: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(adjacency):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(adjacency.get(root, ())))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(adjacency.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _path(adjacency: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """The shortest path ``start -> ... -> goal`` (both included), or ``None``."""
    parents: dict[str, str] = {start: start}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for target in sorted(adjacency.get(node, ())):
                if target in parents:
                    continue
                parents[target] = node
                if target == goal:
                    path = [goal]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return path[::-1]
                following.append(target)
        frontier = following
    return None


def check_history(history: Iterable[TxnRecord]) -> list[Anomaly]:
    """Every anomaly the history shows (see the module docstring); empty if none."""
    records = list(history)
    committed = [r for r in records if r.committed]
    writer: dict[int, tuple[str, str]] = {}  # value -> (txn, key)
    aborted_values: set[int] = set()
    last_append: dict[tuple[str, str], int] = {}  # (txn, key) -> its last value
    for record in records:
        for op in record.ops:
            if op.kind != "append":
                continue
            assert isinstance(op.value, int)
            if record.committed:
                writer[op.value] = (record.txn_id, op.key)
                last_append[(record.txn_id, op.key)] = op.value
            else:
                aborted_values.add(op.value)
    anomalies: list[Anomaly] = []

    # Reads stripped of the reader's own trailing appends: what it saw of others.
    observed: list[tuple[TxnRecord, str, tuple[int, ...]]] = []
    for record in committed:
        own = {op.value for op in record.ops if op.kind == "append"}
        for op in record.ops:
            if op.kind != "read":
                continue
            assert isinstance(op.value, tuple)
            trimmed = list(op.value)
            while trimmed and trimmed[-1] in own:
                trimmed.pop()
            observed.append((record, op.key, tuple(trimmed)))
            for value in op.value:
                if value in aborted_values:
                    anomalies.append(
                        Anomaly(
                            "G1a",
                            (record.txn_id,),
                            f"read {op.key}={op.value} "
                            f"contains {value}, appended by an aborted transaction",
                        )
                    )
                elif value not in writer and value not in own:
                    anomalies.append(
                        Anomaly(
                            "garbage",
                            (record.txn_id,),
                            f"read {op.key} saw {value}, which no transaction appended",
                        )
                    )

    # Each key's version order: the longest read; every other read must be its prefix.
    order: dict[str, tuple[int, ...]] = {}
    for _record, key, seen in observed:
        if len(seen) >= len(order.get(key, ())):
            order[key] = seen
    for record, key, seen in observed:
        if order[key][: len(seen)] != seen:
            anomalies.append(
                Anomaly(
                    "incompatible-order",
                    (record.txn_id,),
                    f"read {key}={seen} is not a prefix of {order[key]}",
                )
            )
    for value, (txn_id, key) in sorted(writer.items()):
        if value not in order.get(key, ()):
            anomalies.append(
                Anomaly(
                    "lost-append",
                    (txn_id,),
                    f"append of {value} to {key} was committed "
                    "but is missing from the key's final order",
                )
            )

    graph = _Graph()
    for values in order.values():
        for earlier, later in itertools.pairwise(values):
            if earlier in writer and later in writer:
                graph.add(writer[earlier][0], writer[later][0], "ww")
    for record, key, seen in observed:
        values = order[key]
        if values[: len(seen)] != seen:
            continue
        if seen and seen[-1] in writer:
            source, _ = writer[seen[-1]]
            graph.add(source, record.txn_id, "wr")
            if last_append.get((source, key)) != seen[-1]:
                anomalies.append(
                    Anomaly(
                        "G1b",
                        (record.txn_id, source),
                        f"read {key}={seen} ends on an intermediate append of {source}",
                    )
                )
        if len(values) > len(seen) and values[len(seen)] in writer:
            graph.add(record.txn_id, writer[values[len(seen)]][0], "rw")

    anomalies.extend(_cycles(graph))
    return anomalies


def _cycles(graph: _Graph) -> list[Anomaly]:
    """G0, G1c and G-single by the edge that closes them; G2 for any other cycle."""
    found: list[Anomaly] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    covered: list[frozenset[str]] = []

    def report(name: str, cycle: list[str]) -> None:
        nodes = frozenset(cycle)
        if (name, nodes) in seen:
            return
        seen.add((name, nodes))
        covered.append(nodes)
        found.append(Anomaly(name, tuple(cycle), "dependency cycle " + " -> ".join(cycle)))

    ww = graph.restricted({"ww"})
    for members in _components(ww):
        path = _path(ww, members[0], members[0])
        report("G0", path[:-1] if path else members)
    wwr = graph.restricted({"ww", "wr"})
    for closing, name in (("wr", "G1c"), ("rw", "G-single")):
        for source, targets in sorted(graph.edges.items()):
            for target, kinds in sorted(targets.items()):
                if closing not in kinds or (name == "G-single" and kinds & {"ww", "wr"}):
                    continue
                back = _path(wwr, target, source)
                if back is not None:
                    report(name, [source, *back[:-1]])
    everything = graph.restricted({"ww", "wr", "rw"})
    for members in _components(everything):
        nodes = frozenset(members)
        if any(part <= nodes for part in covered):
            continue
        path = _path(everything, members[0], members[0])
        report("G2", path[:-1] if path else members)
    return found
