"""DistCondition: ``threading.Condition`` across processes and hosts.

The waiter queue lives in Redis (see :class:`~distlock._core.keys.CondKeys`): a sorted set of
the waiters not notified yet, in arrival order, and a sorted set of their lease deadlines on
the server's clock. Every state change is one Lua script:

- ``cond_wait``: join the queue and, for a DistLock or DistRLock, release the lock fully in the
  same step, so that a notify can never fall between the release and the join;
- ``cond_notify``: drop waiters whose lease ran out, take the oldest ``n`` of the others off
  the queue and publish their ids as one hint. A waiter that receives its own id knows it was
  picked and returns without another round trip;
- ``cond_leave``: look whether this waiter is still queued (when no hint came), or leave the
  queue at a timeout; a notification that picked the waiter in that instant is used, never
  wasted;
- ``cond_renew``: the session watchdog renews the leases of this process' waiters on a
  condition, all in one script, so a waiter that dies cannot swallow a notification for longer
  than its lease.

Pub/sub only shortens the sleep: a waiter looks at Redis again at least every ``wait_cap``
seconds (the oldest waiter of the process) or ``wait_cap * queue_cap_factor`` (the others),
whatever the hints do.
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from typing import Any, Callable, List, Optional, Set, Tuple, TypeVar

import redis

from .._core.checks import check_name, check_wait_timeout, refuse_max_hold
from .._core.deadlines import lease_ms
from .._core.errors import LockLostError, LockNotOwnedError
from .._core.flow import Flow, Read, Run
from .._core.keys import CondKeys, Keys
from .._core.outcomes import Busy, Outcome, cond_leave
from .._core.replicas import refuse_options
from .._core.settings import settings
from .._core.wait_policy import FIRST, LAST
from .._redis.clients import ClientArg, check_client
from .._session.session import Hold, Session, SessionUser
from .engine import Waiting, waiting_flow
from .lock import DistLock, DistRLock, _ThreadOwned
from .lock_base import _UNSET, _LockBase
from .lock_reach import release_into, session_of

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


def cond_repr(lock: object, waiting: int) -> str:
    """``<DistCondition(<lock>, n)>``, the shape of ``threading.Condition``'s repr."""
    return f"<DistCondition({lock}, {waiting})>"


__all__ = ["DistCondition"]

T = TypeVar("T")

#: Lock types whose hold this module releases itself, in the same script that joins the queue.
#: Exact types only: a subclass may keep its hold differently.
_ATOMIC_TYPES = (DistLock, DistRLock)

#: ``saved`` for the locks this module released itself (restored with ``acquire``).
_SELF_RELEASED = ("distlock", "self-released")
#: ``saved`` before the lock was released: nothing to restore
_NOT_RELEASED = ("distlock", "not released")


class DistCondition(SessionUser):
    """``threading.Condition`` shared by every process and host that names it on one Redis.

    ``DistCondition(name, lock=None, *, client=None, max_hold=None)``: ``lock`` defaults to a
    new ``DistRLock(name, max_hold=max_hold)`` (``max_hold`` with a lock of your own:
    TypeError). Any object with ``acquire``/``release`` is accepted, as by
    ``threading.Condition``; with a DistLock or DistRLock the condition's keys carry the lock's
    hash tag (one cluster slot) and ``wait()`` releases the lock and joins the queue in one
    atomic step. Every process that shares the condition must give it the same name and a lock
    of the same name. ``client`` is a ``redis.Redis`` or a URL; by default the lock's client
    when the lock is a distlock lock (a read/write lock's side included), else the default
    client (see ``configure``).

    ``acquire()``, ``release()`` and ``with cond:`` are the lock's. ``wait``, ``wait_for``,
    ``notify`` and ``notify_all`` behave as ``threading``'s, across processes: ``notify(n)``
    wakes the ``n`` oldest waiters wherever they are, and ``notify_all()`` those waiting when
    it is called. What a distributed condition adds is documented on each method.
    """

    _metric_kind = "condition"
    #: lock types whose hold this class releases itself, in the script that joins the queue
    _atomic_types: Tuple[type, ...] = _ATOMIC_TYPES

    acquire: Callable[..., Any]
    release: Callable[..., Any]

    def __init__(self, name: str, lock: Any = None, *, client: ClientArg = None,
                 min_replicas: Any = None, replica_timeout: Any = None,
                 max_hold: Optional[float] = None) -> None:
        self._name = check_name(name)
        refuse_options(type(self).__name__, min_replicas, replica_timeout)
        refuse_max_hold(lock, max_hold)
        if client is not None:
            check_client(client, type(self).__name__)
        if lock is None:
            lock = DistRLock(name, client=client, max_hold=max_hold)
        self._lock = lock
        # The lock's own methods, as threading.Condition exports them.
        self.acquire = lock.acquire
        self.release = lock.release
        self._client_arg = client
        self._client: Any = None
        lock_keys = getattr(lock, "_keys", None)
        base = lock_keys if isinstance(lock_keys, Keys) else Keys(settings().prefix, self._name)
        self._keys = CondKeys.of(base, self._name)
        self._mutex = threading.Lock()
        self._waiting = 0  # threads of this process waiting through this object (for repr)
        self._leases = _LocalLeases(self._keys)

    # --- the lock's side --------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The shared name: with a lock of the same name, the same condition everywhere."""
        return self._name

    def __enter__(self) -> Any:
        return self._lock.__enter__()

    def __exit__(self, *exc_info: Any) -> Any:
        return self._lock.__exit__(*exc_info)

    def __repr__(self) -> str:
        return cond_repr(self._lock, self._waiting)

    def _is_owned(self) -> bool:
        """True when the calling thread (or, for a DistLock, this process' lock object) holds
        the lock. No round trip for Dist locks."""
        lock = self._lock
        owned = getattr(lock, "_is_owned", None)
        if owned is not None:
            return bool(owned())
        if isinstance(lock, DistLock):
            return lock.owned()
        # threading's fallback for a lock without _is_owned: "held by anyone" (a plain Lock).
        if lock.acquire(False):
            lock.release()
            return False
        return True

    def _release_save(self) -> Any:
        save = getattr(self._lock, "_release_save", None)
        if save is not None:
            return save()
        self._lock.release()
        return None

    def _acquire_restore(self, saved: Any) -> None:
        restore = getattr(self._lock, "_acquire_restore", None)
        if restore is not None and saved is not _SELF_RELEASED:
            restore(saved)
        else:
            self._lock.acquire()

    def _release_save_flow(self, session: Session) -> Flow[Any]:
        """``_release_save``, a flow: the lock's own flow when the lock is a distlock lock on
        ``session`` whose method is the library's, else the lock's (blocking) method."""
        lock = self._lock
        if _flows_of(lock, session):
            if _unchanged(lock, "_release_save", _ThreadOwned):
                return (yield from lock._release_all())
            if not hasattr(lock, "_release_save") and _unchanged(lock, "release", DistLock):
                yield from lock._release_one()
                return None
        return self._release_save()

    def _acquire_restore_flow(self, session: Session, saved: Any) -> Flow[None]:
        """``_acquire_restore``, a flow, as ``_release_save_flow``."""
        lock = self._lock
        if _flows_of(lock, session):
            if saved is not _SELF_RELEASED and _unchanged(lock, "_acquire_restore", _ThreadOwned):
                yield from lock._restore(saved)
                return
            if ((saved is _SELF_RELEASED or not hasattr(lock, "_acquire_restore"))
                    and _unchanged(lock, "acquire", _LockBase)):
                yield from lock._acquire(True, None, _UNSET, 1)  # acquire(), as a flow
                return
        self._acquire_restore(saved)

    # --- waiting ----------------------------------------------------------------------------

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until notified or until a timeout occurs.

        The calling thread must hold the lock, or RuntimeError is raised. The lock is released
        fully, whatever its recursion level, and the caller joins the condition's queue, in one
        atomic step for a DistLock or DistRLock; then it sleeps until a ``notify`` or
        ``notify_all`` in any process picks it, or until ``timeout`` seconds (a float) pass.
        ``timeout`` None waits for ever; zero or less does not wait. Either way the lock is
        taken back at its recursion level before ``wait`` returns (or raises).

        Return True when notified, False on timeout. A notification that picks the waiter in
        the same instant as its timeout counts: ``wait`` then returns True. If the waiter's
        entry vanished while it slept (the server lost its data, or this process could not
        renew its lease for longer than the lease), ``wait`` returns True as well, since a
        notification may have gone with it: code that re-checks its predicate, as
        ``wait_for`` does, is never hurt. Redis errors propagate as ``redis.exceptions``.

        A pub/sub hint that names the waiter wakes it at once; without one (a lost message, a
        dropped connection) it finds out at its next look, at most ``wait_cap`` seconds later
        for the oldest waiter of its process and ``wait_cap * queue_cap_factor`` for the others.
        """
        return self._drive(self._wait_flow(timeout))

    def wait_for(self, predicate: Callable[[], T], timeout: Optional[float] = None) -> T:
        """Wait until ``predicate()`` is true, and return its last result.

        ``predicate`` is called with the lock held, first before any wait and again after each
        wake-up, so it may read shared state (in Redis, say) that notifiers change under the
        same lock. With ``timeout`` (seconds), give up once that much time has passed in all
        and return the predicate's last, false, result. RuntimeError when the lock is not held.
        """
        return self._drive(self._wait_for_flow(predicate, timeout))

    def _wait_flow(self, timeout: Optional[float]) -> Flow[bool]:
        """``wait()``, a flow: its checks raise before its first round trip."""
        if not self._is_owned():
            raise RuntimeError("cannot wait on un-acquired lock")
        seconds = check_wait_timeout(timeout)
        session = self._session()
        waiting = _CondWaiting(self, session)
        waiting.meter = self._metered()
        with self._mutex:
            self._waiting += 1
        try:
            return bool((yield from waiting_flow(waiting, seconds)))
        finally:
            try:
                self._leases.discard(waiting.wid)
                with self._mutex:
                    self._waiting -= 1
            finally:
                if waiting.saved is not _NOT_RELEASED:
                    yield from self._acquire_restore_flow(session, waiting.saved)

    def _wait_for_flow(self, predicate: Callable[[], T], timeout: Optional[float]) -> Flow[T]:
        """``wait_for()``, a flow; ``predicate`` is a plain callable, called in the flow."""
        result = predicate()
        if result:
            return result
        deadline: Optional[float] = None
        wait_time = timeout
        while not result:
            if timeout is not None:
                if deadline is None:
                    deadline = time.monotonic() + timeout
                else:
                    wait_time = deadline - time.monotonic()
                    if wait_time <= 0:
                        break
            yield from self._wait_flow(wait_time)
            result = predicate()
        return result

    # --- notifying --------------------------------------------------------------------------

    def notify(self, n: int = 1) -> None:
        """Wake up to ``n`` waiters of this condition, in any process, oldest first.

        The calling thread must hold the lock, or RuntimeError is raised. Wakes exactly
        min(n, number waiting) waiters; does nothing when none wait. Waiters whose process died
        (their lease ran out) are skipped and dropped. One round trip.
        """
        self._drive(self._notify_flow(n))

    def notify_all(self) -> None:
        """Wake every waiter that is waiting on this condition now, in any process.

        Those who start waiting afterwards are not woken. RuntimeError when the lock is not held.
        """
        self._drive(self._notify_all_flow())

    def notifyAll(self) -> None:  # noqa: N802 - threading's deprecated spelling
        """Wake every waiter; deprecated, use ``notify_all()`` (as in ``threading``)."""
        warnings.warn("notifyAll() is deprecated, use notify_all() instead",
                      DeprecationWarning, stacklevel=2)
        self.notify_all()

    def _notify_flow(self, n: int) -> Flow[None]:
        """``notify(n)``, a flow: its checks raise before its first round trip."""
        if not self._is_owned():
            raise RuntimeError("cannot notify on un-acquired lock")
        yield from self._notify_count_flow(notify_count(n))

    def _notify_all_flow(self) -> Flow[None]:
        """``notify_all()``, a flow: its check raises before its first round trip."""
        if not self._is_owned():
            raise RuntimeError("cannot notify on un-acquired lock")
        yield from self._notify_count_flow(None)

    def _notify(self, count: Optional[int]) -> int:
        """Pick ``count`` waiters (None: all); return how many were picked."""
        return self._drive(self._notify_count_flow(count))

    def _notify_count_flow(self, count: Optional[int]) -> Flow[int]:
        """``_notify``, a flow."""
        if count == 0:
            return 0
        keys = self._keys
        return int((yield Run("cond_notify", (*keys.state, keys.channel), (notify_arg(count),))))

    # --- the machinery ----------------------------------------------------------------------

    def _session(self) -> Session:
        """The session to talk through: the lock's own for a Dist lock, unless ``client`` said
        otherwise."""
        lock = self._lock
        if self._client_arg is None and isinstance(lock, _LockBase):
            return session_of(lock)
        return super()._session()

    def _join_and_release(self, session: Session, wid: str,
                          lost: Optional[Callable[[Any], None]] = None) -> Flow[Any]:
        """Join the queue and release the lock; return what restores the lock. From then on
        the watchdog renews the waiter's lease."""
        keys = self._keys
        ms = lease_ms(settings().lease)
        sent_at = time.monotonic()
        # One script for both when the lock is a DistLock/DistRLock on this very session.
        if type(self._lock) in self._atomic_types and session_of(self._lock) is session:
            saved = yield from self._release_and_join(session, wid, ms, lost)
        else:
            yield Run("cond_wait", keys.state, (wid, ms, "", ""))
            try:
                saved = yield from self._release_save_flow(session)
            except BaseException:
                yield from self._call_leave(wid, True)
                raise
        self._leases.add(session, wid, ms, sent_at, self._metered())
        return saved

    def _release_and_join(self, session: Session, wid: str, ms: int,
                          lost: Optional[Callable[[Any], None]] = None) -> Flow[Any]:
        """DistLock / DistRLock: release the caller's hold and join the queue in one script,
        keeping the lock object's books as its own release would.

        When the script's reply is lost (the connection failed, the caller was interrupted or
        cancelled), it may or may not have run: this makes it "released, not queued" either
        way (gives the hold back if it is still there, leaves the queue), tells ``lost`` what
        restores the lock, and lets the error propagate: the wait then takes the lock back,
        as after any wait."""
        lock = self._lock
        hold = lock._current(session)
        depth = hold.count if hold is not None else 0  # release_into zeroes it
        rlock = isinstance(lock, DistRLock)
        try:
            count = yield from release_into(lock, session, "cond_wait", self._keys.state, (wid, ms))
        except (redis.ResponseError, LockNotOwnedError, LockLostError):
            raise
        except BaseException:
            if hold is not None and lost is not None:
                try:
                    held, token = yield Read("HMGET", lock._keys.lock, hold.owner, ":t")
                    if held is not None and token is not None and int(token) == hold.token:
                        yield Run("lock_release", (lock._keys.lock, lock._keys.queue),
                               (hold.owner, hold.token, 0))
                    yield from self._call_leave(wid, True)
                except redis.RedisError:
                    pass
                lost((depth, lock._me()) if rlock else _SELF_RELEASED)
            raise
        if rlock:
            return count, lock._me()  # what DistRLock._release_save returns
        return _SELF_RELEASED

    def _call_leave(self, wid: str, leave: bool) -> Flow[int]:
        return int((yield Run("cond_leave", self._keys.state, (wid, "1" if leave else "0"))))


class _CondWaiting(Waiting):
    """One wait on a condition: join the queue and release the lock (``FIRST``), look whether
    a notify picked us after each sleep, leave the queue at the deadline; a notify's hint that
    names us ends the wait at once. ``saved`` restores the lock afterwards."""

    def __init__(self, cond: DistCondition, session: Session) -> None:
        self.ident = self.wid = f"{session.id}:{os.urandom(8).hex()}"
        self.channel = cond._keys.channel
        self.saved: Any = _NOT_RELEASED
        self._cond = cond
        self._session = session

    def attempt(self, mode: str, waiter: Any) -> Flow[Outcome]:
        if mode == FIRST:
            self.saved = yield from self._cond._join_and_release(self._session, self.wid,
                                                                 self._lost_join)
            return Busy(None)
        last = mode == LAST
        return cond_leave((yield from self._cond._call_leave(self.wid, last)), last)

    def _lost_join(self, saved: Any) -> None:
        self.saved = saved

    def abandon(self) -> Flow[None]:
        if self.saved is not _NOT_RELEASED:  # queued: leave the queue
            yield from self._cond._call_leave(self.wid, True)


def _flows_of(lock: Any, session: Session) -> bool:
    """``lock`` is a distlock lock that talks through ``session``: a condition's flow may run
    the lock's own flows (on the same port) instead of calling its blocking methods."""
    return isinstance(lock, _LockBase) and session_of(lock) is session


def _unchanged(lock: Any, method: str, base: type) -> bool:
    """``lock``'s ``method`` is ``base``'s own (not overridden by a subclass, nor replaced on
    the object): the flow behind it does exactly what it does."""
    return getattr(getattr(lock, method, None), "__func__", None) is getattr(base, method)


class _LocalLeases:
    """The waiters of one condition object in this process, whose leases the session watchdog
    renews together: one script per renewal, however many threads wait.

    The watchdog knows them as one Hold (key: the leases key; owner: the session and this
    object), registered while at least one of them waits.
    """

    __slots__ = ("keys", "ids", "hold", "mutex")

    def __init__(self, keys: CondKeys) -> None:
        self.keys = keys
        self.ids: Set[str] = set()
        self.hold: Optional[Hold] = None
        self.mutex = threading.Lock()

    def add(self, session: Session, wid: str, ms: int, sent_at: float, meter: Any = None) -> None:
        with self.mutex:
            hold = self.hold
            if hold is not None and hold.session is not session:  # a forked child: start afresh
                self.ids.clear()
                hold = self.hold = None
            self.ids.add(wid)
            if hold is None or hold.lost:
                if hold is not None:
                    session.drop_hold(hold)
                hold = self.hold = Hold(session, key=self.keys.leases,
                                        owner=f"{session.id}:waiters:{id(self):x}", token=0, count=1,
                                        watchdog=True, lease_ms=ms, sent_at=sent_at, renew=self.renew,
                                        meter=meter)
                session.add_hold(hold)

    def discard(self, wid: str) -> None:
        with self.mutex:
            self.ids.discard(wid)
            if not self.ids and self.hold is not None:
                self.hold.session.drop_hold(self.hold)
                self.hold = None

    def renew(self, batch: Any, hold: Hold, ms: int) -> None:
        """Queue one renewal of every waiter's lease on ``batch`` (the watchdog's)."""
        with self.mutex:
            ids: List[str] = sorted(self.ids)
        batch.script("cond_renew", self.keys.state, (ms, *ids))
