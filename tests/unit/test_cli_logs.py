"""The log lines the commands print (``statepact.cli._common.logs``): text and JSON, the
records' fields, tracebacks only at debug, no password, and the root logger put back."""

from __future__ import annotations

import io
import json
import logging

import pytest

from statepact import cli
from statepact.cli._common.logs import command_logging, error_line

log = logging.getLogger("statepact.queue")


def _failure() -> BaseException:
    try:
        raise ValueError("the model returned no JSON")
    except ValueError as exc:
        return exc


def test_text_lines_at_info_name_the_exception_without_its_traceback() -> None:
    out = io.StringIO()
    with command_logging("info", "text", out):
        log.debug("not shown")
        log.info("retried %s", "later", extra={"tenant": "acme"})
        log.warning("task raised", exc_info=_failure())
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(" INFO statepact.queue: retried later")
    assert lines[1].endswith(
        " WARNING statepact.queue: task raised (ValueError: the model returned no JSON)"
    )
    assert "Traceback" not in out.getvalue()


def test_debug_prints_the_traceback() -> None:
    out = io.StringIO()
    with command_logging("debug", "text", out):
        log.debug("shown")
        log.warning("task raised ValueError: the model returned no JSON", exc_info=_failure())
    text = out.getvalue()
    assert " DEBUG statepact.queue: shown" in text
    assert "Traceback (most recent call last)" in text
    assert "(ValueError" not in text  # named in the message already; the traceback follows


def test_json_lines_carry_the_records_fields() -> None:
    out = io.StringIO()
    with command_logging("warning", "json", out):
        log.info("not shown")
        log.warning(
            "queue %r: item dead-lettered",
            "orders",
            extra={"queue": "orders", "tenant": "acme", "item_id": "i1", "attempts": 3},
            exc_info=_failure(),
        )
        print(error_line("statepact worker: error: boom"), file=out)
        trace = "Traceback ...\npostgresql://u:pw@h/d"
        print(error_line("statepact db: error: x", trace), file=out)
    first, second, third = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["level"] == "WARNING" and first["logger"] == "statepact.queue"
    assert first["message"] == "queue 'orders': item dead-lettered"
    assert (first["queue"], first["tenant"], first["item_id"], first["attempts"]) == (
        "orders",
        "acme",
        "i1",
        3,
    )
    assert first["exception"] == "ValueError: the model returned no JSON"
    assert "traceback" not in first
    assert first["time"][10] == "T"  # ISO 8601
    assert second == {**second, "level": "ERROR", "logger": "statepact.cli"}
    assert second["message"] == "statepact worker: error: boom"
    assert third["traceback"] == "Traceback ...\npostgresql://u:***@h/d"
    assert error_line("plain") == "plain"  # outside a command: text
    assert error_line("plain", "Traceback ...\n") == "Traceback ...\nplain"


def test_no_password_is_printed() -> None:
    out = io.StringIO()
    with command_logging("info", "json", out):
        log.warning("lost postgresql://app:Hunter 2xyz@db/app", extra={"dsn": "redis://:pw@h/0"})
    with command_logging("info", "text", out):
        log.warning("lost postgresql://app:Hunter 2xyz@db/app")
    assert "Hunter" not in out.getvalue() and ":pw@" not in out.getvalue()


def test_the_loggers_are_put_back_and_sqlalchemy_stays_quiet() -> None:
    root, alembic = logging.getLogger(), logging.getLogger("alembic")
    before = (root.level, list(root.handlers), alembic.level)
    with command_logging("info", "text", io.StringIO()):
        assert logging.getLogger("sqlalchemy").level == logging.WARNING
        assert logging.getLogger("alembic").level == logging.WARNING
    with command_logging("debug", "text", io.StringIO()):
        assert logging.getLogger("alembic").level == logging.NOTSET  # its lines at debug
    assert (root.level, list(root.handlers), alembic.level) == before


def test_every_command_takes_the_options_and_main_applies_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--log-level error`` on the demo: nothing on stderr; the options follow actions."""
    assert cli.main(["demo", "--seed", "1", "--log-level", "error"]) == 0
    assert capsys.readouterr().err == ""
    args = cli.build_parser().parse_args(["queue", "stats", "--log-format", "json"])
    assert args.log_format == "json"
    args = cli.build_parser().parse_args(["db", "--log-level", "debug", "current"])
    assert args.log_level == "debug"
    args = cli.build_parser().parse_args(["db", "current", "--log-level", "warning"])
    assert args.log_level == "warning"
