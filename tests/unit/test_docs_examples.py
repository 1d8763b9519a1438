"""Every ```python block in docs/*.md runs: here the ones that need no server, on memory.

A block that needs a server is marked on the line before its fence with
``<!-- statepact-docs: needs redis -->`` (or ``postgres``, or ``redis, postgres``)
and runs in ``tests/integration/test_cli_docs_examples.py`` against the test
servers, with ``STATEPACT_REDIS_URL`` / ``STATEPACT_DATABASE_URL`` set. Each
block is a whole program (it calls ``asyncio.run`` itself), run in a fresh
namespace as ``__main__``.

A block marked ``<!-- statepact-docs: file NAME -->`` is not a program but a
file of a recipe (an application's Alembic ``env.py``): it is compiled here and
written out verbatim, under NAME, by the test that uses it (:func:`recipe_file`).

A block marked ``<!-- statepact-docs: excerpt PATH -->`` quotes lines of a file
of the repository (the example app in ``examples/``, which CI runs): it is not
run, and the test here checks that the file holds those lines, in a row, so
the page cannot drift from the code it quotes.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SERVERS = frozenset({"redis", "postgres"})
_MARKER = re.compile(r"^<!--\s*statepact-docs:\s*needs\s+(?P<needs>[a-z, ]+?)\s*-->$")
_FILE_MARKER = re.compile(r"^<!--\s*statepact-docs:\s*file\s+(?P<name>[\w./-]+)\s*-->$")
_EXCERPT_MARKER = re.compile(r"^<!--\s*statepact-docs:\s*excerpt\s+(?P<path>[\w./-]+)\s*-->$")
# What makes a block need a server: importing its driver or backing, or starting one.
_USES = {
    "redis": re.compile(
        r"^\s*(from|import)\s+(redis\b|statepact\.storage\.redis\b)|\bRedisServer\(", re.M
    ),
    "postgres": re.compile(
        r"^\s*(from|import)\s+(sqlalchemy\b|asyncpg\b|statepact\.storage\.postgres\b)"
        r"|\bPostgresServer\(",
        re.M,
    ),
}
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")


@dataclass(frozen=True)
class Example:
    """One ```python block: where it is, its code, and the servers it needs."""

    page: str
    line: int
    code: str
    needs: frozenset[str]
    file: str | None = None
    excerpt: str | None = None  # the repository file the block quotes

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def examples(docs: Path = DOCS) -> list[Example]:
    """Every ```python block of ``docs/*.md``, in page and line order."""
    found: list[Example] = []
    for page in sorted(docs.glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            opened = _FENCE.match(lines[i])
            if opened is None:
                i += 1
                continue
            fence, lang, start = opened.group("fence"), opened.group("lang"), i
            body: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i])
                i += 1
            i += 1
            if lang not in ("python", "py"):
                continue
            previous = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            marker = _MARKER.match(previous.strip())
            needs = (
                frozenset(n.strip() for n in marker.group("needs").split(",") if n.strip())
                if marker
                else frozenset()
            )
            named = _FILE_MARKER.match(previous.strip())
            file = named.group("name") if named else None
            quoted = _EXCERPT_MARKER.match(previous.strip())
            excerpt = quoted.group("path") if quoted else None
            code = "\n".join(body) + "\n"
            found.append(Example(page.name, start + 1, code, needs, file, excerpt))
    return found


def recipe_file(name: str, docs: Path = DOCS) -> str:
    """The text of the one block marked ``file NAME`` in the docs."""
    (found,) = [e for e in examples(docs) if e.file == name]
    return found.code


def run_example(example: Example) -> None:
    """Run the block as a program of its own."""
    code = compile(example.code, f"docs/{example.id}", "exec")
    exec(code, {"__name__": "__main__"})


ALL = examples()
EXCERPTS = [e for e in ALL if e.excerpt is not None]
FILES = [e for e in ALL if e.file is not None]
PROGRAMS = [e for e in ALL if e.file is None and e.excerpt is None]
LOCAL = [e for e in PROGRAMS if not e.needs]


def test_the_docs_have_examples_and_every_marker_is_known() -> None:
    """Markers name only redis and postgres, and most examples need no server."""
    assert len(ALL) >= 10
    for example in ALL:
        assert example.needs <= SERVERS, example.id
    assert len(LOCAL) > len(PROGRAMS) // 2


@pytest.mark.parametrize("example", EXCERPTS, ids=[e.id for e in EXCERPTS])
def test_every_excerpt_is_in_the_file_it_quotes(example: Example) -> None:
    """The quoted lines stand in the file, in a row and in order (indentation aside)."""
    assert example.excerpt is not None
    path = REPO / example.excerpt
    assert path.is_file(), f"{example.id}: no file {example.excerpt}"
    quoted = textwrap.dedent(example.code).splitlines()
    assert any(line.strip() for line in quoted), f"{example.id}: an empty excerpt"
    lines = path.read_text(encoding="utf-8").splitlines()
    for start in range(len(lines) - len(quoted) + 1):
        window = textwrap.dedent("\n".join(lines[start : start + len(quoted)])).splitlines()
        if window == quoted:
            return
    pytest.fail(f"{example.id}: these lines are not in {example.excerpt}:\n{example.code}")


@pytest.mark.parametrize("example", PROGRAMS + FILES, ids=[e.id for e in PROGRAMS + FILES])
def test_every_example_compiles_and_server_ones_are_marked(example: Example) -> None:
    """A block that touches a server's backing says so; nothing else may import its driver."""
    compile(example.code, f"docs/{example.id}", "exec")
    if example.file is not None:
        return  # a recipe's file, written out and run by the test that uses it
    for server, pattern in _USES.items():
        if pattern.search(example.code):
            assert server in example.needs, f"{example.id} uses {server} but is not marked"


@pytest.mark.parametrize("example", LOCAL, ids=[e.id for e in LOCAL])
def test_memory_example_runs(example: Example) -> None:
    """The example runs to the end on the memory backings, its own asserts included."""
    run_example(example)
