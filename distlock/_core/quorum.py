"""Redlock's arithmetic and checks, without I/O: what a quorum of independent masters decides.

``_redis.executor_quorum`` does the talking; everything it decides is here, so that it is tested
without a server:

- ``check_masters``: the list a DistLock or DistRLock is given (``client=[c1, ..., cN]``);
- ``quorum(n)``: how many masters a grant needs, N//2+1;
- ``drift`` and ``validity``: what a grant is worth, lease - elapsed - drift (never plus);
- ``sits_out``: a master that started less than one lease ago does not vote (antirez's
  "delayed restarts": it may have restarted empty, and then forgot a hold it had voted for);
- ``tally_*``: one reply per master folded into the one reply the lock's flows decode, as if
  a single server had answered.

``Quorum`` is what the list becomes: one object per set of clients (the same list, in any
order, gives the same object while it lives), so that every lock on those masters shares one
session, as every lock on one server does.
"""

from __future__ import annotations

import random
import threading
import weakref
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["Quorum", "check_masters", "is_quorum_arg", "quorum", "drift", "validity",
           "parse_info", "sits_out", "reply_bound", "tally_acquire", "tally_release",
           "tally_renew", "LIST_TAKERS", "REPLY_CAP", "split_vote_ms"]

#: The classes that take a list of masters.
LIST_TAKERS = ("DistLock", "DistRLock")

#: The longest a try waits for any master's reply (seconds); a try also never waits past the
#: validity it could still give (the lease less the drift). A master that has not answered by
#: then counts as not answering, and what it may have done is undone.
REPLY_CAP = 1.0

#: The share of a lease, and the fixed amount (seconds), that the clocks of the masters and the
#: client may drift apart during one lease: the default of ``configure(redlock_drift=)``.
DRIFT_FACTOR = 0.01
DRIFT_FIXED = 0.002


def is_quorum_arg(client: object) -> bool:
    return isinstance(client, (list, tuple))


def quorum(n: int) -> int:
    """How many of ``n`` masters a grant needs: a strict majority."""
    return n // 2 + 1


def drift(lease: float, configured: Optional[float]) -> float:
    """The clock drift allowed for a hold of ``lease`` seconds: ``configured`` (seconds) when
    set, else 1% of the lease plus 2 ms."""
    if configured is not None:
        return configured
    return lease * DRIFT_FACTOR + DRIFT_FIXED


def validity(lease: float, elapsed: float, drift_: float) -> float:
    """How long a grant is worth, counted from when its reply came back: the lease, less the
    time the try took (the masters' leases started somewhere in it), less the drift. A result
    <= 0 is a failed try."""
    return lease - elapsed - drift_


def reply_bound(lease: float, drift_: float) -> float:
    """How long one try waits for its replies: ``REPLY_CAP``, and never past the point where
    even an instant grant would be worth nothing."""
    return max(0.0, min(REPLY_CAP, lease - drift_))


def sits_out(started_at: Optional[float], now: float, lease: float) -> bool:
    """Whether a master that started at ``started_at`` (monotonic; None: not known yet) must
    stay out of a grant of ``lease`` seconds at ``now``: it has not been up for one lease.
    A master that restarted empty forgot every hold it had voted for; once one lease has passed
    since, every such hold has ended anyway, so its vote is good again."""
    return started_at is not None and now - started_at < lease


def parse_info(text: Any) -> Tuple[Optional[str], Optional[int]]:
    """``INFO server``'s ``run_id`` and ``uptime_in_seconds`` (None where missing)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    run_id: Optional[str] = None
    uptime: Optional[int] = None
    for line in str(text).splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        if key == "run_id":
            run_id = value.strip()
        elif key == "uptime_in_seconds":
            try:
                uptime = int(value.strip())
            except ValueError:
                pass
    return run_id, uptime


def split_vote_ms() -> int:
    """How long (ms) a try that lost a split vote tells its waiter to back off: a short random
    time, so that contenders that split the masters between them do not split them again."""
    return random.randint(5, 50)


# --- folding one reply per master into one ----------------------------------------------------

def tally_acquire(replies: Sequence[Any], voters: int) -> Tuple[int, int, int]:
    """For a first or waiting try: (grants, refusals, answered) among ``replies`` (one per
    master that voted: an int, or an exception for a master that did not answer)."""
    grants = refusals = 0
    for reply in replies:
        if isinstance(reply, BaseException):
            continue
        if int(reply) > 0:
            grants += 1
        else:
            refusals += 1
    return grants, refusals, grants + refusals


def busy_reply(replies: Iterable[Any]) -> int:
    """The reply "someone else holds it" for the lock's flows: the shortest remaining lease
    among the masters that said so, or a short random back-off after a split vote."""
    pttls = [-int(r) - 1 for r in replies if not isinstance(r, BaseException) and int(r) < 0]
    known = [p for p in pttls if p > 0]
    pttl = min(known) if known else split_vote_ms()
    return -(pttl + 1)


def tally_release(replies: Sequence[Any], n: int) -> Optional[int]:
    """A release's replies (the count left, or -1: not there; an exception: no answer), one
    per master: the count still held (the most any master has: the hold is over only when
    every master says so), -1 when the hold was not on a quorum any more (lost), or None when
    too few answered to tell."""
    need = quorum(n)
    left = [int(r) for r in replies if not isinstance(r, BaseException) and int(r) >= 0]
    gone = sum(1 for r in replies if not isinstance(r, BaseException) and int(r) < 0)
    if len(left) >= need:
        return max(left)
    if gone > n - need:
        return -1
    return None


def tally_renew(replies: Sequence[Any], n: int) -> Optional[int]:
    """A renewal's replies (1 renewed, 0 gone; an exception: no answer), one per master that
    still had the hold: 1 when a quorum renewed it, 0 when a quorum can never renew it again
    (lost), None when too few answered to tell (the hold then lasts until its validity)."""
    need = quorum(n)
    renewed = sum(1 for r in replies if not isinstance(r, BaseException) and int(r) == 1)
    answered = sum(1 for r in replies if not isinstance(r, BaseException))
    unanswered = len(replies) - answered
    if renewed >= need:
        return 1
    if renewed + unanswered < need:
        return 0
    return None


# --- the list, checked, and what it becomes ---------------------------------------------------

def list_refused(owner: str) -> TypeError:
    """The error for a list given to a class that does not take one (``owner``: its name;
    empty when not known, as for ``configure()``)."""
    shown = {"DistReadLock": "DistReadWriteLock", "DistWriteLock": "DistReadWriteLock"}.get(owner, owner)
    if not shown:
        return TypeError("only DistLock and DistRLock take a list of clients (a Redlock quorum)")
    return TypeError(f"{shown} does not take a list of clients: only DistLock and DistRLock do "
                     "(a Redlock quorum)")


def check_masters(client: Sequence[Any], owner: str, check_one: Any, address_of: Any) -> None:
    """Check a list of masters: not empty; each a client ``check_one`` accepts (a
    ``redis.Redis`` or a URL); no server twice. ``address_of(item)`` says which server an
    item names, or None when it cannot tell. Raise TypeError or ValueError."""
    if owner not in LIST_TAKERS:
        raise list_refused(owner)
    if len(client) == 0:
        raise ValueError("a list of clients (a Redlock quorum) must not be empty")
    seen: Dict[Any, int] = {}
    for i, item in enumerate(client):
        if is_quorum_arg(item) or item is None:
            raise TypeError(f"client[{i}] must be a redis.Redis or a URL string, not {type(item).__name__}")
        check_one(item, i)
        where = address_of(item)
        if where is None:
            continue
        if where in seen:
            raise ValueError(f"client[{seen[where]}] and client[{i}] are the same server ({where}): "
                             "a Redlock quorum needs independent masters")
        seen[where] = i


class Quorum:
    """The masters a list named, in its order, as one client-like object (no I/O).

    ``session_for`` gives it a session of its own, like any client that is not shared per
    server; ``made(clients)`` returns the live one for the same clients, so that every lock on
    them shares that session."""

    def __init__(self, masters: Tuple[Any, ...]) -> None:
        self.masters = masters

    @property
    def required(self) -> int:
        return quorum(len(self.masters))

    def __repr__(self) -> str:
        return f"<distlock Quorum of {len(self.masters)} masters, {self.required} required>"


_made: weakref.WeakValueDictionary[Tuple[int, ...], Quorum] = weakref.WeakValueDictionary()
_made_lock = threading.Lock()


def made(masters: List[Any]) -> Quorum:
    """The ``Quorum`` of these resolved clients (the live one, if any: same clients, same
    order)."""
    key = tuple(id(m) for m in masters)
    with _made_lock:
        found = _made.get(key)
        if found is None or any(a is not b for a, b in zip(found.masters, masters)):
            found = _made[key] = Quorum(tuple(masters))
        return found

