"""dogpile.cache on distlock (the ``dogpile`` extra): the lock a region takes to create a
missing or expired value is a DistLock, shared by every process and host of the Redis.

- ``DistlockRedisBackend``, registered as the ``distlock.redis`` backend (entry point group
  ``dogpile.cache``): dogpile's own Redis backend (``dogpile.cache.backends.redis.RedisBackend``:
  same arguments, same storage) whose ``get_mutex(key)`` returns a DistLock named
  ``lock_prefix + key`` (``_lock<key>`` by default) on the backend's own client::

      region = make_region().configure("distlock.redis", arguments={"url": "redis://..."})

  Given none of ``url``, ``host``, ``port`` and ``connection_pool``, it talks to distlock's
  default server (``configure()``, else ``$DISTLOCK_URL``), on that client's connection pool.
  ``distributed_lock`` defaults to True here (False: dogpile's in-process mutex, as in dogpile);
  ``lock_timeout`` is the lease in seconds (default None: the watchdog renews it while the
  process lives, so a slow creator keeps the lock and a dead one gives it up within 30 s);
  ``lock_blocking_timeout`` bounds a blocking acquire; ``lock_sleep``, ``lock_blocking`` and
  ``thread_local_lock`` are accepted and do nothing (waiters are woken by pub/sub, dogpile says
  whether to wait, and any thread may release a DistLock: ``async_creation_runner`` works).
- ``lock_factory``: the read/write lock for dogpile's file backend (``dogpile.cache.dbm``),
  ``DistReadWriteLock.lock_factory``; see docs/guides/dogpile.rst.

Importing this module imports dogpile.cache; ``import distlock`` does not.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import redis
from dogpile.cache.backends.redis import RedisBackend

from distlock import DistLock, DistReadWriteLock
from distlock._core.checks import check_acquire_args, check_lease
from distlock._primitives.rw_mutex import ReadWriteMutex
from distlock._session.config import resolve_client

__all__ = ["DistlockRedisBackend", "DogpileLock", "ReadWriteMutex", "lock_factory"]

#: dogpile.cache's file backend's ``lock_factory``: ``lock_factory(path)`` is a
#: ``ReadWriteMutex`` over ``DistReadWriteLock(path)``; options with ``functools.partial``
lock_factory = DistReadWriteLock.lock_factory


class DogpileLock(DistLock):
    """The dogpile lock of one cache key: a DistLock whose blocking ``acquire()`` waits at most
    the backend's ``lock_blocking_timeout`` unless it is given a timeout of its own. dogpile
    calls ``acquire(wait)``, ``release()`` (from another thread with an
    ``async_creation_runner``, which a DistLock allows) and ``locked()``."""

    def __init__(self, name: str, *, client: Any = None, lease: Optional[float] = None,
                 blocking_timeout: Optional[float] = None) -> None:
        super().__init__(name, client=client, lease=lease)
        self._blocking_timeout = _check_blocking_timeout(blocking_timeout)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if blocking and timeout == -1 and self._blocking_timeout is not None:
            timeout = self._blocking_timeout
        return super().acquire(blocking, timeout)


class DistlockRedisBackend(RedisBackend):
    """dogpile.cache's Redis backend with a DistLock as each key's dogpile lock (see the
    module's docstring for the arguments)."""

    def __init__(self, arguments: Mapping[str, Any]) -> None:
        args: Dict[str, Any] = dict(arguments)
        args.setdefault("distributed_lock", True)
        # a DistLock belongs to its object, not to a thread: dogpile's thread-local redis-py
        # lock (and its warning that it does not suit distributed locks) does not apply
        args["thread_local_lock"] = False
        if not any(args.get(k) is not None for k in ("url", "host", "port", "connection_pool")):
            args["connection_pool"] = _default_pool()
        super().__init__(args)  # type: ignore[no-untyped-call]
        #: the lease of each lock, in seconds; None: the watchdog's
        self.lock_timeout: Optional[float] = check_lease(self.lock_timeout)
        self.lock_blocking_timeout: Optional[float] = _check_blocking_timeout(
            self.lock_blocking_timeout)

    # a CacheMutex by that class' __subclasshook__ (it has acquire and release), not by name
    def get_mutex(self, key: str) -> Optional[DogpileLock]:  # type: ignore[override]
        """A DistLock for ``key`` on this backend's client, or None (dogpile's own in-process
        mutex) when ``distributed_lock`` is False."""
        if not self.distributed_lock:
            return None
        return DogpileLock(self.lock_template.format(key), client=self.writer_client,
                           lease=self.lock_timeout, blocking_timeout=self.lock_blocking_timeout)


def _default_pool() -> Any:
    """The connection pool of distlock's default client (``configure()``, else
    ``$DISTLOCK_URL``, else ``redis://localhost:6379/0``): a backend given no server uses it."""
    client = resolve_client(None)
    if not isinstance(client, redis.Redis):
        raise TypeError("distlock's default client is not a redis.Redis (a cluster?): give "
                        "the distlock.redis backend a url, host or connection_pool")
    return client.connection_pool


def _check_blocking_timeout(value: Any) -> Optional[float]:
    """None, or a non-negative number of seconds (``threading``'s checks and errors)."""
    if value is None:
        return None
    _, seconds = check_acquire_args(True, value)
    if seconds is None:  # -1: threading's "for ever"
        raise ValueError("lock_blocking_timeout must be None or a non-negative number of seconds")
    return seconds
