"""DistLock and DistRLock: ``threading.Lock`` and ``threading.RLock`` across processes and hosts.

Both keep one Redis hash per name (owner -> reentrancy count, plus the fencing token and the
holder's host:pid) and differ only in who the owner is:

- DistLock: a fresh random owner per hold, kept on the object, so any thread may release it
  and a second acquire from the same thread blocks, as with ``threading.Lock``;
- DistRLock: ``<session id>:<thread ident>``, so the holding thread re-enters (through any
  DistRLock object of that name) and only it may release.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any, Optional, Tuple

from .._core.errors import LockNotOwnedError
from .._core.flow import Flow
from .._redis.clients import ClientArg
from .._session.session import Hold, Session
from .fair import end_whole_fair
from .handles import Handles
from .lock_base import _UNSET, _end_whole, _LockBase


def lock_repr(obj: object, kind: str, name: str, locked: bool, extra: str = "") -> str:
    """``<locked distlock.DistRLock object name='orders:42' owner=… count=… at 0x…>``."""
    state = "locked" if locked else "unlocked"
    extra = f" {extra}" if extra else ""
    return f"<{state} distlock.{kind} object name={name!r}{extra} at {hex(id(obj))}>"


__all__ = ["DistLock", "DistRLock"]


class DistLock(Handles, _LockBase):
    """``threading.Lock`` shared by every process and host that names it on one Redis.

    The hold belongs to this object: any thread of this process may release it, and a second
    ``acquire()`` from the same thread blocks until somebody releases it.

    Keyword-only options: ``client`` (a ``redis.Redis`` or a URL; default: see ``configure``),
    ``lease`` (None: a watchdog keeps the hold alive while the process lives; a number of
    seconds: the hold expires by itself after that long), ``min_replicas`` /
    ``replica_timeout`` (a grant counts only once that many replicas acknowledged it within
    that many seconds, else acquire raises NotEnoughReplicasError; default: ``configure()``'s,
    0 and 0.5 s; see docs/guides/replicas.rst), and ``fair`` (True: first come, first served
    across every host, and a release hands the lock straight to the first waiter; see
    docs/guides/locks.rst, "Fair locks"). TypeError when ``fair`` is not a bool. ``holder``:
    a small value (a task id, a worker's name; at most 1024 characters) that each hold carries
    for ``holder()``, ``distlock status`` and whoever adopts it.

    A hold can change hands: ``export()`` detaches it as a handle (a str) that ``adopt`` or
    ``release_handle`` take elsewhere, token-checked (docs/guides/handles.rst).
    """

    _metric_kind = "lock"

    _reentrant = "0"
    _unowned_message = "release unlocked lock"

    def __init__(self, name: str, *, client: ClientArg = None, lease: Optional[float] = None,
                 min_replicas: Optional[int] = None, replica_timeout: Optional[float] = None,
                 fair: bool = False, max_hold: Optional[float] = None,
                 holder: Optional[str] = None) -> None:
        super().__init__(name, client=client, lease=lease, min_replicas=min_replicas,
                         replica_timeout=replica_timeout, fair=fair, max_hold=max_hold)
        self._set_holder(holder)
        self._hold: Optional[Hold] = None
        self._mutex = threading.Lock()
        # refers to the keys, not to this object, so that an abandoned object can be collected
        self._end_fn = (functools.partial(end_whole_fair, self._fair_keys) if self._fair
                        else functools.partial(_end_whole, self._keys))

    def __del__(self) -> None:
        # Garbage collected while it holds (as filelock does): nobody can release this hold
        # any more, so the watchdog gives it back instead of renewing it for ever.
        hold = getattr(self, "_hold", None)
        if hold is not None and not hold.lost:
            hold.session.watchdog.abandon(hold)

    def release(self) -> None:
        """Release the lock; any thread may do it, as with ``threading.Lock``.

        Raise LockNotOwnedError (a RuntimeError) when this object does not hold the lock, and
        LockLostError when its lease was lost meanwhile (the lock is then someone else's or
        free, and stays as it is).
        """
        self._drive(self._release_one())

    def _release_one(self) -> Flow[None]:
        session = self._session()
        with self._mutex:
            hold = self._hold
            if hold is None or hold.session is not session:
                raise LockNotOwnedError(self._unowned_message, name=self._name)
            self._hold = None
        yield from self._release(hold, session, 1)

    def _owner_for(self, session: Session) -> str:
        hold_id = os.urandom(6).hex()
        if hold_id.isdigit():
            # one draw in about 280: twelve digits would read as a thread ident (distlock status
            # could not tell the kind, _inspect.guess_kind)
            hold_id = "f" + hold_id[1:]
        return f"{session.id}:{hold_id}"

    def _current(self, session: Session) -> Optional[Hold]:
        hold = self._hold
        return hold if hold is not None and hold.session is session else None

    def _remember(self, hold: Hold) -> None:
        with self._mutex:
            self._hold = hold

    def _forget(self, hold: Hold) -> None:
        with self._mutex:
            if self._hold is hold:
                self._hold = None

    def __repr__(self) -> str:
        session = self._peek_session()
        held = session is not None and self._current(session) is not None
        return lock_repr(self, f"{self._repr_prefix}DistLock", self._name, held)


class _ThreadOwned(_LockBase):
    """``threading.RLock``'s ownership for any primitive held per thread.

    The owner is this process' session and the calling thread; its holds live in the session's
    registry, keyed by (``_hold_key``, owner), so every object of one name shares them. Provides
    ``release`` and the protocol ``threading.Condition`` uses: ``_is_owned``,
    ``_recursion_count``, ``_release_save`` and ``_acquire_restore``.
    """

    _reentrant = "1"
    _unowned_message = "cannot release un-acquired lock"

    def release(self) -> None:
        """Release one level of the calling thread's hold; the last one ends it.

        Raise LockNotOwnedError (a RuntimeError) when the calling thread does not hold it, and
        LockLostError when its lease was lost meanwhile.
        """
        self._drive(self._release_one())

    def _release_one(self) -> Flow[None]:
        session = self._session()
        hold = self._current(session)
        if hold is None:
            raise LockNotOwnedError(self._unowned_message, name=self._name)
        yield from self._release(hold, session, 1)

    def _is_owned(self) -> bool:
        """``threading``'s sense: this thread acquired and has not released. A hold whose
        lease ran out is still this thread's to release (its release raises LockLostError),
        unlike one found lost by the server; ``owned()`` is the belief rule's answer."""
        hold = self._current(self._session())
        return hold is not None and (not hold.lost or hold.ran_out)

    def _recursion_count(self) -> int:
        hold = self._current(self._session())
        return hold.count if hold is not None else 0

    def _release_save(self) -> Tuple[int, int]:
        """Release the calling thread's hold whatever its depth; return what restores it."""
        return self._drive(self._release_all())

    def _release_all(self) -> Flow[Tuple[int, Any]]:
        session = self._session()
        hold = self._current(session)
        if hold is None:
            raise LockNotOwnedError(self._unowned_message, name=self._name)
        count = hold.count
        yield from self._release(hold, session, 0)
        return count, self._me()

    def _acquire_restore(self, state: Tuple[int, int]) -> None:
        """Take the hold back at the depth ``_release_save`` returned (a new grant, new token)."""
        self._drive(self._restore(state))

    def _restore(self, state: Tuple[int, Any]) -> Flow[bool]:
        count, _owner = state
        return (yield from self._acquire(True, None, _UNSET, count))

    @staticmethod
    def _me() -> Any:
        """Who owns a hold: the calling thread (the asyncio shell: the current task)."""
        return threading.get_ident()

    #: the class name in a repr
    _kind = ""
    #: the owner a repr shows when nobody of this shell holds it
    _nobody: Any = 0

    @staticmethod
    def _owner_label(ident: str) -> Any:
        """The owner a repr shows for a holder id's last part, or None when it is not one of
        this shell's owners (a thread ident here; a task's in the asyncio shell)."""
        return int(ident) if ident.isdigit() else None

    def __repr__(self) -> str:
        session = self._peek_session()
        owner, count = self._nobody, 0
        if session is not None:
            for (key, holder), hold in list(session.holds.items()):
                if key == self._hold_key and not hold.lost:
                    label = self._owner_label(holder.rsplit(":", 1)[1])
                    if label is not None:
                        owner, count = label, hold.count
                        break
        return lock_repr(self, f"{self._repr_prefix}{self._kind}", self._name, count > 0,
                         f"owner={owner} count={count}")

    def _owner_for(self, session: Session) -> str:
        return f"{session.id}:{self._me()}"

    def _current(self, session: Session) -> Optional[Hold]:
        return session.holds.get((self._hold_key, f"{session.id}:{self._me()}"))

    def _remember(self, hold: Hold) -> None:
        pass  # the session's registry is where thread-owned holds live

    def _forget(self, hold: Hold) -> None:
        pass


class DistRLock(_ThreadOwned):
    """``threading.RLock`` shared by every process and host that names it on one Redis.

    The owner is this process' session and the calling thread: that thread may re-enter (through
    this or any other DistRLock of the same name), and only it may release. The count lives in
    Redis. Implements ``_is_owned``, ``_release_save``, ``_acquire_restore`` and
    ``_recursion_count``, so ``threading.Condition(DistRLock(name))`` works.

    Keyword-only options: as DistLock's (``client``, ``lease``, ``min_replicas``,
    ``replica_timeout``, ``fair``). A re-entry is no grant: it waits for no replica; with
    ``fair=True`` it never queues.
    """

    _metric_kind = "rlock"

    _kind = "DistRLock"


# --- for the modules built on the locks (the condition, the command line) ---------------------


