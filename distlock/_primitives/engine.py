"""The wait engine: drives ``_core.wait_policy.policy``, as a flow (see ``_core.flow``) for both shells.

The only place that subscribes, tries, sleeps and cleans up for a waiting primitive. A
primitive hands it a ``Waiting``: its channel, and how to make one try in each mode (a flow
that runs a script and decodes its reply into an outcome from ``_core.outcomes``). Every way out
goes through one ``finally``: a grant, a timeout, a hint that named the waiter, an exception
(a Redis error, KeyboardInterrupt) and, in the asyncio shell, a cancellation.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Optional

import redis

from .._core import flow
from .._core.deadlines import Deadline
from .._core.flow import Flow, Join, Leave, Slot, drive
from .._core.outcomes import NAMED, TIMED_OUT, Done, Failed, Granted, Outcome
from .._core.settings import settings
from .._core.wait_policy import FIRST, HINTED, Sleep, policy
from .._session.telemetry import end_wait, start_wait

__all__ = ["Waiting", "wait", "waiting_flow"]


class Waiting:
    """What one wait of one primitive supplies to the engine.

    Subclasses set ``channel`` (the pub/sub channel of its hints) and ``ident`` (the waiter's
    id when hints name waiters), and define ``attempt``; the other hooks have defaults.
    """

    channel: str = ""
    ident: Optional[str] = None
    #: the primitive's meter (``_session.metrics``), and when its first try was sent (monotonic): the
    #: engine records how the wait ended and how long it took from there
    meter: Any = None
    started: float = 0.0
    #: a hint is answered by a try that does not register (see ``_core.wait_policy``, ``HINTED``)
    answers_hints = False
    #: every waiter sleeps at most the bound, not only its process' first (see ``policy``);
    #: read at every sleep, so a wait may turn strict on the way (a lock joining a fair queue)
    strict = False
    #: a hint that names the waiter hands it what it waited for (a fair lock's hand-off): it
    #: leaves its process' queue as a waiter that got it, waking nobody else
    named_grants = False

    def attempt(self, mode: str, waiter: Any) -> Flow[Outcome]:
        """One try in ``mode`` (see ``_core.wait_policy``), a flow; its decoded outcome. A grant is
        registered (as a hold) before it returns."""
        raise NotImplementedError

    #: the session the wait runs in: a wait cut short by a connection error leaves its
    #: queues from there, off the caller's path (see ``waiting_flow``)
    _session: Any = None

    def abandon(self) -> Flow[None]:
        """Interrupted while waiting: leave any queue (one round trip; entries that cannot be
        taken off run out by themselves). A flow, run inline, or after a connection error on
        the session's chores worker (``waiting_flow``)."""
        return
        yield

    def unregister(self) -> Flow[None]:
        """This process' last waiter on the channel left without a grant. A flow."""
        return
        yield

    def named(self) -> Any:
        """What the wait returns when a hint named the waiter."""
        return True

    def claim(self) -> Flow[Any]:
        """``named()`` as a flow: what the wait returns when a hint named the waiter, after
        any round trip it needs first (a lock handed over too long after the waiter's last
        try is confirmed before it is believed: see ``fair.FairWaiting.claim``)."""
        return self.named()
        yield

    def timed_out(self) -> Any:
        return False

    def handed(self, waiter: Any) -> bool:
        """Whether a release of this process handed the lock to this wait (in-process hand-off,
        ``Board.hand``). Read after the waiter left its queue, it is final: a wait that ended
        as the hand-off came still has it, and takes it (``claim``), or, ending with an error,
        gives it back (``give_back``)."""
        return False

    def give_back(self, waiter: Any) -> Flow[None]:
        """Give back the lock a release handed to this wait, which ended with an error. A flow."""
        return
        yield


def wait(session: Any, waiting: Waiting, timeout: Optional[float], *, start: str = FIRST) -> Any:
    """``waiting_flow`` run on a thread's session (blocking)."""
    return drive(waiting_flow(waiting, timeout, start=start), session)


def waiting_flow(waiting: Waiting, timeout: Optional[float], *, start: str = FIRST) -> Flow[Any]:
    """Wait as ``waiting`` says, at most ``timeout`` seconds (None: as long as it takes).

    Return what the final outcome means: True for a grant, the value of ``Done``, ``named()``
    or ``timed_out()``; raise the error of ``Failed``. An exception while waiting propagates
    after ``abandon()``; after a connection error (or a timeout) it propagates at once, and
    ``abandon()`` runs on the session's chores worker: a reply lost on a broken connection
    does not mean the server is gone, and the entries a try made before its reply was lost
    are taken off at once rather than left to run out (nothing waits on a dead server
    meanwhile: the chores worker's round trips are bounded, and it is not the caller).
    """
    deadline = Deadline(timeout)
    started = waiting.started or time.monotonic()
    span = start_wait(waiting.meter)
    steps = policy(deadline, settings().wait_cap, start=start,
                   answers_hints=waiting.answers_hints, strict=waiting.strict)
    # Subscribe before the first try: a hint sent right after it finds us listening. ``join``
    # leaves the queue by itself when it is interrupted; from here on, the ``finally`` does.
    waiter = None
    granted = hinted_grant = False
    outcome: Any = None
    error: Optional[BaseException] = None
    try:
        waiter = yield Join(waiting.channel, deadline.remaining(), waiting.ident)
        step: Any = next(steps)
        while True:
            if type(step) is Sleep:
                hinted = yield flow.Sleep(waiter, step.bound,
                                     step.bound if waiting.strict else step.limit)
                sent: Any = (hinted, waiter.named)
            elif step.mode == FIRST:
                sent = yield from waiting.attempt(FIRST, waiter)
            else:
                yield Slot(True)  # a crowd woken at once takes turns
                try:
                    sent = yield from waiting.attempt(step.mode, waiter)
                finally:
                    yield Slot(False)
                hinted_grant = step.mode == HINTED
            granted = type(sent) is Granted
            try:
                step = steps.send(sent)
            except StopIteration as stop:
                outcome = stop.value
                break
    except BaseException as exc:
        error = exc
        if not isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
            try:
                yield from waiting.abandon()
            except redis.RedisError:
                pass
        elif waiting._session is not None:
            waiting._session.defer(functools.partial(_abandon_later, waiting))
        raise
    finally:
        granted = granted or (outcome is NAMED and (
            waiting.named_grants or (waiter is not None and waiting.handed(waiter))))
        if waiter is not None:
            last = yield Leave(waiter, granted)
            if not granted and outcome is not NAMED and waiting.handed(waiter):
                # a release of this process handed it the lock as the wait ended
                if error is None:
                    outcome, granted = NAMED, True
                else:
                    yield from _give_back(waiting, waiter, error)
            if last and not granted:
                yield from waiting.unregister()
        _record(waiting.meter, span, outcome, started, hinted_grant)
    if outcome is NAMED:
        return (yield from waiting.claim())
    return result(waiting, outcome)


def _give_back(waiting: Waiting, waiter: Any, error: BaseException) -> Flow[None]:
    """The wait ends with ``error``, and a release of this process had just handed it the
    lock: give it back, at once, or after a connection error on the session's chores worker
    (as ``abandon``); what cannot be given back ends with its lease."""
    if isinstance(error, (redis.ConnectionError, redis.TimeoutError)) and waiting._session is not None:
        waiting._session.defer(functools.partial(_give_back_later, waiting, waiter))
        return
    try:
        yield from waiting.give_back(waiter)
    except redis.RedisError:
        pass


def _give_back_later(waiting: Waiting, waiter: Any) -> None:
    try:
        drive(waiting.give_back(waiter), waiting._session)
    except redis.RedisError:
        pass


def _record(meter: Any, span: Any, outcome: Any, started: float, hinted_grant: bool) -> None:
    """How a wait ended, into the primitive's metrics (and its span, where the process
    traces): ``None`` (an exception) is an error; a grant, a named hint or a truthy ``Done``
    is acquired; the rest timed out. A broken barrier (``Failed``) is an error."""
    if meter is None:
        return
    waited = time.monotonic() - started
    kind = type(outcome)
    if kind is Granted or outcome is NAMED or (
            kind is Done and outcome.value is not False and outcome.value is not None):
        label = "acquired"  # a barrier's index 0 included
    elif outcome is None or kind is Failed:
        label = "error"
    else:
        label = "timeout"
    hinted = label == "acquired" and (hinted_grant or outcome is NAMED)
    meter.acquired(label, waited, waited=True, hinted=hinted)
    end_wait(span, label, waited, outcome.token if kind is Granted else None)


def result(waiting: Waiting, outcome: Outcome) -> Any:
    """What a wait's final ``outcome`` returns (or raises); shared by every driver."""
    if type(outcome) is Granted:
        return True
    if outcome is TIMED_OUT:
        return waiting.timed_out()
    if outcome is NAMED:
        return waiting.named()
    if type(outcome) is Failed:
        raise outcome.error
    return outcome.value  # type: ignore[union-attr]  # Done


def _abandon_later(waiting: Waiting) -> None:
    """``waiting.abandon()``, on the session's chores worker, after the wait ended with a
    connection error; if the server cannot be reached now either, the entries run out."""
    try:
        drive(waiting.abandon(), waiting._session)
    except redis.RedisError:
        pass
