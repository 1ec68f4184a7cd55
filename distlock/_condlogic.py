"""DistCondition's rules that need no I/O: key names, argument checks, reply codes, repr.

Shared by the sync shell (``_condition.py``) and any future asyncio twin. Nothing here talks to
Redis, starts a thread or reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

from ._logic import Keys, check_acquire_args

__all__ = [
    "CondKeys",
    "check_wait_timeout",
    "notify_count",
    "notify_arg",
    "cond_repr",
    "WAIT_QUEUED",
    "WAIT_LOCK_LOST",
    "LEAVE_NOTIFIED",
    "LEAVE_NOT_NOTIFIED",
]


# --- key names ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CondKeys:
    """Keys and channel of one condition.

    They are sub-keys of ``base``: the lock's :class:`Keys` when the lock is a Dist lock (so the
    condition shares the lock's hash tag and cluster slot, and one script can release the lock
    and join the queue), else the condition's own. The condition's name comes last, after a
    one-letter kind, so two conditions (or two kinds) never share a key, and the ``cond:`` part
    keeps them apart from the lock's own keys (``<tag>``, ``<tag>:fence``, ``<tag>:wake``).

    - ``queue``: sorted set, waiter id -> arrival (server clock, µs, strictly increasing): the
      waiters no ``notify`` has picked yet, oldest first;
    - ``leases``: sorted set, waiter id -> lease deadline (server clock, ms), for the same
      waiters; ``notify`` drops the expired ones (a process that died while waiting). A waiter
      that ``notify`` picked is in neither key any more: that is how it knows;
    - ``channel``: pub/sub, ``=id1,id2`` hints naming the waiters a ``notify`` picked.

    Both keys expire with the last lease in them, so dead waiters leave nothing for good.
    """

    queue: str
    leases: str
    channel: str

    @classmethod
    def of(cls, base: Keys, name: str) -> CondKeys:
        return cls(
            queue=base.sub("cond:q:" + name),
            leases=base.sub("cond:l:" + name),
            channel=base.sub("cond:w:" + name),
        )

    @property
    def state(self) -> Tuple[str, str]:
        """The data keys, in the order every ``cond_*`` script takes them."""
        return (self.queue, self.leases)


# --- argument checks ------------------------------------------------------------------------

def check_wait_timeout(timeout: object) -> Optional[float]:
    """``wait(timeout)`` as :mod:`threading` reads it: None waits for ever, a positive number
    waits that long, anything else (zero, negative, NaN) does not wait at all.

    Return None or the seconds (0.0 for "do not wait"). A value ``threading`` rejects raises
    the same error: TypeError from the comparison with 0 for a non-number, OverflowError (from
    CPython's own lock code) for a timeout too large to wait on.
    """
    if timeout is None:
        return None
    if timeout > 0:  # type: ignore[operator]  # TypeError for non-numbers, as threading
        _blocking, seconds = check_acquire_args(True, timeout)
        return seconds
    return 0.0


#: More waiters than any queue holds: a larger ``n`` is "all of them".
_ALL = 1 << 31


def notify_count(n: object) -> Optional[int]:
    """How many waiters ``notify(n)`` wakes: 0 (none), a positive int, or None (all).

    :mod:`threading` loops ``while waiters and n > 0: ...; n -= 1``, so a non-number raises
    TypeError, zero, negatives and NaN wake none, a fraction wakes ``ceil(n)`` and infinity
    wakes all.
    """
    if not n > 0:  # type: ignore[operator]  # TypeError for non-numbers, as threading
        return 0
    if isinstance(n, float):
        if math.isinf(n):
            return None
        n = math.ceil(n)
    count = int(n)  # type: ignore[call-overload]
    return None if count >= _ALL else count


def notify_arg(count: Optional[int]) -> int:
    """``notify_count`` as the notify script takes it: -1 for all."""
    return -1 if count is None else count


# --- reply codes ----------------------------------------------------------------------------

#: cond_wait: queued (and the lock, if one was given, released)
WAIT_QUEUED = 0
#: cond_wait: the lock's hold is gone or someone else's; nothing changed
WAIT_LOCK_LOST = -1

#: cond_leave: no longer queued: a notify picked the waiter (or its entry was lost with the
#: server's data or its lapsed lease, where waking is the safe answer)
LEAVE_NOTIFIED = 1
#: cond_leave: not notified (still queued when looking; off the queue when leaving)
LEAVE_NOT_NOTIFIED = 0


# --- repr -----------------------------------------------------------------------------------

def cond_repr(lock: object, waiting: int) -> str:
    """``<DistCondition(<lock>, n)>``, the shape of ``threading.Condition``'s repr."""
    return f"<DistCondition({lock}, {waiting})>"
