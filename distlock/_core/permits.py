"""A semaphore permit's id, both sides of it: what ``DistSemaphore`` sends, and what ``distlock
top`` and ``status`` read back (no I/O).

A permit id is ``<session id>:<thread>:<n>@<ms>``. ``<session id>:<thread>:<n>`` names one
acquire (``permit_id``; the thread part lets ``release()`` give back the calling thread's
permits first); it is also the waiter's id in the semaphore's queue. Each try of the acquire
sends it with ``@<ms>`` (``stamped``): the acquiring host's wall clock at that try, in ms. The id
a permit is granted under therefore carries its grant time, which ``distlock top`` shows as the
permit's age (``grant_ms``). Recording it costs no command and no field: the id is written
anyway, and the uncontended path reads no clock on the server (a permit taken at rest is scored
``+inf``, see sem_acquire.lua). It is the client's clock, not the server's: a skew between them
shows in the age, which readers clamp at 0.
"""

from __future__ import annotations

import itertools
import time
from typing import Optional

__all__ = ["permit_id", "stamped", "grant_ms", "GRANT_MS_FLOOR"]

#: a grant time below this (ms since the epoch: 2001-09-09) is not one
GRANT_MS_FLOOR = 10 ** 12

_sequence = itertools.count(1)


def permit_id(session_id: str, thread_ident: object) -> str:
    """A fresh id for one acquire: ``<session>:<thread>:<n>``, unstamped (its waiter's id)."""
    return f"{session_id}:{thread_ident}:{next(_sequence)}"


def stamped(pid: str) -> str:
    """The permit one try of the acquire ``pid`` asks for: ``<pid>@<ms>``, this host's clock."""
    return f"{pid}@{int(time.time() * 1000)}"


def grant_ms(permit: str) -> Optional[int]:
    """The grant time (ms) a permit id carries; None for an id without one (an older
    version's) or with a number that is clearly not a time."""
    _, sep, stamp = permit.rpartition("@")
    if not sep or not (stamp.isascii() and stamp.isdigit()) or len(stamp) > 15 or int(stamp) < GRANT_MS_FLOOR:
        return None
    return int(stamp)
