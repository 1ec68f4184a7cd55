"""Fair locks without I/O: their keys, the argument check, wait nonces and hand-off messages.

A fair lock (``DistLock(name, fair=True)``, ``DistRLock(name, fair=True)``) queues its waiters
in Redis by arrival on the server, and its release hands the lock straight to the first live
one, telling only that waiter's process (see ``lua/_fair.lua`` and docs/how-it-works.rst, "Fair
locks"). The flows are in ``_fair``.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Tuple

from ._logic import Keys

__all__ = ["FairKeys", "check_fair", "refuse_fair_quorum", "new_nonce", "handoff", "HANDOFF",
           "entry_lease_ms"]

#: the first character of a hand-off message: ``+<nonce> <token> <lease ms>``
HANDOFF = "+"


class FairKeys:
    """The keys of a fair lock's queue, beside the lock's own (``Keys``), in the order the
    ``fair_*`` scripts take them: hash, fence, ``fq`` (order), ``fd`` (deadlines), ``fe``
    (entries), and the plain lock's registry of waiting processes."""

    __slots__ = ("order", "deadlines", "entries", "all")

    def __init__(self, keys: Keys) -> None:
        #: sorted set: wait nonce -> arrival (server µs)
        self.order = keys.sub("fq")
        #: sorted set: wait nonce -> the entry's deadline (server ms)
        self.deadlines = keys.sub("fd")
        #: hash: wait nonce -> ``<count>|<lease ms>|<owner>|<host:pid>|<process channel>``
        self.entries = keys.sub("fe")
        self.all: Tuple[str, ...] = (keys.lock, keys.fence, self.order, self.deadlines,
                                     self.entries, keys.queue)


def check_fair(fair: object) -> bool:
    """``fair`` as given to a lock's constructor: a bool, or TypeError."""
    if not isinstance(fair, bool):
        raise TypeError(f"fair must be a bool, not {type(fair).__name__}")
    return fair


def refuse_fair_quorum(client: object, fair: object) -> None:
    """TypeError for ``fair=True`` with a Redlock quorum (a list of independent masters): each
    master would keep a line of its own, and a hand-off by one master is no grant of the
    quorum's."""
    if fair is True and isinstance(client, (list, tuple)):
        raise TypeError("fair does not apply to a Redlock quorum (a list of masters): "
                        "use one or the other")


def new_nonce(session_id: str) -> str:
    """A fresh nonce for one wait: it names the wait's queue entry and its hand-off message,
    so that a message for an earlier wait of the same thread wakes nobody."""
    return f"{session_id}:{os.urandom(8).hex()}"


def handoff(data: Any) -> Optional[Tuple[str, str]]:
    """A hand-off message's (nonce, payload), payload ``"<token> <lease ms>"``; None for any
    other hint."""
    if isinstance(data, str) and data.startswith(HANDOFF):
        nonce, _, payload = data[1:].partition(" ")
        return nonce, payload
    return None


def handoff_grant(payload: str) -> Tuple[int, int]:
    """The token and lease (ms) a hand-off message's payload carries."""
    token, _, lease = payload.partition(" ")
    return int(token), int(lease)


def entry_lease_ms(wait_cap: float) -> int:
    """How long a queue entry lives after its waiter's last try (server ms): ``2 * wait_cap +
    1`` s, 7 s by default. A fair waiter tries at least every ``wait_cap``, wherever it stands,
    so a live one keeps its place; a dead one is dropped within this."""
    return int((2 * wait_cap + 1) * 1000)
