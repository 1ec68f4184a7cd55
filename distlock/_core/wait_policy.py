"""The waiting policy, as a state machine that does no I/O (sans-I/O).

Every primitive waits the same way: subscribe before its first try, try, sleep at most
min(time left, the script's bound, the cap), try again, and leave cleanly on every way out.
The order of those steps, and every decision between them, is here, once: ``policy`` is a
generator that *yields* what to do next, ``Try(mode)`` or ``Sleep(bound, limit)``, and is
*sent* what came of it (an outcome from ``_core.outcomes``, or what woke the sleep). A driver does
the I/O: ``_primitives.engine.wait`` for threads; an asyncio driver awaits the same steps, so the policy
has no second hand-written copy (see docs/how-it-works.rst, "One wait engine").

Try modes, which each primitive maps to its script's arguments:

- ``FIRST``: the primitive's first step, made after subscribing (an event's or barrier's
  join, a condition's release-and-queue); primitives that try once before subscribing (the
  uncontended path of the locks and semaphores) start at ``WAIT`` instead;
- ``WAIT``: a try that (re)registers the caller as waiting;
- ``HINTED``: a try that answers a hint and does not register when it fails (only for
  primitives that ask for it: ``answers_hints``); after such a loss the waiter backs off,
  unregistered, for a short, growing, jittered time (``Backoff``), then registers again;
- ``LAST``: the try at the deadline, which also leaves any queue the caller is in.
"""

from __future__ import annotations

from typing import Any, Generator, Optional, Union

from .deadlines import Backoff, Deadline
from .outcomes import FINAL, NAMED, TIMED_OUT, Busy, Outcome, Pending

__all__ = ["FIRST", "WAIT", "HINTED", "LAST", "Try", "Sleep", "policy", "Step"]

FIRST, WAIT, HINTED, LAST = "first", "wait", "hinted", "last"


class Try:
    """Make one try in ``mode``; send back its outcome."""

    __slots__ = ("mode",)

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __repr__(self) -> str:
        return f"Try({self.mode})"


class Sleep:
    """Sleep on the waiter at most ``bound`` seconds (when it heads its process' queue; see
    ``Dispatcher.sleep``), never past ``limit``; send back ``(hinted, named)``: whether a hint
    ended the sleep, and whether a hint named this waiter."""

    __slots__ = ("bound", "limit")

    def __init__(self, bound: float, limit: Optional[float]) -> None:
        self.bound = bound
        self.limit = limit

    def __repr__(self) -> str:
        return f"Sleep({self.bound:.3f}, {self.limit})"


Step = Union[Try, Sleep]


def policy(deadline: Deadline, cap: float, *, start: str = FIRST, answers_hints: bool = False,
           strict: bool = False) -> Generator[Step, Any, Outcome]:
    """The wait, step by step; return its final outcome: one of ``_core.outcomes.FINAL``, or
    ``TIMED_OUT``, or ``NAMED``.

    ``cap``: the longest sleep between two tries (``Settings.wait_cap``). ``strict``: every
    waiter of the process sleeps at most the bound, not only the head of its queue (a queued
    writer, whose queue entry must be refreshed in time).
    """
    mode = start
    backoff: Optional[Backoff] = None
    while True:
        if mode != FIRST and deadline.expired():
            mode = LAST
        outcome = yield Try(mode)
        if isinstance(outcome, FINAL):
            return outcome
        if not isinstance(outcome, Busy):
            raise TypeError(f"a try returned {outcome!r}, not an outcome")
        if isinstance(outcome, Pending):
            # the deadline does not count: sleep, then make the same try again
            bound = cap if outcome.bound is None else min(cap, max(0.001, outcome.bound))
            hinted, named = yield Sleep(bound, bound)
            if named:
                return NAMED
            continue
        if mode == LAST:
            return TIMED_OUT
        bound = deadline.sleep_bound(outcome.bound, cap)
        left = deadline.remaining()
        if bound <= 0:  # no time left to sleep: straight to the last try
            mode = WAIT if mode == FIRST else mode
            continue
        lost_race = mode == HINTED
        if lost_race:
            # A hint woke us and someone else took it first; this try did not register us, so
            # no release wakes us while we back off.
            if backoff is None:
                backoff = Backoff()
            bound = min(bound, backoff.lost())
        hinted, named = yield Sleep(bound, bound if strict else left)
        if named:
            return NAMED
        if mode == FIRST:
            mode = WAIT
        elif answers_hints:
            mode = HINTED if hinted and not lost_race else WAIT

