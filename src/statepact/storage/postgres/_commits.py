"""``PostgresBackend``'s commits: each one call of the ``statepact_commit`` function,
several that touch no common key sent together in one statement, and the function's
refusals read back as ``Refusal`` verdicts.

A commit that one of this process's, landed while it waited, dooms is answered
without a send (``_predict.LocalOrder``). A shared statement that any of its commits
makes the server refuse applies none of them: each is sent again alone, marked as a
resend, since an earlier attempt of the shared statement may have applied it
(docs/backings.md, "The commit function").
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

from statepact._limits import MAX_BATCH_BYTES, MAX_SHARED_COMMITS
from statepact._shared import SharedRoundTrips
from statepact.errors import DeadlockError
from statepact.storage.postgres._client import detail_of, is_rolled_back, sqlstate_of
from statepact.storage.postgres._direct import Prepared, Statements
from statepact.storage.postgres._predict import LocalOrder
from statepact.storage.postgres._sql import LOCK_NOT_AVAILABLE
from statepact.storage.postgres._sql.tx import TxStatements
from statepact.tx import CommitRequest, CommitResult, Isolation, Refusal

__all__ = ["Commits", "refusal_of"]

T = TypeVar("T")

#: Runs one piece of work on a connection, with the backend's failover (``_run``).
Run = Callable[[Callable[[Statements], Awaitable[T]]], Awaitable[T]]

# The function's own SQLSTATEs (class SP, revision statepact_0004): what it refused.
_REFUSED_KINDS: dict[str, Any] = {"SPF01": "fenced", "SPI01": "idempotency", "SPC01": "write"}
_DEADLOCK = (
    "PostgreSQL reported a deadlock inside the commit; nothing was applied, retry the transaction"
)


def refusal_of(exc: BaseException) -> Refusal | None:
    """The verdict for a commit the function refused on purpose, else ``None``."""
    state = sqlstate_of(exc)
    if state is None or not state.startswith("SP"):
        return None
    detail = detail_of(exc)
    resource = detail.get("resource")
    key = detail.get("key")
    if state == "SPF01":
        return Refusal(
            "fenced", str(resource), seen=int(detail["token"]), latest=int(detail["highest"])
        )
    if state == "SPI01":
        return Refusal("idempotency", key=str(key))
    if state == "SPC01":
        return Refusal(
            "write", resource, key, latest=detail.get("latest"), taken_at=detail.get("taken_at")
        )
    if state == "SPC02":
        return Refusal("read", resource, key, seen=detail.get("seen"), latest=detail.get("latest"))
    return Refusal(
        "other",
        reason=f"idempotency record {key!r} was removed while the commit ran (SQLSTATE "
        f"{state}); retry the transaction",
    )


def _request_json(request: CommitRequest) -> dict[str, Any]:
    """The commit as the ``statepact_commit`` function reads it (writes and reads sorted)."""
    fencing = request.fencing
    snapshot = request.snapshot
    return {
        "txn_id": request.txn_id,
        "isolation": request.isolation.value,
        # None: the transaction read nothing, its snapshot is the commit point.
        "snapshot": None if snapshot is None else snapshot.token,
        "taken_at": None if snapshot is None else snapshot.sequence,
        "now": request.now.isoformat(),
        "writes": [[w.resource, w.key, w.data] for w in request.writes],
        # Only serializable validates reads: do not ship them otherwise.
        "reads": (
            [[r.resource, r.key, r.version] for r in request.reads]
            if request.isolation is Isolation.SERIALIZABLE
            else []
        ),
        "idempotency_key": request.idempotency_key,
        "fingerprint": request.fingerprint,
        "fencing": None if fencing is None else [fencing.resource, fencing.token],
    }


class _Pending:
    """A commit waiting to be sent: its request, every key it touches (two commits of one
    statement share none), and the event it was handed over at (``LocalOrder``). Its
    text, the request as the function reads it, is made when it is first needed: most
    commits on a hot key are refused before they are sent."""

    __slots__ = ("_text", "event", "keys", "request")

    def __init__(self, request: CommitRequest, event: int) -> None:
        keys: list[Hashable] = [(w.resource, w.key) for w in request.writes]
        keys += [(r.resource, r.key) for r in request.reads]
        if request.idempotency_key is not None:
            keys.append(("idempotency", request.idempotency_key))
        self.request = request
        self.keys = tuple(keys)
        self.event = event
        self._text: str | None = None

    def text(self, *, resend: bool = False) -> str:
        """The request as JSON text; ``resend``: marked as one that may have been applied."""
        if resend:
            return json.dumps({**_request_json(self.request), "resend": True})
        if self._text is None:
            self._text = json.dumps(_request_json(self.request))
        return self._text


def _commit_result(reply: Any) -> CommitResult:
    return CommitResult(int(reply["version"]), replayed=bool(reply["replayed"]))


class Commits:
    """Sends one backend's commits (alone or together) and keeps its ``LocalOrder``.

    ``sql`` is the backend's prepared statements; ``run(work)`` is the backend's: one
    piece of work on a connection, sent again after a connection error (safe here: a
    resend finds its first attempt).
    """

    def __init__(self, sql: TxStatements[Prepared], run: Run[Any], order: LocalOrder) -> None:
        self._sql = sql
        self._run = run
        self.order = order
        self._shared: SharedRoundTrips[_Pending, CommitResult | Refusal | None] = SharedRoundTrips(
            lambda pending: self._alone(pending, resend=False),
            self._together,
            keys=lambda pending: pending.keys,
            size=lambda pending: len(pending.text()),
            max_items=MAX_SHARED_COMMITS,
            max_bytes=MAX_BATCH_BYTES,
            name="statepact-commits",
            # A commit that one of this process's, landed while it waited, dooms.
            refused=lambda pending: self.order.refusal(pending.request, pending.event),
        )

    async def commit(self, request: CommitRequest) -> CommitResult | Refusal:
        refusal = self.order.refusal(request)
        if refusal is not None:
            return refusal  # what the server would answer (LocalOrder)
        pending = _Pending(request, self.order.hand_over(request))
        # A commit of this process that lands while this one waits may doom it: the shared
        # round trips then answer it with its refusal, unsent (refused=, asked of every
        # waiting commit as each batch is formed, just before it is sent).
        verdict = await self._shared.send(pending)
        if verdict is None:
            # Not applied with the others (one of them was refused): alone, as a resend,
            # since an earlier attempt of the shared statement may have applied it.
            verdict = await self._alone(pending, resend=True)
        return verdict

    def _landed(self, pending: _Pending, result: CommitResult) -> CommitResult:
        """Note a commit's result for ``LocalOrder`` (by its sender, before the next commit
        of its keys is sent); a replay wrote nothing now, its writes are older."""
        if not result.replayed:
            self.order.committed(pending.event, pending.request, result.version)
        return result

    async def _together(self, commits: list[_Pending]) -> list[CommitResult | Refusal | None]:
        """Several commits in one statement (one server transaction; no key in common), in
        the order of their first key, so that two such statements of two processes lock
        single-key commits in one order. A refusal of any of them (a conflict, a stale
        fence, a deadlock, a row another session holds) applies none: each caller then
        sends its own alone (None), where it may wait for its locks. (Those a landed commit
        of this process dooms never get here: the batch was formed without them.)"""
        answers: list[CommitResult | Refusal | None] = [None] * len(commits)
        order = sorted(range(len(commits)), key=lambda n: commits[n].keys[:1])
        attempts = 0

        async def work(conn: Statements) -> list[CommitResult | Refusal | None]:
            nonlocal attempts
            attempts += 1
            requests = [commits[n].text(resend=attempts > 1) for n in order]
            try:
                rows = (await conn.execute(self._sql.commit_many, {"requests": requests})).all()
            except Exception as exc:
                if (
                    refusal_of(exc) is not None
                    or is_rolled_back(exc)
                    or sqlstate_of(exc) == LOCK_NOT_AVAILABLE
                ):
                    return answers  # the others None: each sent alone
                raise
            landed = list(answers)
            for place, reply in rows:
                n = order[place - 1]
                landed[n] = self._landed(commits[n], _commit_result(reply))
            return landed

        result: list[CommitResult | Refusal | None] = await self._run(work)
        return result

    async def _alone(self, pending: _Pending, *, resend: bool) -> CommitResult | Refusal:
        """One commit alone, one call of the function. ``resend``: it may have been applied
        already (an earlier attempt, or a shared statement): the function looks for it."""
        attempts = 1 if resend else 0

        async def work(conn: Statements) -> CommitResult | Refusal:
            nonlocal attempts
            attempts += 1
            # A second attempt may meet its first one applied (docs/backings.md, "The
            # commit function"): it says so, and the function looks for it.
            sent = pending.text(resend=attempts > 1)
            try:
                reply = (await conn.execute(self._sql.commit, {"request": sent})).scalar_one()
            except Exception as exc:
                refusal = refusal_of(exc)
                if refusal is None:
                    raise
                return refusal
            return self._landed(pending, _commit_result(reply))

        try:
            verdict: CommitResult | Refusal = await self._run(work)
        except DeadlockError:
            return Refusal("other", reason=_DEADLOCK)
        return verdict
