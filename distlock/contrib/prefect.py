"""Prefect's ``LockManager`` on distlock (the ``prefect`` extra, Python 3.11+): the lock of a
transaction's record (``IsolationLevel.SERIALIZABLE``) is a DistLock, shared by every flow run,
process and host that uses the same Redis::

    from prefect.results import ResultStore
    from distlock.contrib.prefect import DistlockLockManager

    store = ResultStore(lock_manager=DistlockLockManager("redis://..."))

``DistlockLockManager`` follows ``prefect.locking.protocol.LockManager`` and Prefect's own
``MemoryLockManager``: the lock of ``key`` is the DistLock named ``prefix + key`` ("prefect:"
by default), its holder value is Prefect's ``holder``.

- ``acquire_lock`` is idempotent for the holder that has the lock (True at once, as
  ``MemoryLockManager``'s); ``acquire_timeout`` None waits as long as it takes, 0 does not
  wait. ``hold_timeout`` None: the acquiring process' watchdog renews the hold while that
  process lives (Prefect's "indefinitely", bounded by the process: a dead holder's lock frees
  within 30 s); a number: the hold is exported (docs/guides/handles.rst) with that lease, and
  ends by itself then, whatever happens to the process.
- ``release_lock(key, holder)`` raises ValueError, as ``MemoryLockManager``'s does, unless
  ``holder`` holds the lock. Its check and its release are one: the holder value and the
  fencing token are read together (``DistElection.leader()``, one script), and only the hold
  with that token is released, so a hold granted in between is never ended. A hold this
  object took is released as its own (the next waiter is woken); one that another process
  took is ended as ``distlock release --force`` ends it (``contrib._byname``), and if that
  process renews it, its watchdog then reports it lost (a WARNING).
- ``wait_for_lock`` waits until the lock is free, taking and giving it back at once, as
  ``MemoryLockManager``'s does. ``aacquire_lock`` and ``await_for_lock`` wait in a daemon
  thread of their own (an acquire that is cancelled gives back what it took).

The manager pickles (Prefect copies result stores into other processes) when its ``client`` is
a URL or None (distlock's default client, ``configure()`` or ``$DISTLOCK_URL``); the holds a
manager took stay with the original. Importing this module does not import Prefect.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from typing import Any, Callable, Dict, NamedTuple, Optional, TypeVar, Union

from distlock import DistElection, DistLock, LockLostError, LockNotOwnedError

from ._byname import break_hold

__all__ = ["DistlockLockManager"]

T = TypeVar("T")


class _Held(NamedTuple):
    """What this object keeps of a hold it took."""

    token: int
    #: the lock object that holds it (renewed by this process' watchdog), or the handle of
    #: the exported hold
    what: Union[DistLock, str]
    #: when an exported hold ends by itself (time.monotonic())
    until: float = math.inf


class _Call:
    """One ``aacquire_lock``: whether its caller gave up, and what its thread took."""

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.cancelled = False
        self.taken: Optional[str] = None


class DistlockLockManager:
    """Prefect's ``LockManager`` on distlock: see the module's docstring.

    ``client``: a URL, a ``redis.Redis`` (or ``RedisCluster``), or None for distlock's default
    client. ``prefix``: put before each key to make the lock's name."""

    def __init__(self, client: Any = None, *, prefix: str = "prefect:") -> None:
        self.client = client
        self.prefix = prefix
        self._mutex = threading.Lock()
        self._held: Dict[str, _Held] = {}

    def _name(self, key: str) -> str:
        return self.prefix + key

    # --- the protocol -----------------------------------------------------------------------------

    def acquire_lock(self, key: str, holder: str, acquire_timeout: Optional[float] = None,
                     hold_timeout: Optional[float] = None) -> bool:
        """Take the lock of ``key`` for ``holder``: True when it has it (now, or already),
        False when ``acquire_timeout`` seconds passed first."""
        return self._acquire(key, holder, acquire_timeout, hold_timeout, None)

    async def aacquire_lock(self, key: str, holder: str, acquire_timeout: Optional[float] = None,
                            hold_timeout: Optional[float] = None) -> bool:
        """``acquire_lock``, awaited."""
        call = _Call()
        try:
            return await _in_thread(self._acquire, key, holder, acquire_timeout, hold_timeout, call)
        except asyncio.CancelledError:
            with call.mutex:
                call.cancelled = True
                taken = call.taken
            if taken is not None:  # the caller never learns that it holds it: give it back
                self._release_own(self._forget(taken))
            raise

    def release_lock(self, key: str, holder: str) -> None:
        """Release the lock of ``key``, which ``holder`` must hold (else ValueError), from any
        process: see the module's docstring."""
        leader = DistElection(self._name(key), client=self.client).leader()
        if leader is None or leader.value != holder:
            raise ValueError(f"No lock held by {holder} for transaction with key {key}")
        own = self._forget(key)
        if own is not None and own.token == leader.epoch:
            if self._release_own(own):
                return
        elif break_hold(self.client, self._name(key), leader.epoch):
            return
        raise ValueError(f"No lock held by {holder} for transaction with key {key}")

    def is_locked(self, key: str) -> bool:
        """Whether anyone, anywhere, holds the lock of ``key``."""
        return DistLock(self._name(key), client=self.client).locked()

    def is_lock_holder(self, key: str, holder: str) -> bool:
        """Whether ``holder`` holds the lock of ``key`` now."""
        return DistLock(self._name(key), client=self.client).holder() == holder

    def wait_for_lock(self, key: str, timeout: Optional[float] = None) -> bool:
        """Wait until the lock of ``key`` is free (True), at most ``timeout`` seconds (False
        when it is still held then)."""
        return self._wait_for(key, timeout, None)

    async def await_for_lock(self, key: str, timeout: Optional[float] = None) -> bool:
        """``wait_for_lock``, awaited."""
        call = _Call()
        try:
            return await _in_thread(self._wait_for, key, timeout, call)
        except asyncio.CancelledError:
            with call.mutex:
                call.cancelled = True  # its thread stops waiting within a slice
            raise

    def _wait_for(self, key: str, timeout: Optional[float], call: Optional[_Call]) -> bool:
        lock = DistLock(self._name(key), client=self.client)
        if not lock.locked():
            return True
        if not _take(lock, timeout, call):
            return False
        lock.release()
        return True

    # --- holds this object took ---------------------------------------------------------------------

    def _acquire(self, key: str, holder: str, acquire_timeout: Optional[float],
                 hold_timeout: Optional[float], call: Optional[_Call]) -> bool:
        lock = DistLock(self._name(key), client=self.client, lease=hold_timeout, holder=holder)
        if not lock.acquire(blocking=False):
            if lock.holder() == holder:
                return True  # the holder has it already
            if not _take(lock, acquire_timeout, call):
                return False
        token = lock.token
        assert token is not None
        try:
            held = _Held(token, lock) if hold_timeout is None else \
                _Held(token, lock.export(), time.monotonic() + hold_timeout)
        except LockLostError:
            return True  # taken, and its hold_timeout ran out before it could be exported
        with call.mutex if call is not None else contextlib.nullcontext():
            cancelled = call is not None and call.cancelled
            if not cancelled:
                self._keep(key, held)
                if call is not None:
                    call.taken = key
        if cancelled:
            self._release_own(held)
            return False
        return True

    def _keep(self, key: str, held: _Held) -> None:
        with self._mutex:
            self._prune()
            self._held[key] = held

    def _forget(self, key: str) -> Optional[_Held]:
        with self._mutex:
            self._prune()
            return self._held.pop(key, None)

    def _prune(self) -> None:
        """Forget the holds that ended by themselves (a hold_timeout ran out, a lock object's
        hold was lost), so that the table does not grow for ever. Under ``_mutex``."""
        now = time.monotonic()
        for key, held in list(self._held.items()):
            if held.until <= now or (isinstance(held.what, DistLock) and not held.what.owned()):
                del self._held[key]

    def _release_own(self, held: Optional[_Held]) -> bool:
        """Give back a hold this object took; False when it was gone already."""
        if held is None:
            return False
        what = held.what
        try:
            if isinstance(what, DistLock):
                what.release()
            else:
                DistLock.release_handle(what, client=self.client)
        except (LockLostError, LockNotOwnedError):
            return False
        return True

    # --- pickling -------------------------------------------------------------------------------

    def __getstate__(self) -> Dict[str, Any]:
        if self.client is not None and not isinstance(self.client, str):
            raise TypeError("a DistlockLockManager pickles only with a URL (or None) as its client")
        return {"client": self.client, "prefix": self.prefix}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.client = state["client"]
        self.prefix = state["prefix"]
        self._mutex = threading.Lock()
        self._held = {}

    def __eq__(self, other: object) -> bool:
        """Managers of the same locks are equal (Prefect refuses to combine cache policies
        whose lock managers differ)."""
        if not isinstance(other, DistlockLockManager):
            return NotImplemented
        return (self.client, self.prefix) == (other.client, other.prefix)

    def __hash__(self) -> int:
        return hash((type(self), self.prefix))

    def __repr__(self) -> str:
        return f"DistlockLockManager(prefix={self.prefix!r})"


#: how long the thread of an awaited call waits at a time before it looks whether its caller
#: was cancelled: a cancelled call's thread ends within this, without taking the lock
SLICE = 0.25


def _take(lock: DistLock, timeout: Optional[float], call: Optional[_Call] = None) -> bool:
    """Acquire ``lock`` waiting ``timeout`` seconds (None: as long as it takes; 0 or less: no
    wait); for an awaited ``call``, in slices, giving up once the call is cancelled."""
    if timeout is not None and timeout <= 0:
        return lock.acquire(blocking=False)
    if call is None:
        return lock.acquire() if timeout is None else lock.acquire(timeout=timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while not call.cancelled:
        left = SLICE if deadline is None else min(SLICE, deadline - time.monotonic())
        if left <= 0:
            return False
        if lock.acquire(timeout=left):
            return True
    return False


async def _in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a daemon thread of its own, awaited. Not ``asyncio.to_thread``: the
    default executor's threads are joined when ``asyncio.run`` ends and at interpreter exit,
    and a cancelled wait for a lock would hold both up until the lock is free."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: Optional[BaseException]) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        result: Any = None
        error: Optional[BaseException] = None
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            error = exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:
            pass  # the loop is closed: nobody awaits this any more

    threading.Thread(target=run, name="DistlockLockManager-wait", daemon=True).start()
    return await future
