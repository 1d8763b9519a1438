"""What ``statepact bench`` reports: one result per scenario, the progress bar, the table.

A result is held against one or more floors measured beside it, each with the
ratio the issues ask for (its target); docs/benchmarks.md#floors-and-targets
says what each is. Nothing here measures or touches a server.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO


@dataclass
class Against:
    """A further floor a scenario is held against, or a peer only the peer harness runs
    (``floor_ops_per_s`` and ``ratio`` None: the bench does not run it)."""

    floor: str
    floor_ops_per_s: float | None
    ratio: float | None
    target: float | None = None


@dataclass
class BenchResult:
    """One measured scenario on one backing, held against its floor (and ``also``
    against more)."""

    backing: str
    scenario: str
    label: str
    concurrency: int
    ops: int
    seconds: float
    ops_per_s: float
    floor: str = ""
    floor_ops_per_s: float = 0.0
    ratio: float = 0.0
    #: The least ``ratio`` asked for (docs/benchmarks.md); None where none is.
    target: float | None = None
    #: Further floors measured beside it, and peers with a target that only the peer
    #: harness runs.
    also: list[Against] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    #: Round trips the library sent per operation in the timed part; None on memory.
    round_trips_per_op: float | None = None
    #: Of those, the ones sent inside the backend's ``commit`` (transaction scenarios only).
    commit_round_trips_per_op: float | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchResult:
        """A result from its ``--json`` form (``dataclasses.asdict``'s)."""
        also = [Against(**one) for one in data.get("also", [])]
        return cls(**{**data, "also": also})

    def against(self) -> Iterator[Against]:
        """Every floor and peer it is held against, its own floor first."""
        yield Against(self.floor, self.floor_ops_per_s, self.ratio, self.target)
        yield from self.also


class Progress:
    """A one-line text progress bar on stderr: redrawn in place on a terminal, else one
    line per finished step."""

    def __init__(self, total: int, stream: TextIO | None = None, *, width: int = 28) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last = 0.0
        self._label = ""
        self._detail = ""

    def _draw(self, fraction: float, *, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        overall = min((self.done + fraction) / self.total, 1.0)
        filled = int(overall * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        detail = f" ({self._detail})" if self._detail else ""
        text = f"[{bar}] {overall * 100:5.1f}% {self._label}{detail}"
        self.stream.write("\r" + text[:110].ljust(110))
        self.stream.flush()

    def start(self, label: str) -> None:
        self._label = label
        self._detail = ""
        if self.tty:
            self._draw(0.0, force=True)

    def update(self, fraction: float) -> None:
        """Progress inside the current step, 0..1."""
        if self.tty:
            self._draw(fraction)

    def detail(self, text: str) -> None:
        """What the current step does now (a floor beside it): shown on a terminal only."""
        self._detail = text
        if self.tty:
            self._draw(0.0, force=True)

    def finish_step(self, note: str = "") -> None:
        self.done += 1
        self._detail = ""
        if self.tty:
            self._draw(0.0, force=True)
        else:
            self.stream.write(
                f"[{self.done}/{self.total}] {self._label}{(' ' + note) if note else ''}\n"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r" + " " * 110 + "\r")
            self.stream.flush()


def format_round_trips(result: BenchResult) -> str:
    """``3.00``, ``3.00 (commit 1.00)`` for a transaction scenario, ``-`` on memory."""
    if result.round_trips_per_op is None:
        return "-"
    text = f"{result.round_trips_per_op:.2f}"
    if result.commit_round_trips_per_op is not None:
        text += f" (commit {result.commit_round_trips_per_op:.2f})"
    return text


def met(against: Against) -> bool | None:
    """Whether the ratio reaches its target; None without a target or a ratio."""
    if against.target is None or against.ratio is None:
        return None
    return against.ratio >= against.target


def format_target(against: Against) -> str:
    """``>= 0.8 met``, ``>= 0.8 not met``, ``>= 3.0 (peer)`` for a peer not run here, or
    nothing."""
    if against.target is None:
        return ""
    reached = met(against)
    verdict = "(peer)" if reached is None else ("met" if reached else "not met")
    return f">= {against.target:.1f} {verdict}"


def targets_met(results: Sequence[BenchResult]) -> tuple[int, int]:
    """How many targets measured in this run were met, of how many."""
    verdicts = [v for r in results for a in r.against() if (v := met(a)) is not None]
    return sum(verdicts), len(verdicts)


def format_table(results: Sequence[BenchResult]) -> str:
    """The results as a fixed-width text table, one row per scenario and backing, and one
    more under it per further floor or peer it is held against."""
    headers = (
        "backing",
        "scenario",
        "conc",
        "ops",
        "round trips/op",
        "ops/s",
        "floor",
        "floor ops/s",
        "x floor",
        "target",
    )
    rows: list[tuple[str, ...]] = []
    for r in results:
        own = (
            r.backing,
            r.label,
            str(r.concurrency),
            str(r.ops),
            format_round_trips(r),
            f"{r.ops_per_s:,.0f}",
        )
        for n, against in enumerate(r.against()):
            rows.append(
                (
                    *(own if n == 0 else ("",) * len(own)),
                    against.floor,
                    "not run"
                    if against.floor_ops_per_s is None
                    else f"{against.floor_ops_per_s:,.0f}",
                    "-" if against.ratio is None else f"{against.ratio:.3f}",
                    format_target(against),
                )
            )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    right = {2, 3, 4, 5, 7, 8}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    return "\n".join(out)
