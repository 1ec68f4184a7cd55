"""Reply codes of the scripts, and the payloads of the hints they publish"""

from __future__ import annotations

from typing import Any, Optional, Set, Tuple

#: release script: the hold was not (or no longer) ours, or its token changed.
RELEASE_LOST = -1





#: cond_wait: queued (and the lock, if one was given, released)
WAIT_QUEUED = 0


#: cond_wait: the lock's hold is gone or someone else's; nothing changed
WAIT_LOCK_LOST = -1


#: cond_leave: no longer queued: a notify picked the waiter (or its entry was lost with the
#: server's data or its lapsed lease, where waking is the safe answer)
LEAVE_NOTIFIED = 1


#: cond_leave: not notified (still queued when looking; off the queue when leaving)
LEAVE_NOT_NOTIFIED = 0





#: sem_acquire: the semaphore is in use with another value (nothing changed)
SEM_MISMATCH = 0


#: sem_release: a bounded semaphore would go above its value (nothing changed)
REL_TOO_MANY = -1


#: sem_release: the semaphore is in use with another value (nothing changed)
REL_MISMATCH = -2


#: sem_release: the count would go above ``MAX_PERMITS`` (nothing changed)
REL_OVERFLOW = -3


#: sem_release: no semaphore here, so the release would make one, and the caller sent no other
#: kinds' keys to check the name against (it released its own permits only): nothing changed;
#: send it again with them
REL_UNCHECKED = -4


TOO_MANY_RELEASES = "Semaphore released too many times"


COUNT_OVERFLOW = ("semaphore count would go above 2**53 - 1, the largest count Redis keeps "
                  "exactly")


def release_lost(lost: int, name: str) -> str:
    return (f"{lost} of the permits released on semaphore {name!r} had been lost (their lease "
            "ran out) and had come back already; the rest of the release was done")


def value_mismatch(name: str, stored: object, ours: int) -> str:
    return (f"semaphore {name!r} was created with value {stored}, not {ours}: every process "
            "must give a semaphore the same value")


def parties_mismatch(name: str, stored: object, ours: int) -> str:
    return (f"barrier {name!r} was created with parties={stored}, not {ours}: every party "
            "must give a barrier the same number of parties")


#: ev_wait: the event is set
EV_SET = -1


#: ev_wait: a set() took this waiter's entry: the event was set while it waited
EV_TAKEN = -2


#: ev_wait: the entry ran out before anyone took it; the waiter must join again
EV_EXPIRED = -3


#: bar_wait / bar_poll codes (first element of the reply)
BAR_WAITING = 0


BAR_TRIPPED = 1


BAR_RUN = 2


BAR_PENDING = 3


BAR_BROKEN = -1


BAR_BUSY = -2


BAR_MISMATCH = -3





#: the first character of a hand-off message: ``+<nonce> <token> <lease ms>``
HANDOFF = "+"


def handoff(data: Any) -> Optional[Tuple[str, str]]:
    """A hand-off message's (nonce, payload), payload ``"<token> <lease ms>"``; None for any
    other hint. A nonce ``<nonce>/<try>`` (a default lock's record names the try that wrote
    it: ``_primitives.lock_wait``) gives ``<nonce>``, the try's number ending the payload."""
    if isinstance(data, str) and data.startswith(HANDOFF):
        nonce, _, payload = data[1:].partition(" ")
        nonce, slash, number = nonce.partition("/")
        return nonce, f"{payload} {number}" if slash else payload
    return None


def handoff_grant(payload: str) -> Tuple[int, int, Optional[int]]:
    """The token and lease (ms) a fair hand-off message's payload carries, and the number of
    the try whose queue entry it read (None if the entry named none)."""
    token, lease, *number = payload.split(" ")
    return int(token), int(lease), int(number[0]) if number else None


def yielded_grant(payload: str) -> Tuple[int, int, int, Optional[int]]:
    """The token, lease (ms), turns (how many processes take turns, as a ``y<n>`` hint says)
    and the number of the try whose record it read (None if the record named none) of a
    default lock's direct hand-off to another process (``free_hold``)."""
    token, lease, turns, *number = payload.split(" ")
    return int(token), int(lease), max(1, int(turns)), int(number[0]) if number else None


def wake_idents(data: Any) -> Optional[Set[str]]:
    """The idents a ``=id1,id2`` hint wakes (each exactly, wherever it is in the queue), or
    None when the hint is a count (``1``, ``3``, ``*``) instead."""
    if isinstance(data, str) and data.startswith("="):
        return set(data[1:].split(","))
    return None


def yield_turns(data: Any) -> int:
    """A default lock yielded to this process (a ``y<n>`` hint, ``free_hold``): n, how many
    processes take turns with it; 0 for any other hint."""
    if isinstance(data, str) and data[:1] == "y":
        try:
            return max(1, int(data[1:]))
        except ValueError:
            return 0
    return 0


def wake_count(data: Any) -> Optional[int]:
    """How many local waiters one hint wakes: an integer (a ``y<n>`` hint wakes one), or ``*``
    for all of them."""
    if data == "*":
        return None
    try:
        return max(1, int(data))
    except (TypeError, ValueError):
        return 1
