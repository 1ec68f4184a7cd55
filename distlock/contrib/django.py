"""django-redis's cache backend whose ``cache.lock()`` is a distlock lock (the ``django`` extra).

``BACKEND: "distlock.contrib.django.RedisCache"`` in ``CACHES`` is ``django_redis.cache.RedisCache``
in every other respect. ``cache.lock(key, version=None, timeout=None, sleep=0.1, blocking=True,
blocking_timeout=None, client=None, thread_local=True)`` keeps django-redis's signature and
returns a ``DjangoLock``: a DistLock named by the cache's ``make_key(key, version)``, on the
cache's write client (or ``client``), which also speaks the redis-py ``Lock`` API that
django-redis users call. What differs from redis-py's Lock:

- ``timeout`` is the lease in seconds; None (the default) is the watchdog, which renews the hold
  while the process lives (redis-py's: never expires).
- ``sleep`` is checked and ignored: waiters are woken by pub/sub, they do not poll.
  ``thread_local`` is ignored: the hold belongs to the lock object, any thread may release it
  (redis-py's ``thread_local=False``).
- ``acquire(blocking=None, timeout=-1, *, sleep=None, blocking_timeout=None, token=None)``:
  positional arguments are ``threading``'s (redis-py's first one is ``sleep``); ``token=``
  raises TypeError, since distlock gives each hold its own owner id and fencing token
  (``lock.token``, an int): hand a hold to another process with ``export()`` / ``adopt()``.
- ``extend(additional_time, replace_ttl=False)`` is token-checked in Redis, in one round trip;
  the time is added to what is left of the lease as this process counts it (never more than
  the server's TTL). On a watchdog hold (``timeout=None``, where redis-py raises LockError)
  it is a renewal now: the watchdog keeps extending the hold for as long as the process lives,
  and ``extend`` answers whether it is still this lock's.
- ``owned()`` needs no round trip (distlock's belief rule: docs/safety.rst); ``locked()`` asks
  Redis whether anyone holds it, as redis-py's does.
- ``with lock:`` gives the lock, or raises LockError when ``blocking_timeout`` ran out.

Errors are both distlock's and redis-py's: ``LockNotOwnedError`` here is a
``distlock.LockNotOwnedError`` (a RuntimeError) and a ``redis.exceptions.LockNotOwnedError``
(a ``LockError``, a ValueError); ``LockLostError`` is a ``distlock.LockLostError`` and this
LockNotOwnedError; ``LockError`` (a failed ``with``) is a DistLockError and redis-py's LockError.
See docs/guides/django.rst. Importing this module imports Django and django-redis;
``import distlock`` does not.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, TypeVar

import redis
from django_redis.cache import RedisCache as _DjangoRedisCache

import distlock
from distlock import DistLock
from distlock._core.checks import check_acquire_args, check_seconds
from distlock._core.deadlines import lease_ms
from distlock._core.flow import Flow, Run
from distlock._core.settings import settings

__all__ = ["RedisCache", "DjangoLock", "LockError", "LockNotOwnedError", "LockLostError"]

T = TypeVar("T")

#: ``acquire(token=...)``
TOKEN_REFUSED = ("acquire(token=...) is not supported: distlock gives each hold its own owner id "
                 "and fencing token (lock.token); hand a hold to another process with "
                 "lock.export() and DistLock.adopt()")


class LockError(distlock.DistLockError, redis.exceptions.LockError):
    """``with lock:`` could not take the lock within ``blocking_timeout`` (or at once, with
    ``blocking=False``), as redis-py's ``Lock.__enter__`` raises."""


class LockNotOwnedError(distlock.LockNotOwnedError, redis.exceptions.LockNotOwnedError):
    """An owner-only call (``release``, ``extend``, ``reacquire``) on a lock this object does
    not hold: ``except distlock.LockNotOwnedError``, ``except RuntimeError`` and redis-py's
    ``except LockError`` / ``LockNotOwnedError`` all catch it."""

    def __init__(self, message: str = "", *, name: Optional[str] = None,
                 token: Optional[int] = None) -> None:
        super().__init__(message, name=name, token=token)
        self.message, self.lock_name = message, name  # redis-py's LockError attributes


class LockLostError(distlock.LockLostError, LockNotOwnedError):
    """The hold's lease ran out, or someone else holds the lock now (redis-py: "no longer
    owned")."""


class DjangoLock(DistLock):
    """The lock ``cache.lock()`` returns: a DistLock with redis-py's Lock API on top (see the
    module's docstring)."""

    def __init__(self, name: str, *, client: Any = None, timeout: Optional[float] = None,
                 sleep: float = 0.1, blocking: bool = True, blocking_timeout: Optional[float] = None,
                 thread_local: bool = True) -> None:
        lease = None if timeout is None else check_seconds(timeout, "timeout")
        super().__init__(name, client=client, lease=lease)
        #: redis-py's attributes, as given (``timeout`` is the lease; None: the watchdog)
        self.timeout = lease
        self.sleep = _check_sleep(sleep)
        self.blocking = bool(blocking)
        self.blocking_timeout = _check_blocking_timeout(blocking_timeout)
        self.thread_local = bool(thread_local)

    def acquire(self, blocking: Any = None, timeout: Any = -1, *, sleep: Any = None,
                blocking_timeout: Any = None, token: Any = None) -> bool:
        """Take the lock: ``threading``'s ``acquire(blocking, timeout)``, or redis-py's
        keywords. ``blocking`` None and no timeout: the defaults given to ``cache.lock()``.
        ``blocking_timeout`` (redis-py's) and ``timeout`` (threading's) are the same thing:
        give one. Return True when taken, False when the wait ran out or a single try failed."""
        if token is not None:
            raise TypeError(TOKEN_REFUSED)
        if sleep is not None:
            _check_sleep(sleep)
        if blocking is None:
            blocking = self.blocking
        untimed = isinstance(timeout, (int, float)) and timeout == -1
        if blocking_timeout is not None:
            if not untimed:
                raise TypeError("give acquire() a timeout or a blocking_timeout, not both")
            waited = _check_blocking_timeout(blocking_timeout)
            if blocking:  # redis-py: a single try ignores the blocking timeout
                timeout = waited
        elif untimed and blocking and self.blocking_timeout is not None:
            timeout = self.blocking_timeout
        return super().acquire(blocking, timeout)

    def release(self) -> None:
        """Release the lock; any thread may. LockNotOwnedError when this object does not hold
        it, LockLostError when its lease was lost meanwhile (both also redis-py's errors)."""
        _errors_of_both(super().release)

    def extend(self, additional_time: float, replace_ttl: bool = False) -> bool:
        """Lengthen the hold's lease by ``additional_time`` seconds (``replace_ttl``: set it
        to that), token-checked; on a watchdog hold, renew it now. Return True;
        LockNotOwnedError when this object holds nothing, LockLostError when the hold is gone
        or someone else's."""
        seconds = check_seconds(additional_time, "additional_time")
        return _errors_of_both(lambda: self._drive(self._extend(seconds, bool(replace_ttl))))

    def reacquire(self) -> bool:
        """Reset the hold's lease to ``timeout`` (a watchdog hold: renew it now), token-checked,
        as redis-py's ``reacquire``. Return True; the errors of ``extend``."""
        return _errors_of_both(lambda: self._drive(self._extend(None, True)))

    def __enter__(self) -> DjangoLock:  # type: ignore[override]  # redis-py's: the lock
        if self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", self.name)

    def _extend(self, seconds: Optional[float], replace: bool) -> Flow[bool]:
        session = self._session()
        hold = self._current(session)
        if hold is None:
            raise distlock.LockNotOwnedError("cannot extend an unlocked lock", name=self.name)
        if session.ran_out(hold):  # lost, or past its local deadline
            raise distlock.LockLostError(f"lease on {self.name!r} was lost before extend",
                                         name=self.name, token=hold.token, cause=hold.cause)
        if hold.watchdog:
            ms = lease_ms(settings().lease)
        elif seconds is None:
            ms = lease_ms(self._lease or settings().lease)
        elif replace:
            ms = lease_ms(seconds)
        else:  # what is left as this process counts it (it counts from the grant's send)
            ms = max(0, int((hold.expires_at - time.monotonic()) * 1000)) + lease_ms(seconds)
        sent_at = time.monotonic()
        if int((yield from self._renew_to(hold.owner, hold.token, ms))) != 1:
            session.mark_lost(hold, "extend() found it gone or someone else's")
            raise distlock.LockLostError(f"lease on {self.name!r} was lost before extend",
                                         name=self.name, token=hold.token, cause=hold.cause)
        hold.lease_ms = ms
        hold.expires_at = sent_at + ms / 1000.0 - session.executor.margin(ms)
        return True

    def _renew_to(self, owner: str, token: int, ms: int) -> Flow[Any]:
        keys = self._keys
        return (yield Run("lock_renew", (keys.lock, keys.fence),
                          (owner, token, ms, ms + settings().fence_retention_ms)))

    @classmethod
    def _from_handle(cls, name: str, client: Any, lease: Optional[float]) -> DjangoLock:
        return cls(name, client=client, timeout=lease)

    def __repr__(self) -> str:
        return super().__repr__().replace("distlock.DistLock ", "distlock.contrib.django.DjangoLock ", 1)


class RedisCache(_DjangoRedisCache):  # type: ignore[misc]  # django-redis has no type hints
    """django-redis's ``RedisCache`` whose ``lock()`` returns a ``DjangoLock``."""

    def lock(self, key: str, version: Optional[int] = None, timeout: Optional[float] = None,
             sleep: float = 0.1, blocking: bool = True, blocking_timeout: Optional[float] = None,
             client: Any = None, thread_local: bool = True) -> DjangoLock:
        """django-redis's ``cache.lock()``, the same arguments: a DjangoLock on ``client``
        (default: the cache's write client) named by ``make_key(key, version)``."""
        if client is None:
            client = self.client.get_client(write=True)
        name = str(self.client.make_key(key, version=version))
        return DjangoLock(name, client=client, timeout=timeout, sleep=sleep, blocking=blocking,
                          blocking_timeout=blocking_timeout, thread_local=thread_local)


def _errors_of_both(call: Callable[[], T]) -> T:
    """``call()``, with distlock's ownership errors raised as this module's, which redis-py's
    ``except LockError`` catches too."""
    try:
        return call()
    except distlock.LockLostError as exc:
        if isinstance(exc, LockLostError):
            raise
        raise LockLostError(str(exc), name=exc.name, token=exc.token, cause=exc.cause) from None
    except distlock.LockNotOwnedError as exc:
        if isinstance(exc, LockNotOwnedError):
            raise
        raise LockNotOwnedError(str(exc), name=exc.name, token=exc.token) from None


def _check_sleep(value: Any) -> float:
    """redis-py's ``sleep``: a non-negative number (accepted, not used)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"sleep must be a number of seconds, not {type(value).__name__}")
    if not value >= 0:
        raise ValueError("sleep must not be negative")
    return float(value)


def _check_blocking_timeout(value: Any) -> Optional[float]:
    """None (wait for as long as it takes), or a non-negative number of seconds."""
    if value is None:
        return None
    _, seconds = check_acquire_args(True, value)  # threading's TypeError and ValueError
    if seconds is None:  # -1, threading's "for ever"
        raise ValueError("blocking_timeout must be None or a non-negative number of seconds")
    return seconds
