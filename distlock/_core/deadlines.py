"""Deadlines"""

from __future__ import annotations

import math
import random
import time
from typing import Optional

#: The longest lease accepted, in seconds: Redis' PEXPIRE takes a signed 64-bit number of
#: milliseconds, but a year is already far past any sensible lease.
MAX_LEASE = 366 * 24 * 3600.0


def lease_ms(seconds: float) -> int:
    """Seconds to whole milliseconds, rounded up so that a lease never comes out shorter."""
    return max(1, math.ceil(seconds * 1000.0))


class Backoff:
    """How long a waiter that lost a race stays out of the waiting registry.

    A hint wakes a waiter when the lock is released, but under steady contention the releasing
    process often takes the lock again before the woken waiter's try arrives. A waiter that
    keeps answering hints it then loses only costs everyone round trips (the holder's script
    runs queue behind its tries), so after each such loss it sleeps unregistered (no release
    wakes it) for ``first`` seconds, doubling with every further loss up to ``most``, with
    jitter so that several losers do not come back together; then it registers again. A lone
    waiter never loses a race and so never backs off: its handoff stays one hint long.
    """

    __slots__ = ("_next", "_most")

    def __init__(self, first: float = 0.002, most: float = 0.1) -> None:
        self._next = first
        self._most = most

    def lost(self) -> float:
        """The next backoff, in seconds (between half and all of the current step)."""
        step = self._next
        self._next = min(step * 2.0, self._most)
        return step * random.uniform(0.5, 1.0)


class Deadline:
    """A point on ``time.monotonic()``'s clock, or none at all (wait forever)."""

    __slots__ = ("_at",)

    def __init__(self, timeout: Optional[float]) -> None:
        self._at = None if timeout is None else time.monotonic() + timeout

    def remaining(self) -> Optional[float]:
        """Seconds left (never negative), or ``None`` without a deadline."""
        if self._at is None:
            return None
        return max(0.0, self._at - time.monotonic())

    def expired(self) -> bool:
        return self._at is not None and time.monotonic() >= self._at

    def sleep_bound(self, holder: Optional[float], cap: float) -> float:
        """How long a waiter may sleep before it must try again.

        min(time left, the holder's remaining lease in seconds, cap): a lost wake-up or a
        crashed holder then costs at most this long. A holder lease of None, or of 0 or less
        (unknown), counts as no bound.
        """
        bound = cap
        if holder is not None and holder > 0:
            bound = min(bound, holder)
        left = self.remaining()
        if left is not None:
            bound = min(bound, left)
        return bound


def registry_lease_ms(wait_cap: float) -> int:
    """How long a process stays registered as waiting after its last failed try: longer than
    the longest a head waiter sleeps between tries (``wait_cap``), so a live process never drops
    out, and short enough that a dead one stops being woken within seconds."""
    return int((2 * wait_cap + 1) * 1000)





def entry_ms(wait_cap: float, queue_cap_factor: float) -> int:
    """The lease of a waiter's entry (semaphore queue, event waiters), refreshed at every look.

    A waiter looks at least every ``wait_cap * queue_cap_factor`` seconds (the longest sleep of
    a waiter that is not the first of its process); twice that plus a second covers a missed
    beat and a slow round trip. A waiter that died stops counting that long after its last look.
    """
    return lease_ms(2.0 * wait_cap * queue_cap_factor + 1.0)


class Tries:
    """The numbered tries of one wait, and when each refused one was sent (monotonic).

    A release that hands a lock to a waiting process reads what that process' latest refused
    try left in Redis (a hand-off record, or a queue entry), so it runs after that try; its
    message names the try (``number``), and the handed hold is believed from that try's send
    time (docs/safety.rst, "Belief keeps time"). The wait's *latest* refused try would not do:
    a message held up past the handed lease can arrive after a later try that was refused
    because the hold had run out and another took it. Only the latest ``KEEP`` are kept: a
    message naming an older try is believed from nothing (``sent`` gives None), and confirmed.
    """

    KEEP = 16

    def __init__(self) -> None:
        self.number = 0
        self._refused: dict[int, float] = {}

    def next(self) -> int:
        """Number the try about to be sent."""
        self.number += 1
        return self.number

    def refused(self, sent_at: float) -> None:
        """The latest numbered try, sent at ``sent_at``, was refused."""
        self._refused[self.number] = sent_at
        self._refused.pop(self.number - self.KEEP, None)

    def sent(self, number: Optional[int]) -> Optional[float]:
        """When refused try ``number`` was sent; None when it is not one this wait keeps."""
        return None if number is None else self._refused.get(number)

    def believed_from(self, number: Optional[int], lease_ms: float) -> float:
        """When a hold handed after try ``number``, with a lease of ``lease_ms``, is believed
        from: that try's send time; for a try this wait does not keep, a time that leaves it
        believed for nothing (its taker confirms it first)."""
        sent_at = self.sent(number)
        return time.monotonic() - lease_ms / 1000.0 if sent_at is None else sent_at
