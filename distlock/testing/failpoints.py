"""Failpoints for tests: make a named script's N-th call fail before it is sent, lose its reply
after the server ran it, or answer too late (``distlock._redis.failpoints`` has the seam).

::

    lock = distlock.DistRLock("orders", client=client)
    points = arm(lock)                    # the executor of lock's session
    points.fail("lock_acquire", 2, LOST)  # the 2nd lock_acquire runs, its reply is lost
    with points.active():                 # count (and fail) this thread's calls only
        with lock:
            lock.acquire()                # raises redis.ConnectionError
    disarm(lock)

For an asyncio primitive call ``arm`` inside its event loop: the failpoints go on the loop's
port for the primitive's client, and on the blocking session behind it. ``active()`` is a
``contextvars`` scope: a thread, or a task and the tasks it starts.
"""

from __future__ import annotations

from typing import Any, Optional

from .._redis.failpoints import BEFORE, KINDS, LATE, LOST, Call, FailPoints, Rule

__all__ = ["arm", "disarm", "FailPoints", "Rule", "Call", "BEFORE", "LOST", "LATE", "KINDS"]


def _targets(primitive: Any) -> list:  # type: ignore[type-arg]
    side = getattr(primitive, "read_lock", None)  # a DistReadWriteLock: its sides share one
    if callable(side):
        primitive = side()
    found = []
    port = getattr(primitive, "_port", None)
    if callable(port):
        made = port()
        found.append(made)
        found.append(made.session.executor)
    else:
        found.append(primitive._session().executor)
    return found


def arm(primitive: Any, failpoints: Optional[FailPoints] = None) -> FailPoints:
    """Install ``failpoints`` (a new ``FailPoints`` when None) where ``primitive``'s scripts
    go out; return it. Every primitive of the same session (or port) shares it."""
    points = FailPoints() if failpoints is None else failpoints
    for target in _targets(primitive):
        target.failpoints = points
    return points


def disarm(primitive: Any) -> None:
    """Take the failpoints off again."""
    for target in _targets(primitive):
        target.failpoints = None
