"""The commands on a core-only install: ``pip install statepact``, no extra, in a fresh
virtualenv (the wheel this checkout builds, with pydantic and nothing else).

A command that needs a server's driver says in one line which extra to install, exit
1, with no traceback (``statepact db current`` printed two chained ones); the memory
demo runs. The virtualenv has no pip of its own: this interpreter's pip installs into
it, from the wheel and the package index, as ``test_example_app.py`` does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _run(
    argv: list[str], what: str, timeout: float, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, capture_output=True, text=True, check=False, timeout=timeout, cwd=cwd
    )
    assert done.returncode == 0, f"{what}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _statepact(venv: Path, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The virtualenv's own ``statepact`` console script, run in ``cwd``."""
    return subprocess.run(
        [str(venv / "bin" / "statepact"), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin"},
    )


@pytest.fixture(scope="module")
def core_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding statepact (from the wheel) and its one dependency, pydantic."""
    dist = tmp_path_factory.mktemp("dist")
    _run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)],
        "python -m build --wheel",
        timeout=300,
    )
    (wheel,) = dist.glob("statepact-*.whl")
    root = tmp_path_factory.mktemp("core") / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], "python -m venv", timeout=60)
    _run(
        [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install",
         "--quiet", "--no-compile", "--disable-pip-version-check", str(wheel)],
        "pip install statepact",
        timeout=600,
    )  # fmt: skip
    probe = (
        "import importlib.util as u; "
        "print([m for m in ('sqlalchemy', 'asyncpg', 'alembic', 'redis', 'psycopg') "
        "if u.find_spec(m)])"
    )
    # Away from the checkout, whose alembic/ folder would import as a package.
    found = _run([str(root / "bin" / "python"), "-c", probe], "probe", 60, cwd=root)
    assert found.stdout.strip() == "[]", found.stdout
    return root


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["db", "--url", "postgresql://app@127.0.0.1:1/app", "current"],
            "statepact db current: error: sqlalchemy is not installed: "
            "pip install 'statepact[postgres]'",
        ),
        (
            ["db", "upgrade", "--sql"],
            "statepact db upgrade: error: sqlalchemy is not installed: "
            "pip install 'statepact[postgres]'",
        ),
        (
            ["queue", "stats", "--postgres", "postgresql://app@127.0.0.1:1/app"],
            "statepact queue stats: error: sqlalchemy is not installed: "
            "pip install 'statepact[postgres]'",
        ),
        (
            ["queue", "stats", "--redis", "redis://127.0.0.1:1/0"],
            "statepact queue stats: error: redis is not installed: pip install 'statepact[redis]'",
        ),
        (
            ["doctor", "--postgres", "postgresql://app:secret@127.0.0.1:1/app"],
            "statepact doctor: error: sqlalchemy is not installed: "
            "pip install 'statepact[postgres]'",
        ),
    ],
)
def test_a_missing_driver_is_one_line_naming_the_extra(
    core_only: Path, argv: list[str], line: str, tmp_path: Path
) -> None:
    done = _statepact(core_only, argv, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == line + "\n"
    assert "Traceback" not in done.stdout + done.stderr
    assert "secret" not in done.stdout + done.stderr


def test_the_memory_demo_runs_on_the_core(core_only: Path, tmp_path: Path) -> None:
    done = _statepact(core_only, ["demo", "--seed", "3"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "dead letter: globex/run-poison after 3 attempts" in done.stdout
