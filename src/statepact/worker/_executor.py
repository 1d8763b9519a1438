"""The executor: one object per claimed lease, running its handler, heartbeat and settle.

An :class:`Executor` is made for each lease the claimer gets and is its own
identity (never the item id: a worker may hold two leases of one item, the first
lapsed and reaped, the second just claimed; the second cuts the first). Its
handler runs in the executor's own task; the heartbeat is a timer beside it that
starts a task only when a beat is due, and the settle waits for a beat in
flight, so each lease has at most one queue call in flight. When the handler
ends, :func:`decide` maps what it did (returned, raised, was cut) to one
:data:`Outcome`, and the completer carries it out.

The worker cuts a handler short for a reason (:class:`Cut`): the lease was lost
(settle nothing) or the shutdown grace ran out (release). A timeout, an
operator's cancel or a snooze is one more ``Cut`` member or one more branch of
``decide``, not another path through the executor. See docs/worker.md, "What
settles an item" and "The parts". This module must never settle a lease it lost,
settle one twice, or read time but through the runtime's clock and the loop.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass

from statepact._cancel import finish
from statepact.errors import LeaseLostError
from statepact.models import WorkItem
from statepact.worker._completer import Completer
from statepact.worker._in_tx import InTransaction, TxState
from statepact.worker._job import DoNotRetry, Handler, Job, Retry, Snooze, describe
from statepact.worker._runtime import Runtime

__all__ = [
    "Ack",
    "Cancelled",
    "Completed",
    "Cut",
    "Executor",
    "Fail",
    "Nothing",
    "Outcome",
    "Release",
    "decide",
]

logger = logging.getLogger("statepact.worker")


class Cut(enum.Enum):
    """Why the worker cancelled a running handler (the value is the cancel message)."""

    LOST = "the lease was lost"
    SHUTDOWN = "the grace period is over"
    TIMEOUT = "the handler's timeout passed"
    CANCEL = "an operator cancelled the item"


@dataclass(frozen=True, slots=True)
class Ack:
    """The handler returned: ack the item."""


@dataclass(frozen=True, slots=True)
class Fail:
    """Fail the item with ``error``: retried (after ``delay``, else the backoff) or dead."""

    error: str
    retryable: bool
    delay: float | None = None


@dataclass(frozen=True, slots=True)
class Release:
    """Give the item back, due after ``delay`` (``None``: now); ``count_attempt`` keeps the
    attempt (shutdown: an item that always hangs still reaches the dead letter), else it is
    given back (a snooze, or a handler that never began)."""

    count_attempt: bool
    delay: float | None = None


@dataclass(frozen=True, slots=True)
class Cancelled:
    """An operator cancelled the item: its lease is void; settle nothing."""

    reason: str


@dataclass(frozen=True, slots=True)
class Completed:
    """The handler's own transaction committed the ack (``job.complete_in``): send nothing."""


@dataclass(frozen=True, slots=True)
class Nothing:
    """Settle nothing: the lease is not this worker's any more, for ``reason``."""

    reason: str


Outcome = Ack | Cancelled | Completed | Fail | Release | Nothing
_ACK = Ack()
_COMPLETED = Completed()
_RELEASE = Release(count_attempt=True)
_GIVE_BACK = Release(count_attempt=False)
_CANCELLED = "CancelledError: the handler was cancelled"
_ROLLED_BACK = "the transaction job.complete_in joined was rolled back"
_LEFT_OPEN = (
    "the handler returned with the transaction job.complete_in joined still open; commit "
    "it before returning"
)


def decide(
    raised: BaseException | None,
    cut: Cut | None,
    lost: str | None,
    tx: TxState = TxState.NONE,
    timeout: float | None = None,
) -> Outcome:
    """What settles the item, from what the handler raised (``None``: it returned), why the
    worker cut it short (``None``: it did not), why the lease is lost (``None``: it is not)
    and what became of the transaction ``job.complete_in`` joined (``tx``).
    A committed completion settles nothing more (a connection's commit counts once the
    handler returned: one the server refused raised in the handler); a lost lease settles
    nothing; a handler cut at shutdown is released whatever its cancellation raised;
    KeyboardInterrupt and SystemExit release the item and go on; a completion rolled back
    or left open is a failure. A release at shutdown keeps the attempt; a handler cut at
    its ``timeout`` fails the attempt; one cut by an operator's cancel settles nothing."""
    if tx is TxState.COMMITTED or (tx is TxState.COMMITTING and raised is None):
        return _COMPLETED
    if cut is Cut.CANCEL:
        return Cancelled(lost or Cut.CANCEL.value)
    if lost is not None:
        return Nothing(lost)
    if cut is Cut.SHUTDOWN:
        return _RELEASE
    if cut is Cut.TIMEOUT:
        return Fail(f"TimeoutError: the handler timed out after {timeout or 0:g} s", True)
    if raised is None:
        if tx is TxState.ROLLED_BACK:
            return Fail(_ROLLED_BACK, retryable=True)
        if tx is TxState.PENDING:
            return Fail(_LEFT_OPEN, retryable=True)
        return _ACK
    if isinstance(raised, Retry):
        return Fail(describe(raised), retryable=True, delay=raised.delay)
    if isinstance(raised, Snooze):
        return Release(count_attempt=False, delay=raised.seconds)
    if isinstance(raised, DoNotRetry):
        return Fail(describe(raised), retryable=False)
    if isinstance(raised, asyncio.CancelledError):
        return Fail(_CANCELLED, retryable=True)
    if isinstance(raised, KeyboardInterrupt | SystemExit):
        return _RELEASE
    return Fail(describe(raised), retryable=True)


class Executor:
    """One claimed lease: its handler (or the reason it has none), heartbeat and settle."""

    __slots__ = (
        "_beat",
        "_cancelled",
        "_completer",
        "_cut",
        "_deadline",
        "_deadline_passed",
        "_handler",
        "_holding",
        "_in_handler",
        "_in_tx",
        "_lost",
        "_rt",
        "_settling",
        "_shutdown",
        "_timeout",
        "_timer",
        "job",
        "task",
    )

    def __init__(
        self,
        rt: Runtime,
        completer: Completer,
        job: Job,
        handler: Handler | str,
        timeout: float | None = None,
    ) -> None:
        self._rt = rt
        self._completer = completer
        self.job = job
        # The handler, or why there is none (the item is dead-lettered, naming it).
        self._handler = handler
        self.task: asyncio.Task[None] | None = None
        # True while the handler runs in ``task``: only then does a cut reach it.
        self._in_handler = False
        # The cut sent to the handler (once at most), and why the lease is lost.
        self._cut: Cut | None = None
        self._lost: str | None = None
        # Set once the shutdown grace is over: a handler not begun yet never begins.
        self._shutdown = False
        # Set once a settle has begun: never a second one.
        self._settling = False
        # The next heartbeat's timer, and the heartbeat in flight.
        self._timer: asyncio.Handle | None = None
        self._beat: asyncio.Task[None] | None = None
        # No heartbeat while the ack waits in the handler's transaction (job.complete_in).
        self._holding = False
        self._in_tx = InTransaction(self._hold_beats, self._resume_beats)
        # The handler's deadline (seconds from its start; None: none) and its timer; past
        # it, no more heartbeats. Set when an operator cancelled the item.
        self._timeout = timeout
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_passed = False
        self._cancelled = False
        job.context = rt.context
        job._complete = self._complete_in

    def start(self) -> None:
        """Count this lease in flight and run it in a task of its own. A lease of the same
        item this worker still runs has lapsed (the queue leased the item again): it is lost."""
        rt = self._rt
        item = self.job.lease.item
        key = (item.tenant, item.item_id)
        older = rt.newest.get(key)
        if older is not None:
            older.lose("the item was claimed again by this worker: this lease had lapsed")
        rt.newest[key] = self
        rt.running.add(self)
        self.task = asyncio.create_task(self._run(), name=f"statepact-item-{item.item_id}")

    def lose(self, reason: str) -> None:
        """The lease is not this worker's any more: cut the handler; settle nothing."""
        if self._lost is None:
            self._lost = reason
        self._send_cut(Cut.LOST)

    def cancel(self, token: int) -> bool:
        """An operator cancelled this item while leased with ``token``: if that is this lease
        (or a newer token of it than this worker has heard of), cut the handler and settle
        nothing; ``False`` when the notice is about an older lease."""
        if token < self.job.lease.token or self._settling:
            return False
        self._cancelled = True
        if self._lost is None:
            self._lost = f"cancelled by an operator (lease token {token})"
        self._send_cut(Cut.CANCEL)
        return True

    def abandon(self) -> None:
        """The shutdown grace is over: cut the handler, if it still runs (or keep it from
        beginning); release the item."""
        self._shutdown = True
        self._send_cut(Cut.SHUTDOWN)

    def _send_cut(self, cut: Cut) -> None:
        if self._in_handler and self._cut is None and self.task is not None:
            self._cut = cut
            self.task.cancel(cut.value)

    # -- the item's task -------------------------------------------------------------------

    async def _run(self) -> None:
        job = self.job
        rt = self._rt
        try:
            handler = self._handler
            if isinstance(handler, str):
                self._settling = True
                logger.error(
                    "worker %s: item %r dead-lettered: %s",
                    rt.worker_id,
                    job.item.item_id,
                    handler,
                    extra=rt.fields(job.item, job.task),
                )
                await finish(self._completer.fail(job, handler, retryable=False))
                return
            if self._lost is not None or self._shutdown:  # stopped before it began
                self._settling = True
                early = Cut.CANCEL if self._cancelled else Cut.SHUTDOWN
                outcome = decide(None, early, self._lost)
                await self._settle(_GIVE_BACK if outcome is _RELEASE else outcome, None)
                return
            rt.hooks.call("started", job)
            raised = await self._handle(handler)
            self._settling = True
            why = Cut.CANCEL if self._cancelled else self._cut
            outcome = decide(raised, why, self._lost, self._in_tx.state, self._timeout)
            await self._settle(outcome, raised)
            if isinstance(raised, KeyboardInterrupt | SystemExit):
                raise raised  # the item is released; the process is on its way out
        except asyncio.CancelledError:
            # Cancelled from outside (the loop shutting down, run() cancelled): the handler is
            # gone with it, the item is given back; finish() keeps the release from being cut.
            if not self._settling:
                self._settling = True
                await finish(self._completer.release(job, count_attempt=True))
            raise
        except Exception as exc:  # a bug here must not leave the slot taken
            logger.exception(
                "worker %s: running item %r failed: %s",
                rt.worker_id,
                job.item.item_id,
                exc,
                extra=rt.fields(job.item, job.task),
            )
        finally:
            self._in_tx.detach()
            job._complete = None
            rt.running.discard(self)
            item = job.lease.item
            key = (item.tenant, item.item_id)
            if rt.newest.get(key) is self:
                del rt.newest[key]
            rt.slot_freed.set()

    async def _handle(self, handler: Handler) -> BaseException | None:
        """Run ``handler`` in this task, heartbeating beside it; what it raised, or ``None``.

        A cut of the worker's own is answered as the ``CancelledError`` the handler raised,
        as is one the handler raised of itself; any other (this task cancelled from
        outside) propagates. A heartbeat in flight when the handler ends is waited for:
        the settle needs its token, or learns from it that the lease was lost.
        """
        task = self.task
        assert task is not None
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._rt.settings.heartbeat_every, self._beat_due)
        if self._timeout is not None:
            self._deadline = loop.call_later(self._timeout, self._time_up)
        self._in_handler = True
        try:
            await handler(self.job)
        except asyncio.CancelledError as exc:
            if task.cancelling() > (self._cut is not None):
                raise  # from outside
            return exc
        except BaseException as exc:  # a user's BaseException too: the item is still settled
            return exc
        finally:
            self._in_handler = False
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            if self._cut is not None:
                task.uncancel()  # the worker's own cut, answered here
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._beat is not None:
                await finish(self._beat)
        return None

    async def _settle(self, outcome: Outcome, raised: BaseException | None) -> None:
        """Carry ``outcome`` out through the completer. A fail or release, once sent, runs to
        its end (finish); an ack is handed to the completer's task, which nothing here cuts."""
        job = self.job
        completer = self._completer
        rt = self._rt
        if outcome is _ACK:
            completer.ack(job)
        elif isinstance(outcome, Completed):
            done = self._in_tx.item
            assert done is not None
            if raised is not None:
                logger.warning(
                    "worker %s: task %r of item %r raised %s after its transaction completed "
                    "the item",
                    rt.worker_id,
                    job.task,
                    job.item.item_id,
                    describe(raised),
                    extra=rt.fields(job.item, job.task),
                )
            rt.hooks.call("succeeded", job, done)
        elif isinstance(outcome, Fail):
            if raised is not None and not isinstance(
                raised, Retry | DoNotRetry | asyncio.CancelledError
            ):
                logger.warning(
                    "worker %s: task %r of item %r raised %s",
                    rt.worker_id,
                    job.task,
                    job.item.item_id,
                    outcome.error,
                    exc_info=raised,
                    extra=rt.fields(job.item, job.task),
                )
            elif raised is None:
                logger.warning(
                    "worker %s: task %r of item %r: %s",
                    rt.worker_id,
                    job.task,
                    job.item.item_id,
                    outcome.error,
                    extra=rt.fields(job.item, job.task),
                )
            await finish(
                completer.fail(job, outcome.error, retryable=outcome.retryable, delay=outcome.delay)
            )
        elif isinstance(outcome, Release):
            await finish(
                completer.release(job, count_attempt=outcome.count_attempt, delay=outcome.delay)
            )
        elif isinstance(outcome, Cancelled):
            logger.info(
                "worker %s: item %r was cancelled while its handler ran (task %r); nothing settled",
                rt.worker_id,
                job.item.item_id,
                job.task,
                extra=rt.fields(job.item, job.task),
            )
            rt.hooks.call("cancelled", job, outcome.reason)
        elif isinstance(outcome, Nothing):
            completer.lost(job, outcome.reason)

    # -- the deadline ---------------------------------------------------------------------

    def _time_up(self) -> None:
        """The handler's timeout passed: no more heartbeats; cut it (the attempt fails)."""
        self._deadline = None
        if not self._in_handler:
            return
        self._deadline_passed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        rt = self._rt
        logger.warning(
            "worker %s: task %r of item %r timed out after %g s; cancelling it",
            rt.worker_id,
            self.job.task,
            self.job.item.item_id,
            self._timeout,
            extra=rt.fields(self.job.item, self.job.task),
        )
        self._send_cut(Cut.TIMEOUT)

    # -- job.complete_in ------------------------------------------------------------------

    async def _complete_in(self, session: object) -> WorkItem:
        if not self._in_handler:
            raise RuntimeError("job.complete_in: called after the handler returned")
        return await self._in_tx.complete(self._rt.queue, lambda: self.job.lease, session)

    async def _hold_beats(self) -> None:
        """No more heartbeats until :meth:`_resume_beats`; the one in flight is waited for
        (the ack needs its token)."""
        self._holding = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._beat is not None:
            await finish(self._beat)
        if self._lost is not None:
            raise LeaseLostError(
                f"job.complete_in: the lease of item {self.job.item.item_id!r} is lost: "
                f"{self._lost}",
                item_id=self.job.item.item_id,
            )

    def _resume_beats(self) -> None:
        """The transaction rolled back (or the ack failed): beat again now, the lease may be
        near its end."""
        self._holding = False
        if self._beating() and self._timer is None and self._beat is None:
            self._timer = asyncio.get_running_loop().call_soon(self._beat_due)

    # -- the heartbeat ---------------------------------------------------------------------

    def _beating(self) -> bool:
        """Whether heartbeats go on: the handler runs, its ack is not held in a transaction,
        and its deadline has not passed."""
        return self._in_handler and not self._holding and not self._deadline_passed

    def _beat_due(self) -> None:
        """The heartbeat timer: a beat (in a task of its own) while the handler runs."""
        self._timer = None
        if self._beating() and self._beat is None:
            self._beat = asyncio.get_running_loop().create_task(
                self._heartbeat(), name=f"statepact-beat-{self.job.item.item_id}"
            )

    async def _heartbeat(self) -> None:
        """One heartbeat (or the finding that the lease expired); a lost lease cuts the
        handler short. The next beat is due ``heartbeat_every`` after this one ends."""
        rt = self._rt
        job = self.job
        try:
            lost = rt.expired(job.lease)
            if lost is None:
                try:
                    await finish(self._renew())
                except LeaseLostError as exc:
                    lost = f"heartbeat refused: {exc}"
                except Exception as exc:
                    # The server may be back before the lease runs out; the expiry decides.
                    logger.warning(
                        "worker %s: heartbeat of item %r failed: %s",
                        rt.worker_id,
                        job.item.item_id,
                        describe(exc),
                        extra=rt.fields(job.item, job.task),
                    )
                else:
                    rt.hooks.call("renewed", job)
            if lost is not None:
                self.lose(lost)
            elif self._beating():
                self._timer = asyncio.get_running_loop().call_later(
                    rt.settings.heartbeat_every, self._beat_due
                )
        finally:
            self._beat = None

    async def _renew(self) -> None:
        # Runs to its end under finish(): the new token is kept even if the caller is cancelled.
        self.job.lease = await self._rt.queue.heartbeat(self.job.lease)
