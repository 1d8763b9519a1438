"""No password leaves ``redact_dsn`` or a settings object, whatever the DSN looks like.

``statepact.settings.redact_dsn`` is what every message, log line and CLI line
uses to show a server; the settings models keep the DSN as a ``SecretStr``.
Each password below is made of marker words (``PWa``, ``PWb``) joined by the
characters that make URLs hard to split, so a test can tell whether *any* part
of it got through. What may stay (user, host, port, database) is checked too: a
redaction that drops everything is safe but useless.
"""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from statepact.settings import PostgresStoreSettings, RedisStoreSettings, redact_dsn

MARKERS = ("PWa", "PWb")

URL_CASES = [
    # (dsn, what must still be shown)
    ("redis://user:PWa@host:6379/0", ["redis://", "user", "host:6379/0"]),
    ("rediss://:PWa@cache.example:6380/2", ["rediss://", "cache.example:6380/2"]),
    ("postgresql+asyncpg://app:PWa@db.internal:5432/prod", ["app", "db.internal:5432/prod"]),
    ("REDIS://user:PWa@host/0", ["host/0"]),
    ("redis://u:PWa@PWb@host/0", ["host/0"]),
    ("redis://u:PWa/PWb@host/0", ["host/0"]),
    ("redis://u:PWa?PWb@host/0", ["host/0"]),
    ("redis://u:PWa#PWb@host/0", ["host/0"]),
    ("redis://u:PWa:PWb@host/0", ["host/0"]),
    ("redis://u:PWa%40PWb@host/0", ["host/0"]),
    ("redis://u:PWa@PWb/x@host/0", []),
    ("postgresql://u:PWa@h/db?application_name=me@laptop", ["h/db?application_name=me@laptop"]),
    ("postgresql://u:PWa@h1:5432,h2:5433/db", ["h1:5432,h2:5433/db"]),
    ("redis://u:PWa@[::1]:6379/0", ["[::1]:6379/0"]),
    ("redis+unix://:PWa@/tmp/redis.sock?db=1", ["/tmp/redis.sock?db=1"]),
    ("postgresql://u@h/db?password=PWa&sslmode=require", ["sslmode=require", "u@h/db"]),
    ("postgresql://u@h/db?sslpassword=PWa", ["u@h/db"]),
    ("postgresql://u@h/db?PASSWORD=PWa", ["u@h/db"]),
    ("  redis://u:PWa@host/0", ["host/0"]),
    ("connecting to redis://u:PWa@host/0 failed", ["host/0 failed"]),
    # Whitespace in a password: the URL runs on past it to the '@' (issue 32).
    ("postgresql://u:PWa PWb@host/db", ["postgresql://u:", "@host/db"]),
    ("postgresql://u:PWa  PWb PWa@host:5432/db", ["@host:5432/db"]),
    ("postgresql://u:PWa\tPWb@host/db", ["@host/db"]),
    ("redis://:PWa PWb@host:6379/0", ["@host:6379/0"]),
    ("postgresql://u:PWa/PWb PWa@host/db", ["@host/db"]),
    ("postgresql://u:123PWa 456@host/db", ["@host/db"]),
    ("queue on postgresql://u:PWa PWb@host/db, schema 'x'", ["@host/db, schema 'x'"]),
    (
        "postgresql://u:PWa PWb@h1/db and postgresql://v:PWb PWa@h2/db",
        ["@h1/db and postgresql://v:", "@h2/db"],
    ),
]
KEYWORD_CASES = [
    "host=h user=u password=PWa dbname=d",
    "host=h password = PWa user=u",
    "host=h password='PWa PWb' user=u",
    "host=h password='PWa\\' PWb' user=u",
]


def _leaks(text: str) -> list[str]:
    return [marker for marker in MARKERS if marker in text]


@pytest.mark.parametrize(("dsn", "kept"), URL_CASES)
def test_url_passwords_are_masked(dsn: str, kept: list[str]) -> None:
    """No part of a URL's password survives, whatever characters it holds."""
    shown = redact_dsn(dsn)
    assert not _leaks(shown), f"{dsn!r} was shown as {shown!r}"
    for part in kept:
        assert part in shown, f"{dsn!r} was shown as {shown!r}, without {part!r}"


@pytest.mark.parametrize("dsn", KEYWORD_CASES)
def test_keyword_passwords_are_masked(dsn: str) -> None:
    """A libpq keyword/value DSN loses its password, quoted or spaced, and keeps the rest."""
    shown = redact_dsn(dsn)
    assert not _leaks(shown), f"{dsn!r} was shown as {shown!r}"
    assert "host=h" in shown
    assert "user=u" in shown or dsn.endswith("dbname=d")


def test_text_after_a_url_without_a_password_is_left_alone() -> None:
    """A URL naming no password ends at the whitespace as before: the words after it, an
    e-mail address included, are shown."""
    text = "postgresql://postgres@127.0.0.1:5432/db is down; mail ops@example.com"
    assert redact_dsn(text) == text
    text = "PostgreSQL at postgresql://127.0.0.1:5432/db: ask dba@example.com"
    assert redact_dsn(text) == text


def test_a_user_without_password_is_shown_as_it_is() -> None:
    """Nothing secret, nothing masked: the DSN a user would recognise."""
    assert redact_dsn("postgresql://postgres@127.0.0.1:5432/test") == (
        "postgresql://postgres@127.0.0.1:5432/test"
    )
    assert redact_dsn("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_secret_str_and_none() -> None:
    """A ``SecretStr`` is unwrapped only to be masked; no DSN says so."""
    assert not _leaks(redact_dsn(SecretStr("redis://u:PWa@h/0")))
    assert redact_dsn(None) == "<no dsn>"


@pytest.mark.parametrize(
    ("model", "dsn"),
    [
        (RedisStoreSettings, "redis://u:PWa@host:6379/0"),
        (PostgresStoreSettings, "postgresql+asyncpg://u:PWa@host/db"),
    ],
)
def test_settings_never_show_the_dsn(model: type[RedisStoreSettings], dsn: str) -> None:
    """repr, str, JSON and dict dumps of settings keep the DSN secret."""
    settings = model(dsn=dsn)
    for shown in (
        repr(settings),
        str(settings),
        settings.model_dump_json(),
        repr(settings.model_dump()),
        str(settings.model_dump(mode="json")),
    ):
        assert not _leaks(shown), shown
    assert settings.dsn is not None
    assert settings.dsn.get_secret_value() == dsn


@pytest.mark.parametrize(
    ("model", "bad"),
    [
        (RedisStoreSettings, {"namespace": "{x}"}),
        (RedisStoreSettings, {"max_value_bytes": -1}),
        (PostgresStoreSettings, {"db_schema": "public; DROP TABLE adk_runs"}),
        (PostgresStoreSettings, {"pool_size": 0}),
    ],
)
def test_a_refused_setting_does_not_echo_the_dsn(
    model: type[RedisStoreSettings], bad: dict[str, object]
) -> None:
    """The validation error names the bad setting and shows no DSN."""
    with pytest.raises(ValidationError) as caught:
        model(dsn="redis://u:PWa@host/0", **bad)
    message = str(caught.value)
    assert not _leaks(message), message
    assert next(iter(bad)) in message


def test_a_dsn_of_the_wrong_type_is_not_echoed() -> None:
    """Even a refused DSN value is not printed back."""
    with pytest.raises(ValidationError) as caught:
        RedisStoreSettings(dsn=["redis://u:PWa@host/0"])
    assert not _leaks(str(caught.value)), str(caught.value)
