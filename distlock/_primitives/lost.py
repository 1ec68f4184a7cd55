"""What a lock does when the reply of one of its state changes was lost (the connection broke
after the send, the reply came after the socket timeout, the caller was interrupted): the
script may have run, so it is never sent again as it was; the lock reads the state and acts on
what it finds (docs/design.rst, principle 13). Flows, for both shells; the lock family and the
read/write lock's sides call them (``_primitives.lock_base``, ``_primitives.rwlock``).

- **A re-entry** (``reentry_lost``): the script adds levels to the hold in Redis (``HINCRBY``),
  the caller's count does not grow (the call raises), so Redis would keep the hold after the
  caller's balanced releases, and the watchdog renew it until the process exits. The count is
  read: levels the re-entry added are given back at once. When even the read fails, the levels
  are recorded as *in doubt* on the hold; the first release whose reply shows more levels than
  the caller holds gives the surplus back (``surplus``).
- **A release** (``settle_release``): read the hold. Gone, or at the depth the release leaves:
  it ran. Still at the depth it had: it did not run, and is sent now (the state says so: this
  is not a re-run). The caller keeps the levels it still holds, renewed as before; when nothing
  can be read, it stops renewing, and the hold ends with its lease.
- **A semaphore's release of its own permits** (``settle_permits_release``): the same, by the
  permits' scores; the script is atomic, so all of them are gone or none.

A new hold whose reply was lost is given back by the primitives' own ``_undo_lost_*`` flows.
"""

from __future__ import annotations

import weakref
from typing import Callable, List, Optional

import redis

from .._core.flow import Flow, Op, Read
from .._session.session import Hold

__all__ = ["reentry_lost", "settle_release", "surplus"]

#: per hold, levels a re-entry may have added in Redis that the caller does not count (its reply
#: was lost, and so was the read that would have told)
_doubts: weakref.WeakKeyDictionary[Hold, int] = weakref.WeakKeyDictionary()


def reentry_lost(hold: Hold, key: str, added: int, give_back: Callable[[int], Op]) -> Flow[None]:
    """The re-entry of ``hold`` by ``added`` levels lost its reply: if Redis has the hold (hash
    ``key``) at ``hold.count + added``, give the ``added`` levels back (``give_back(n)``: the
    release of n levels, which never frees the hold). Nothing is raised: the caller raises the
    re-entry's own error."""
    try:
        held, token = yield Read("HMGET", key, hold.owner, ":t")
    except redis.RedisError:
        _doubts[hold] = _doubts.get(hold, 0) + added
        return
    if held is None or token is None or int(token) != hold.token or int(held) != hold.count + added:
        return  # it did not run (or the hold is gone: a renewal or the next release says so)
    try:
        yield give_back(added)
    except redis.RedisError:
        _doubts[hold] = _doubts.get(hold, 0) + added


def surplus(hold: Hold, left: int, expected: int) -> int:
    """A release of ``hold`` left ``left`` levels in Redis where the caller expected
    ``expected``: how many of the difference are levels in doubt (``reentry_lost``) to give
    back now. 0 when none."""
    doubt = _doubts.get(hold, 0)
    if not doubt or left <= expected:
        return 0
    extra = min(doubt, left - expected)
    _doubts[hold] = doubt - extra
    return extra


def settle_release(hold: Hold, key: str, count: int, depth: int,
                   resend: Callable[[], Flow[int]]) -> Flow[Optional[int]]:
    """The release of ``count`` levels (0: all) of ``hold``, then ``depth`` deep, lost its reply:
    read the hash ``key``; send the release now (``resend``) if it did not run. Return the
    levels the caller still holds, None when none, or when the state cannot be read (the
    caller then stops renewing: the hold ends with its lease)."""
    try:
        held, token = yield Read("HMGET", key, hold.owner, ":t")
        if held is None or token is None or int(token) != hold.token:
            return None  # it ran, or the hold was lost meanwhile
        if int(held) != depth:
            return int(held) or None  # it ran
        left = yield from resend()
    except redis.RedisError:
        return None
    return left if left > 0 else None


def settle_permits_release(key: str, ids: List[str], resend: Op) -> Flow[None]:
    """A release of the caller's own permits ``ids`` (members of the semaphore ``key``) lost
    its reply: one read tells whether it ran (all gone) or not (all there); if not, send it
    now (``resend``). Errors are swallowed: the caller stops renewing the permits either way,
    so that what could not be settled ends with its lease."""
    try:
        scores = yield Read("ZMSCORE", key, *ids)
        if scores is not None and all(score is not None for score in scores):
            yield resend
    except redis.RedisError:
        pass
