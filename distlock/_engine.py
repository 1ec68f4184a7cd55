"""The wait engine for threads: drives ``_waitpolicy.policy`` with blocking I/O.

The only place that subscribes, tries, sleeps and cleans up for a waiting primitive. A
primitive hands it a ``Waiting``: its channel, and how to make one try in each mode (a script
and the decoding of its reply into an outcome from ``_outcomes``). Every way out goes through
one ``finally``: a grant, a timeout, a hint that named the waiter, an exception (a Redis
error, KeyboardInterrupt) and, for an asyncio driver, a cancellation.
"""

from __future__ import annotations

from typing import Any, Optional

import redis

from ._config import settings
from ._logic import Deadline
from ._outcomes import NAMED, TIMED_OUT, Failed, Granted, Outcome
from ._waitpolicy import FIRST, Sleep, policy

__all__ = ["Waiting", "wait"]


class Waiting:
    """What one wait of one primitive supplies to the engine.

    Subclasses set ``channel`` (the pub/sub channel of its hints) and ``ident`` (the waiter's
    id when hints name waiters), and define ``attempt``; the other hooks have defaults.
    """

    channel: str = ""
    ident: Optional[str] = None
    #: a hint is answered by a try that does not register (see ``_waitpolicy``, ``HINTED``)
    answers_hints = False
    #: every waiter sleeps at most the bound, not only its process' first (see ``policy``)
    strict = False

    def attempt(self, mode: str, waiter: Any) -> Outcome:
        """One try in ``mode`` (see ``_waitpolicy``); its decoded outcome. A grant is
        registered (as a hold) before this returns."""
        raise NotImplementedError

    def abandon(self) -> None:
        """Interrupted while waiting, with the server reachable: leave any queue now (one
        round trip; otherwise entries run out by themselves)."""

    def unregister(self) -> None:
        """This process' last waiter on the channel left without a grant."""

    def named(self) -> Any:
        """What the wait returns when a hint named the waiter."""
        return True

    def timed_out(self) -> Any:
        return False


def wait(session: Any, waiting: Waiting, timeout: Optional[float], *, start: str = FIRST) -> Any:
    """Wait as ``waiting`` says, at most ``timeout`` seconds (None: as long as it takes).

    Return what the final outcome means: True for a grant, the value of ``Done``, ``named()``
    or ``timed_out()``; raise the error of ``Failed``. An exception while waiting propagates
    after ``abandon()`` (unless the server could not be reached: the caller's entries then
    run out by themselves).
    """
    deadline = Deadline(timeout)
    steps = policy(deadline, settings().wait_cap, start=start,
                   answers_hints=waiting.answers_hints, strict=waiting.strict)
    # Subscribe before the first try: a hint sent right after it finds us listening. ``join``
    # leaves the queue by itself when it is interrupted; from here on, the ``finally`` does.
    waiter = None
    granted = False
    try:
        waiter = session.join(waiting.channel, deadline.remaining(), ident=waiting.ident)
        step: Any = next(steps)
        while True:
            if type(step) is Sleep:
                hinted = session.sleep(waiter, step.bound, step.limit)
                sent: Any = (hinted, waiter.named)
            elif step.mode == FIRST:
                sent = waiting.attempt(FIRST, waiter)
            else:
                with session.retry_slots:  # a crowd woken at once takes turns
                    sent = waiting.attempt(step.mode, waiter)
            granted = type(sent) is Granted
            try:
                step = steps.send(sent)
            except StopIteration as stop:
                outcome = stop.value
                break
    except BaseException as exc:
        if not isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
            try:
                waiting.abandon()
            except redis.RedisError:
                pass
        raise
    finally:
        if waiter is not None and session.leave(waiter, granted) and not granted:
            waiting.unregister()
    return result(waiting, outcome)


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
