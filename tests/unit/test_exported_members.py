"""``__all__`` is sorted, free of duplicates and importable; every error is exported at the top."""

from __future__ import annotations

import importlib
import inspect

import pytest

import statepact
import statepact.errors

MODULES = [
    "statepact",
    "statepact.errors",
    "statepact.storage",
    "statepact.storage.memory",
    "statepact.storage.redis",
    "statepact.integrations.adk",
    "statepact.integrations.langgraph",
]


def _ruff_order(name: str) -> tuple[int, str]:
    if name.isupper():
        return (0, name)
    return (1 if name[:1].isupper() else 2, name)


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_unique(name: str) -> None:
    exported = importlib.import_module(name).__all__
    # ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then the rest.
    assert list(exported) == sorted(exported, key=_ruff_order)
    assert len(set(exported)) == len(exported)


@pytest.mark.parametrize("name", MODULES)
def test_every_exported_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    missing = [member for member in module.__all__ if not hasattr(module, member)]
    assert missing == []


def test_every_error_is_exported_from_the_package() -> None:
    errors = {
        name
        for name, value in vars(statepact.errors).items()
        if inspect.isclass(value)
        and issubclass(value, statepact.errors.StatepactError)
        and value.__module__ == "statepact.errors"
    }
    assert errors == set(statepact.errors.__all__)
    assert errors <= set(statepact.__all__)
    for name in errors:
        assert getattr(statepact, name) is getattr(statepact.errors, name)


def test_every_error_says_whether_to_retry() -> None:
    for name in statepact.errors.__all__:
        error = getattr(statepact.errors, name)
        assert isinstance(error.retryable, bool), name
