"""The sdist and the wheel carry what a user of the package is owed: the licence, the revisions
and the Lua scripts.

``python -m build`` builds both from this checkout, the way a release is built
(an isolated environment with the declared build backend), and the archives are
opened to check their members. Marked slow: the isolated build installs
hatchling first.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LICENSE = REPO / "LICENSE"


def test_the_license_file_is_the_apache_2_0_text_pyproject_names() -> None:
    """LICENSE at the repo root is the Apache License 2.0, the licence pyproject declares."""
    text = LICENSE.read_text(encoding="utf-8")
    assert "Apache License" in text
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'license = "Apache-2.0"' in pyproject
    assert 'license-files = ["LICENSE"]' in pyproject


@pytest.mark.slow
def test_the_sdist_and_the_wheel_carry_the_license(tmp_path: Path) -> None:
    """`python -m build` makes an sdist and a wheel that both hold LICENSE, byte for byte."""
    built = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]

    (sdist,) = tmp_path.glob("statepact-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        (top,) = {name.split("/", 1)[0] for name in names}
        assert f"{top}/LICENSE" in names, names
        member = archive.extractfile(f"{top}/LICENSE")
        assert member is not None
        in_sdist = member.read()

    (wheel,) = tmp_path.glob("statepact-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        licenses = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert len(licenses) == 1, names
        in_wheel = archive.read(licenses[0])
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        headers = archive.read(metadata).decode()
        assert "License-Expression: Apache-2.0" in headers
        assert "License-File: LICENSE" in headers
        # The revisions ride along too (statepact db upgrade from an installed wheel).
        assert "statepact/_migrations/alembic.ini" in names
        # And every Lua script of every folder, which statepact.storage.redis reads at import.
        lua = REPO / "src" / "statepact" / "storage" / "redis" / "lua"
        scripts = {
            f"statepact/storage/redis/lua/{p.relative_to(lua).as_posix()}"
            for p in lua.rglob("*.lua")
        }
        assert len(scripts) > 20 and scripts <= set(names), scripts - set(names)
    assert in_sdist == in_wheel == LICENSE.read_bytes()
