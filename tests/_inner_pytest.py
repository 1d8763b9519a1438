"""Run a small pytest session of its own in a subprocess, where no provider finds a server.

The plugin's own tests (and the docs' conformance examples) need a pytest run
that starts from a clean slate: no ``STATEPACT_*`` or ``PYTEST_*`` variable of
the outer run, an empty ``PATH`` (no ``redis-server``, no ``postgres``) and a
Docker socket that does not exist (no testcontainers).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def run_pytest_without_servers(
    cwd: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m pytest -p no:cacheprovider *args`` in ``cwd``; ``env`` is added last."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("STATEPACT_", "PYTEST_"))}
    empty_bin = cwd / "bin"
    empty_bin.mkdir(exist_ok=True)
    clean |= {"PATH": str(empty_bin), "DOCKER_HOST": f"unix://{cwd}/no-docker.sock"}
    clean |= env or {}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env=clean,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
