"""The Redis persistence table says the same thing on every page, and what preflight does.

docs/operations.md, docs/backings.md and docs/faults.md each carry the table of
which Redis persistence settings keep which promise, between
``<!-- redis-persistence ... -->`` markers. The copies must be identical, and
each row's ``durable=True`` verdict must be what ``refusals()`` answers for
that configuration.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from statepact.storage.redis.preflight import ServerConfig, refusals

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ("operations.md", "backings.md", "faults.md")
_TABLE = re.compile(r"<!-- redis-persistence[^>]*-->\n(.*?)<!-- /redis-persistence -->", re.S)

# The configuration each row's first cell describes, as CONFIG GET reports it.
ROWS = {
    "`appendonly yes`, `appendfsync always`": ("yes", "", "always"),
    "`appendonly yes`, `appendfsync everysec` (the default with AOF)": ("yes", "", "everysec"),
    "`appendonly yes`, `appendfsync no`": ("yes", "", "no"),
    '`appendonly no`, save points (`save "3600 1"`: RDB only)': ("no", "3600 1", "everysec"),
    '`appendonly no`, `save ""`': ("no", "", "everysec"),
}


def _table(page: str) -> str:
    found = _TABLE.findall((DOCS / page).read_text("utf-8"))
    assert len(found) == 1, f"{page}: expected one redis-persistence table, found {len(found)}"
    return str(found[0])


def test_every_page_has_the_same_table() -> None:
    """operations.md, backings.md and faults.md carry one identical persistence table."""
    tables = {page: _table(page) for page in PAGES}
    assert len(set(tables.values())) == 1, tables


@pytest.mark.parametrize("durable", [True, False])
def test_each_rows_verdict_is_what_preflight_does(durable: bool) -> None:
    """A row says accepted exactly when refusals() finds nothing for its configuration."""
    rows = [line.split(" | ") for line in _table("operations.md").splitlines()[2:]]
    assert sorted(row[0].lstrip("| ") for row in rows) == sorted(ROWS)
    for row in rows:
        appendonly, save, fsync = ROWS[row[0].lstrip("| ")]
        config = ServerConfig(
            server="Redis",
            source="CONFIG",
            maxmemory_policy="noeviction",
            appendonly=appendonly == "yes",
            save=save,
            appendfsync=fsync,
        )
        reasons = refusals(config, durable=durable)
        if durable:
            assert (row[1] == "accepted") == (reasons == []), (row, reasons)
        else:
            assert reasons == [], (row, reasons)
