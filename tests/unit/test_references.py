"""What the source cites can be found: docs pages and anchors, file names, no private documents.

A module docstring says what the module is for and links to the docs page where the
design lives (docs/architecture.md); this keeps those links, and every file a comment
names, from going stale when a heading or a file moves.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    path
    for path in (REPO / "src" / "statepact").rglob("*")
    if path.suffix in (".py", ".lua") and path.is_file()
)
DOC_LINK = re.compile(r"docs/([\w-]+\.md)(?:#([\w-]+))?")
# A heading cited by its words: docs/page.md, "Heading" (or docs/page.md "Heading").
QUOTED_HEADING = re.compile(r'docs/([\w-]+\.md)`{0,2},?\s+\(?"([^"]+)"')
# A line break inside a comment or docstring, with the next line's comment marker.
WRAP = re.compile(r"\s*\n\s*(?:#|--)?\s*")
FILE_NAME = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.(?:py|lua))\b")
# Documents a reader of the repository cannot open.
UNFINDABLE = re.compile(r"\bthe seed\b|\bseed's\b|\bDESIGN(?:\.md| section)", re.IGNORECASE)


def _slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc) gives a heading."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


@cache
def _anchors(page: str) -> frozenset[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in (REPO / "docs" / page).read_text("utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else re.match(r"#{1,6} (.+)", line)
        if match is None:
            continue
        slug = _slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}_{count}")
    return frozenset(anchors)


@cache
def _repository_files() -> tuple[str, ...]:
    skip = {".git", ".venv", "node_modules", "site"}
    return tuple(
        path.relative_to(REPO).as_posix()
        for path in REPO.rglob("*")
        if path.is_file() and not skip & set(path.relative_to(REPO).parts)
    )


def _lines() -> Iterator[tuple[str, int, str]]:
    for path in SOURCES:
        for number, line in enumerate(path.read_text("utf-8").splitlines(), start=1):
            yield path.relative_to(REPO).as_posix(), number, line


def test_every_docs_link_in_the_source_names_a_page_and_a_heading() -> None:
    broken = []
    for where, number, line in _lines():
        for page, anchor in DOC_LINK.findall(line):
            if not (REPO / "docs" / page).is_file():
                broken.append(f"{where}:{number}: docs/{page} does not exist")
            elif anchor and anchor not in _anchors(page):
                broken.append(f"{where}:{number}: docs/{page} has no heading #{anchor}")
    assert broken == []


def test_every_heading_the_source_quotes_is_on_its_page() -> None:
    """``docs/page.md, "Heading"`` names a heading the page has (by its anchor)."""
    broken = [
        f"{path.relative_to(REPO).as_posix()}: docs/{page} has no heading {heading!r}"
        for path in SOURCES
        for page, heading in QUOTED_HEADING.findall(WRAP.sub(" ", path.read_text("utf-8")))
        if (REPO / "docs" / page).is_file() and _slug(heading) not in _anchors(page)
    ]
    assert broken == []


def test_every_file_the_source_names_is_in_the_repository() -> None:
    files = _repository_files()
    missing = [
        f"{where}:{number}: {name}"
        for where, number, line in _lines()
        for name in FILE_NAME.findall(line)
        if not any(path == name or path.endswith(f"/{name}") for path in files)
    ]
    assert missing == []


def test_the_source_cites_no_document_a_reader_cannot_open() -> None:
    cited = [
        f"{where}:{number}: {line.strip()}"
        for where, number, line in _lines()
        if UNFINDABLE.search(line)
    ]
    assert cited == []


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Inside your transaction: `bound()`", "inside-your-transaction-bound"),
        ("What Redis refuses, and why", "what-redis-refuses-and-why"),
        ("The claim in one script", "the-claim-in-one-script"),
    ],
)
def test_the_anchors_are_the_ones_mkdocs_makes(heading: str, anchor: str) -> None:
    assert _slug(heading) == anchor
