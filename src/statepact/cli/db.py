"""``statepact db upgrade|downgrade|current|check``: wraps the Alembic revisions
(``statepact.storage.postgres.migrate``), so they run from an installed wheel
too. The URL comes from ``--url`` (before or after the action), else
``STATEPACT_POSTGRES_URL``, else ``STATEPACT_DATABASE_URL`` (its older name, still
read); a plain ``postgresql://`` URL is run through asyncpg. Errors print one line
(with ``--log-level debug``, the traceback too), and never a password: the URL is
shown redacted, and the password is scrubbed from any message that might echo it.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from statepact.cli._common import POSTGRES_URL_ALIAS, CommandError, environment_url, run_command
from statepact.cli._common import URL_ENV as SERVER_URL_ENV
from statepact.cli._common.logs import add_logging_arguments
from statepact.settings import redact_dsn

__all__ = ["URL_ENV", "add_arguments", "command"]

#: The variable the URL is read from when ``--url`` is not given (then its older name,
#: ``STATEPACT_DATABASE_URL``).
URL_ENV = SERVER_URL_ENV["postgres"]

DESCRIPTION = """\
Apply, undo and inspect statepact's PostgreSQL migrations (the Alembic revisions
shipped with this release; they are recorded in statepact_alembic_version, apart
from an application's own alembic_version). upgrade applies revisions (default:
all, "head"); downgrade undoes them down to a revision ("base" drops every
statepact table); current prints the database's revision; check lists what keeps
the database from matching this release and exits 1 if anything does.
upgrade --sql and downgrade --sql print the SQL instead, for a DBA to review, and
touch no database (no URL needed).
"""


URL_HELP = (
    f"the database (postgresql://user[:password]@host:port/db); default: ${URL_ENV}, else "
    f"${POSTGRES_URL_ALIAS}. Its password is never printed"
)
DEBUG_HELP = "the same as --log-level debug: the full traceback when something fails"
SQL_HELP = {
    "upgrade": "print the SQL to stdout instead of running it (no database is touched); "
    "REVISION may be FROM:TO for a database already at FROM",
    "downgrade": "print the SQL to stdout instead of running it (no database is touched); "
    "REVISION is TO (from this release's head) or FROM:TO",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``statepact db`` and of each of its actions.

    ``--url`` and ``--debug`` are taken before or after ACTION; the actions'
    copies default to ``SUPPRESS`` so that one given before ACTION is kept.
    """
    parser.add_argument("--url", metavar="URL", default=None, help=URL_HELP)
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    actions = parser.add_subparsers(
        dest="db_action",
        metavar="ACTION",
        required=True,
        help="what to do; `statepact db ACTION --help` describes each",
    )
    specs: list[tuple[str, str, str | None, str]] = [
        (
            "upgrade",
            "apply revisions up to REVISION (default: head)",
            "head",
            "the revision to go up to: head (the newest, the default) or a revision id",
        ),
        (
            "downgrade",
            "undo revisions down to REVISION (e.g. base, or -1)",
            None,
            "the revision to go down to: base (no statepact tables left), -1 (one step "
            "back) or a revision id",
        ),
        ("current", "print the revision the database is at", "", ""),
        ("check", "list differences from this release; exit 1 if there are any", "", ""),
    ]
    for name, help_, default, revision_help in specs:
        action = actions.add_parser(name, help=help_, description=help_)
        if default is None:
            action.add_argument("revision", metavar="REVISION", help=revision_help)
        elif default:
            action.add_argument(
                "revision", metavar="REVISION", nargs="?", default=default, help=revision_help
            )
        action.add_argument("--url", metavar="URL", default=argparse.SUPPRESS, help=URL_HELP)
        action.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP
        )
        add_logging_arguments(action)
        if name in ("upgrade", "downgrade"):
            action.add_argument("--sql", action="store_true", help=SQL_HELP[name])


def _scrubbed(message: str, url: str) -> str:
    """``message`` with the URL's password replaced wherever it is quoted (a driver's
    message may echo it), and any URL in it redacted."""
    from urllib.parse import unquote, urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    for secret in {password, unquote(password)} if password else ():
        message = message.replace(secret, "***")
    return redact_dsn(message)


def command(
    args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Run ``statepact db ACTION`` with parsed ``args``; the exit code."""
    stream, errors = out or sys.stdout, err or sys.stderr
    name = f"db {args.db_action}"
    try:
        url: str = args.url or environment_url("postgres") or ""
    except CommandError as exc:
        print(f"statepact {name}: error: {exc}", file=errors)
        return 2
    offline = bool(getattr(args, "sql", False))
    if not url and not offline:
        print(
            f"statepact {name}: error: no database given; pass --url URL or set {URL_ENV} "
            f"(or {POSTGRES_URL_ALIAS}, its older name)",
            file=errors,
        )
        return 2

    where = redact_dsn(url)

    async def body() -> int:
        from statepact.storage.postgres import migrate

        if offline:
            render = migrate.upgrade_sql if args.db_action == "upgrade" else migrate.downgrade_sql
            stream.write(render(args.revision))
            return 0
        if args.db_action == "upgrade":
            await migrate.upgrade(url, args.revision)
            print(f"{where}: at revision {await migrate.current(url) or 'none'}", file=stream)
            return 0
        if args.db_action == "downgrade":
            await migrate.downgrade(url, args.revision)
            print(f"{where}: at revision {await migrate.current(url) or 'none'}", file=stream)
            return 0
        if args.db_action == "current":
            print(await migrate.current(url) or "none", file=stream)
            return 0
        problems = await migrate.check(url)
        for problem in problems:
            print(f"  {problem}", file=stream)
        if problems:
            print(f"{where}: {len(problems)} difference(s) from this release", file=stream)
            return 1
        print(f"{where}: matches this release (revision {migrate.head()})", file=stream)
        return 0

    class _Scrub:
        """stderr with the URL's password replaced, whatever the error message echoes."""

        def write(self, text: str) -> int:
            return errors.write(_scrubbed(text, url))

        def flush(self) -> None:
            errors.flush()

    return run_command(name, body, debug=args.debug, err=_Scrub())  # type: ignore[arg-type]
