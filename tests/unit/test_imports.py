"""Importing statepact (or its memory backings and suites) loads no optional driver.

Each import runs in a fresh interpreter, so modules this test process already
loaded cannot hide a regression.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

DRIVERS = ("redis", "hiredis", "sqlalchemy", "asyncpg", "alembic", "testcontainers")


@pytest.mark.parametrize(
    "module",
    [
        "statepact",
        "statepact.storage.memory",
        "statepact.testing.state_suite",
        "statepact.testing.queue_suite",
    ],
)
def test_import_loads_no_driver(module: str) -> None:
    probe = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {DRIVERS!r})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [], f"importing {module} loaded drivers"
