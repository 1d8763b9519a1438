"""The import rules of docs/architecture.md, read from the source of every module."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import statepact

PACKAGE = Path(statepact.__file__).parent

FOUNDATION = frozenset(
    {
        "statepact.errors",
        "statepact.clock",
        "statepact.models",
        "statepact.settings",
        "statepact._limits",
        "statepact._codec",
        "statepact._retry",
        "statepact._cancel",
        "statepact._shared",
        "statepact._turns",
        "statepact._observe",
        "statepact._queue_policy",
        "statepact._queue_limits",
    }
)
FRONTS = frozenset({"statepact.state", "statepact.queue", "statepact.tx"})
RUNTIME = frozenset({"statepact.worker", "statepact.otel"})
BACKINGS = ("memory", "redis", "postgres")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> Iterator[str]:
    """Every statepact module ``name`` imports, at module level or inside a function
    (``from statepact import x`` counts as ``statepact.x`` when ``x`` is a module)."""
    modules = _modules()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("statepact"))
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{name}: relative import (the package imports absolutely)"
            base = node.module or ""
            if not base.startswith("statepact"):
                continue
            for alias in node.names:
                child = f"{base}.{alias.name}"
                yield child if child in modules else base


def _layer(name: str) -> str:
    if name == "statepact":
        return "package"
    if name in FOUNDATION:
        return "foundation"
    if (
        name in FRONTS
        or name == "statepact._queue"
        or name.startswith(("statepact._tx", "statepact._queue."))
    ):
        return "front"
    if name in RUNTIME or name.startswith("statepact.worker."):
        return "runtime"
    if name.startswith("statepact.storage."):
        return "backing"
    if name == "statepact.storage":
        return "storage"
    if name.startswith("statepact.cli"):
        return "cli"
    if name.startswith("statepact.testing"):
        return "testing"
    if name.startswith("statepact.integrations"):
        return "integration"
    if name.startswith("statepact.dashboard"):
        return "dashboard"
    raise AssertionError(f"{name} is in no layer of docs/architecture.md; add it there")


def _front(name: str) -> str:
    """The front whose private parts ``name`` is (``statepact._tx``, ``statepact._queue``)."""
    if name.startswith("statepact._tx"):
        return "statepact.tx"
    if name == "statepact._queue" or name.startswith("statepact._queue."):
        return "statepact.queue"
    return name


def _backing(name: str) -> str | None:
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "storage" else None


def _a(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _integration(name: str) -> str | None:
    """``adk`` for ``statepact.integrations.adk`` and everything under it."""
    parts = name.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "integrations" else None


def _private_to_a_backing(name: str) -> bool:
    """``storage/<backing>/_x.py`` or anything under ``storage/<backing>/_x/``."""
    return _backing(name) is not None and any(
        part.startswith("_") and part != "__init__" for part in name.split(".")[3:]
    )


def _command(name: str) -> str:
    """The command a ``cli`` module belongs to: ``cli/_bench/`` holds ``cli/bench.py``'s
    parts (``_common`` is every command's, ``__main__`` the dispatcher's)."""
    parts = name.split(".")
    own = parts[2] if len(parts) > 2 else ""
    if own.startswith("_") and not own.startswith("__") and own != "_common":
        return f"statepact.cli.{own[1:]}"
    return ".".join(parts[:3])


#: The one dashboard module the runtime may import: the worker registry, which imports
#: neither starlette nor a driver until a registry on that server is asked for.
WORKER_REGISTRY = "statepact.dashboard.workers"

# The modules holding a backing's protocol classes; its private helpers sit below them.
CLASS_MODULES = frozenset({"state", "queue", "backend"})


def _broken_rule(importer: str, imported: str) -> str | None:
    """Why ``importer`` may not import ``imported``, or None when it may."""
    if imported == importer:
        return None
    source, target = _layer(importer), _layer(imported)
    allowed = {
        "foundation": {"foundation"},
        "front": {"foundation"},
        "package": {"foundation", "front"},
        "runtime": {"foundation", "front", "runtime", "package"},
        "storage": {"foundation", "front"},
        "backing": {"foundation", "front", "storage", "backing"},
        "integration": {"foundation", "front", "storage", "backing", "integration"},
        "dashboard": {"foundation", "front", "package", "runtime", "storage", "backing"}
        | {"dashboard"},
    }
    if importer == "statepact.worker._worker" and imported == WORKER_REGISTRY:
        return None  # the worker announces itself (lazily, at start)
    if source == target == "front" and _front(importer) == _front(imported):
        return None  # a front and its own private parts (statepact._tx, statepact._queue)
    if source in allowed and target not in allowed[source]:
        return f"{_a(source)} {source} module imports {_a(target)} {target} module"
    if source == target == "integration" and _integration(importer) != _integration(imported):
        return "an integration imports another integration"
    if source == "backing" and target == "backing" and _backing(importer) != _backing(imported):
        return "a backing imports another backing"
    if _private_to_a_backing(imported) and _backing(importer) != _backing(imported):
        return "a backing's private module is imported from outside its package"
    backing = _backing(importer)
    if _private_to_a_backing(importer) and imported in {
        f"statepact.storage.{backing}.{name}" for name in CLASS_MODULES
    }:
        return "a backing's private module imports the classes it sits below"
    if (
        importer.startswith("statepact.worker._")
        and importer != "statepact.worker._worker"
        and imported in {"statepact.worker", "statepact.worker._worker"}
    ):
        return "a worker part imports the face it sits below"
    if target == "cli" and source != "cli":
        return "a module outside cli/ imports cli/"
    if source == "cli" and target == "cli":
        commands = {_command(importer), _command(imported)}
        if len(commands - {"statepact.cli", "statepact.cli._common"}) == 2:
            return "a command imports another command"
        if importer != _command(importer) and imported == _command(importer):
            return "a command's own parts import the command they sit below"
        if imported == "statepact.cli" and importer != "statepact.cli.__main__":
            return "a command imports the dispatcher"
    return None


def test_every_module_is_in_a_layer() -> None:
    for name in _modules():
        _layer(name)


def test_no_module_imports_across_its_layers_rules() -> None:
    broken = [
        f"{importer} imports {imported}: {reason}"
        for importer, path in _modules().items()
        for imported in sorted(set(_imports(importer, path)))
        if (reason := _broken_rule(importer, imported)) is not None
    ]
    assert broken == []


@pytest.mark.parametrize(
    ("importer", "imported", "reason"),
    [
        ("statepact.queue", "statepact.storage.redis", "a front module imports a backing"),
        ("statepact.errors", "statepact.models", None),
        ("statepact.models", "statepact.tx", "a foundation module imports a front"),
        ("statepact.tx", "statepact._tx.transaction", None),
        ("statepact._tx.transaction", "statepact._tx.models", None),
        ("statepact.state", "statepact._tx.models", "a front module imports a front"),
        ("statepact._tx.models", "statepact.queue", "a front module imports a front"),
        ("statepact.worker", "statepact.storage.memory", "a runtime module imports a backing"),
        ("statepact.worker._executor", "statepact.storage.redis", "a runtime module imports"),
        ("statepact.worker._claimer", "statepact.worker._worker", "the face it sits below"),
        ("statepact.worker._schedules", "statepact.worker", "the face it sits below"),
        ("statepact.worker._worker", "statepact.worker._executor", None),
        ("statepact.worker", "statepact.worker._worker", None),
        ("statepact.storage.redis.queue", "statepact.storage.postgres.schema", "another backing"),
        ("statepact.cli.bench", "statepact.storage.redis._scripts", "private module"),
        ("statepact.testing.fixtures", "statepact.storage.redis._keys", "private module"),
        ("statepact.cli.bench", "statepact.cli.demo", "a command imports another command"),
        ("statepact.cli.bench", "statepact.cli._common", None),
        ("statepact.cli.bench", "statepact.cli._bench.floors", None),
        ("statepact.cli._bench.targets", "statepact.cli._bench.floors", None),
        ("statepact.cli._bench.scenarios", "statepact.cli._common", None),
        ("statepact.cli.demo", "statepact.cli._bench.report", "a command imports another command"),
        ("statepact.cli._bench.floors", "statepact.cli.demo", "a command imports another command"),
        ("statepact.cli._bench.report", "statepact.cli.bench", "sit below"),
        ("statepact.cli.__main__", "statepact.cli", None),
        ("statepact.testing.fixtures", "statepact.cli._common", "outside cli/ imports cli/"),
        ("statepact.storage.redis.queue", "statepact.storage.redis._keys", None),
        ("statepact.storage.redis.backing", "statepact.storage", None),
        ("statepact.storage", "statepact.storage.memory", "a storage module imports a backing"),
        ("statepact.storage", "statepact.worker", "a storage module imports a runtime module"),
        ("statepact.cli.bench", "statepact.storage.postgres._sql.queue", "private module"),
        ("statepact.storage.postgres.queue", "statepact.storage.postgres._sql.queue", None),
        ("statepact.storage.postgres._sql.tx", "statepact.storage.postgres.schema", None),
        ("statepact.storage.postgres._sql.queue", "statepact.storage.postgres.queue", "sits below"),
        ("statepact.storage.memory._locks", "statepact.storage.memory.backend", "sits below"),
        ("statepact.storage.memory._serialization", "statepact.storage.memory._locks", None),
        ("statepact.integrations.adk._redis", "statepact.storage.redis", None),
        ("statepact.integrations.adk._postgres", "statepact.storage.postgres.schema", None),
        ("statepact.integrations.adk.service", "statepact.storage", None),
        ("statepact.integrations.adk.service", "statepact.integrations.adk._store", None),
        ("statepact.integrations.adk._redis", "statepact.storage.redis._keys", "private module"),
        ("statepact.integrations.adk._postgres", "statepact.storage.postgres._client", "private"),
        ("statepact.integrations.adk.service", "statepact.worker", "imports a runtime module"),
        ("statepact.integrations.adk.service", "statepact.cli._common", "imports a cli module"),
        ("statepact.integrations.adk", "statepact.integrations.langgraph", "another integration"),
        ("statepact.storage.redis.state", "statepact.integrations.adk", "an integration module"),
        ("statepact.worker", "statepact.integrations.adk", "an integration module"),
        ("statepact.storage", "statepact.integrations.adk", "an integration module"),
        ("statepact.worker._worker", "statepact.dashboard.workers", None),
        ("statepact.worker._executor", "statepact.dashboard.workers", "a dashboard module"),
        ("statepact.worker._worker", "statepact.dashboard.app", "a dashboard module"),
        ("statepact.storage.redis.queue", "statepact.dashboard.workers", "a dashboard module"),
        ("statepact.dashboard.workers", "statepact.storage.redis", None),
        ("statepact.dashboard.workers", "statepact.storage.redis._keys", "private module"),
        ("statepact.dashboard.app", "statepact.cli._common", "imports a cli module"),
    ],
)
def test_the_rules_refuse_what_the_page_forbids(
    importer: str, imported: str, reason: str | None
) -> None:
    """The checker itself: each rule refuses its case and lets the allowed ones through."""
    got = _broken_rule(importer, imported)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


# What builds SQL: a PostgreSQL backing's classes run the statements of ``_sql/``.
SQL_BUILDERS = frozenset(
    {"bindparam", "case", "cast", "delete", "func", "insert", "literal_column", "select"}
    | {"text", "union_all", "update"}
)


@pytest.mark.parametrize("module", sorted(CLASS_MODULES))
def test_the_postgres_classes_build_no_sql(module: str) -> None:
    """``storage/postgres/{state,queue,backend}.py`` import no statement builder: every
    statement lives in ``storage/postgres/_sql/``."""
    path = PACKAGE / "storage" / "postgres" / f"{module}.py"
    builders = [
        f"{node.module}.{alias.name}"
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy")
        for alias in node.names
        if alias.name in SQL_BUILDERS
    ]
    assert builders == []


#: Each agent framework, and the only package that may import it.
FRAMEWORKS = {
    "google.adk": "statepact.integrations.adk",
    "langgraph": "statepact.integrations.langgraph",
}


def _third_party_imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def test_a_framework_is_imported_by_its_integration_only() -> None:
    """google-adk is imported only under ``statepact.integrations.adk`` (and likewise each
    framework under its own integration): no other module can pull it in."""
    strays = [
        f"{name} imports {module}"
        for name, path in _modules().items()
        for module in _third_party_imports(path)
        for framework, home in FRAMEWORKS.items()
        if (module == framework or module.startswith(f"{framework}."))
        and not (name == home or name.startswith(f"{home}."))
    ]
    assert strays == []


def test_import_statepact_loads_no_framework() -> None:
    """``import statepact`` (and its backings, and ``statepact.integrations``) never imports
    an agent framework: only ``statepact.integrations.<name>`` does."""
    probe = (
        "import json, sys, statepact, statepact.storage.memory, statepact.integrations\n"
        "frameworks = ('google.adk', 'langgraph')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(frameworks))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_import_statepact_loads_no_driver() -> None:
    probe = (
        "import json, sys, statepact\n"
        "drivers = ('redis', 'hiredis', 'sqlalchemy', 'asyncpg', 'alembic')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in drivers)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_priority_bound_is_the_one_in_limits() -> None:
    """``statepact.queue.MAX_PRIORITY`` is ``_limits``' own object (the schema's CHECK reads
    that one): one bound, re-exported, never a second copy."""
    from statepact import _limits, queue

    assert queue.MAX_PRIORITY is _limits.MAX_PRIORITY
    assert "MAX_PRIORITY =" not in Path(queue.__file__).read_text()


# -- no reach into another layer's privates, no driver error caught outside the boundary ------

#: ``getattr(obj, "_private")`` on something not ``self``: allowed only here, each with why.
PRIVATE_GETATTR_ALLOWED = {
    # A driver's private, not a statepact layer's: SQLAlchemy's pool and Alembic's proxy,
    # redis-py's metrics hooks, each read defensively with a default.
    ("statepact.storage.postgres._direct", "_max_overflow"),
    ("statepact.storage.postgres.migrate", "_proxy"),
    ("statepact.storage.redis._client", "_async_collector_resolved"),
    ("statepact.storage.redis._client", "_async_metrics_collector"),
}

#: Modules that catch a driver's (redis-py's, asyncpg's) exception class other than the
#: backings' error boundaries (``storage/<backing>/_client.py``), each with why.
DRIVER_CATCH_ALLOWED = {
    # The Redis queue's pub/sub watch subscribes again after the connection fails: any
    # RedisError there means "the subscription is gone", whatever _client would call it.
    "statepact.storage.redis._queue_watch",
    # Reloading a script the server lost (NOSCRIPT) is the script registry's own job.
    "statepact.storage.redis._scripts",
    # Preflight reads CONFIG and falls back to INFO where CONFIG is refused: a diagnosis.
    "statepact.storage.redis.preflight",
}

DRIVERS = ("asyncpg", "redis")


def _private_getattrs(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id != "getattr" or len(node.args) < 2:
            continue
        owner, name = node.args[0], node.args[1]
        if isinstance(owner, ast.Name) and owner.id in {"self", "cls"}:
            continue
        if (
            isinstance(name, ast.Constant)
            and isinstance(name.value, str)
            and name.value.startswith("_")
            and not name.value.startswith("__")
        ):
            yield name.value


def _driver_catches(tree: ast.AST) -> Iterator[str]:
    """The driver names an ``except`` clause of ``tree`` names (a class imported from a
    driver, or the driver module itself)."""
    driver_names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in DRIVERS:
            driver_names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in DRIVERS:
                    driver_names.add((alias.asname or alias.name).split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            for name in ast.walk(node.type):
                if isinstance(name, ast.Name) and name.id in driver_names:
                    yield name.id


def test_no_module_reads_another_layers_private_names_through_getattr() -> None:
    """What another layer needs is a public attribute (``client``, ``target``, ``manager``):
    ``getattr(other, "_private")`` is allowed only where PRIVATE_GETATTR_ALLOWED says why."""
    found = {
        (name, private)
        for name, path in _modules().items()
        for private in _private_getattrs(ast.parse(path.read_text("utf-8")))
    }
    assert found - PRIVATE_GETATTR_ALLOWED == set()
    assert PRIVATE_GETATTR_ALLOWED - found == set(), "an allowlisted reach is gone: drop it"


def test_driver_exceptions_are_caught_only_at_the_backings_boundary() -> None:
    """A backing (or an integration) catches redis-py's or asyncpg's exceptions only in its
    ``_client`` (which turns them into predicates and statepact errors). Tools (``cli/``,
    ``testing/``) diagnose servers and may name a driver's errors."""
    found = {
        name
        for name, path in _modules().items()
        if _layer(name) in {"backing", "integration", "front", "foundation", "runtime"}
        and not name.endswith("._client")
        and any(True for _ in _driver_catches(ast.parse(path.read_text("utf-8"))))
    }
    assert found - DRIVER_CATCH_ALLOWED == set()
    assert DRIVER_CATCH_ALLOWED - found == set(), "an allowlisted catch is gone: drop it"
