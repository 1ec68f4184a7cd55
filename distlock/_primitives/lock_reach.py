"""Helpers that reach a lock's hold from outside the lock object: its session (``session_of``),
its hold (``hold_of``, ``still_held``: the command line's ``distlock run``), and a release
made inside another script (``release_into``: a DistCondition's wait releases its lock and
joins its queue in one round trip)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

from .._core.errors import LockLostError, LockNotOwnedError
from .._core.flow import Flow, Run
from .._core.outcomes import LOST
from .._core.outcomes import lock_release as decode_release
from .._session.session import Hold, Session
from .lock_base import _LockBase


def session_of(lock: _LockBase) -> Session:
    """The session ``lock`` talks through."""
    return lock._session()


def hold_of(lock: _LockBase) -> Optional[Hold]:
    """The caller's current hold of ``lock`` (this object's for a DistLock, this thread's for
    the others), lost or not; None when it holds nothing."""
    return lock._current(lock._session())


def still_held(lock: _LockBase, hold: Hold) -> bool:
    """One round trip: is ``hold`` of ``lock`` still in Redis, as it was granted?"""
    return lock._still_held(hold)


def release_into(lock: _LockBase, session: Session, script: str, keys: Tuple[str, ...],
                 args: Tuple[Any, ...]) -> Flow[int]:
    """Release the caller's whole hold of ``lock`` inside ``script``, which also does its own
    work (a condition's ``cond_wait`` joins its queue): it gets ``keys`` plus the lock's hash
    and registry, and ``args`` plus the hold's owner and token, and replies -1 when the hold
    was not ours any more. Keep the lock's books as its own release would; return the count
    the hold had. Raise LockNotOwnedError, or LockLostError (after ``on_lost``)."""
    hold = lock._current(session)
    if hold is None:
        raise LockNotOwnedError(lock._unowned_message, name=lock.name)
    if hold.lost:
        raise LockLostError(f"lease on {lock.name!r} was lost before release",
                            name=lock.name, token=hold.token)
    count = hold.count
    lock._forget(hold)
    try:
        reply = int((yield Run(script, (*keys, lock._keys.lock, lock._keys.queue),
                            (*args, hold.owner, hold.token))))
    finally:
        hold.count = 0
        session.drop_hold(hold)
    if decode_release(reply) is LOST:
        session.mark_lost(hold)
        raise LockLostError(f"lease on {lock.name!r} was lost before release",
                            name=lock.name, token=hold.token)
    return count
