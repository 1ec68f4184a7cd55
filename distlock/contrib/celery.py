"""celery-once and celery-singleton on distlock (the ``celery`` extra): the lock that keeps a
task from being queued twice is a DistLock, taken by the producer in ``apply_async`` and ended
by the worker that ran the task, another process, usually on another host.

- ``OnceBackend``, celery-once's backend::

      app.conf.ONCE = {"backend": "distlock.contrib.celery.OnceBackend",
                       "settings": {"url": "redis://...", "default_timeout": 3600}}

  ``raise_or_lock(key, timeout)`` takes the DistLock named ``key`` with a lease of ``timeout``
  seconds and exports it (docs/guides/handles.rst): the producer neither renews it nor gives it
  back at exit, so the hold outlives the producer until the worker's ``clear_lock(key)`` or
  its lease. A taken lock raises ``celery_once.AlreadyQueued`` with the seconds its lease has
  left. Settings: ``url`` (a URL; absent: distlock's default client, ``configure()`` or
  ``$DISTLOCK_URL``), ``blocking`` and ``blocking_timeout`` (wait that long for the lock, as
  celery-once's Redis backend does).
- ``SingletonBackend``, celery-singleton's ``singleton_backend_class``: ``lock(lock, task_id,
  expiry)`` takes the DistLock named ``lock`` with the task id as its holder value and a lease
  of ``expiry`` seconds (None: ``default_expiry``, an hour), exported likewise; ``get(lock)``
  is the holder value (the queued task's id); ``unlock(lock)`` and ``clear(key_prefix)``.

``clear_lock``, ``unlock`` and ``clear`` end a hold by its **name**, as these protocols define
it (their Redis backends DEL the key): whoever holds the name then loses it, even a producer
that took it again after the first hold's lease ran out. The break is ``distlock release
--force``'s, token-checked against the hold it read (``contrib._byname``). Code that has the
handle (``raise_or_lock`` and ``DistLock.export`` return it) ends exactly its own hold, with
``DistLock.release_handle(handle)``.

Importing this module imports neither celery nor the adapted libraries: ``AlreadyQueued`` is
imported when a lock is found taken.
"""

from __future__ import annotations

from typing import Any, Mapping, NoReturn, Optional
from urllib.parse import urlsplit

from distlock import DistElection, DistLock

from .._redis.urls import client_from_url
from ._byname import break_hold, names_under

__all__ = ["OnceBackend", "SingletonBackend"]

#: the holder value of celery-once's holds (``distlock status`` shows it)
ONCE_HOLDER = "celery-once"


class OnceBackend:
    """celery-once's locking backend on distlock (see the module's docstring). celery-once makes
    one for every use, so making one connects nothing: clients are distlock's, one per URL."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.client: Optional[str] = settings.get("url")
        self.blocking = bool(settings.get("blocking", False))
        self.blocking_timeout = float(settings.get("blocking_timeout", 1))

    def raise_or_lock(self, key: str, timeout: float) -> str:
        """Take the lock ``key`` for ``timeout`` seconds, detached from this process, and
        return its handle; ``celery_once.AlreadyQueued(seconds left)`` when it is taken."""
        lock = DistLock(key, client=self.client, lease=timeout, holder=ONCE_HOLDER)
        for _ in range(2):  # a second try when the hold ended between the try and the look
            if lock.acquire(self.blocking, self.blocking_timeout if self.blocking else -1):
                return lock.export()
            leader = DistElection(key, client=self.client).leader()
            if leader is not None:
                _already_queued(leader.ttl)
        _already_queued(0.0)

    def clear_lock(self, key: str) -> bool:
        """End whatever hold the lock ``key`` has now: a release by name (see the module's
        docstring). True when a hold was ended."""
        return break_hold(self.client, key)


def _already_queued(countdown: float) -> NoReturn:
    from celery_once import AlreadyQueued  # type: ignore[import-untyped,import-not-found,unused-ignore]

    raise AlreadyQueued(countdown)


def _redis_url(url: Any) -> bool:
    scheme = urlsplit(url).scheme if isinstance(url, str) else ""
    return scheme.split("+")[0] in ("redis", "rediss", "unix")


class SingletonBackend:
    """celery-singleton's backend on distlock (see the module's docstring).

    ``SingletonBackend(url, **kwargs)``, as celery-singleton makes it from
    ``singleton_backend_url`` (else the result backend's or the broker's URL) and
    ``singleton_backend_kwargs``. A URL that is no Redis URL (a ``memory://`` or ``amqp://``
    broker's) means distlock's default client (``configure()``, ``$DISTLOCK_URL``). ``kwargs``
    go to redis-py for a client of this backend's own, except ``default_expiry``: the lease,
    in seconds, of a lock taken with no expiry (a detached hold needs one; default 3600)."""

    DEFAULT_EXPIRY = 3600.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        url = args[0] if args else kwargs.pop("url", None)
        self.default_expiry = float(kwargs.pop("default_expiry", self.DEFAULT_EXPIRY))
        url = url if _redis_url(url) else None
        self.client: Any = client_from_url(url, **kwargs) if url is not None and kwargs else url

    def lock(self, lock: str, task_id: str, expiry: Optional[float] = None) -> bool:
        """Take the lock ``lock`` for the task ``task_id`` (its holder value) for ``expiry``
        seconds, detached from this process; False when it is taken."""
        lease = self.default_expiry if expiry is None else expiry
        held = DistLock(lock, client=self.client, lease=lease, holder=task_id)
        if not held.acquire(blocking=False):
            return False
        held.export()
        return True

    def unlock(self, lock: str) -> None:
        """End whatever hold the lock ``lock`` has now: a release by name."""
        break_hold(self.client, lock)

    def get(self, lock: str) -> Optional[str]:
        """The id of the task that holds ``lock``, or None when it is free."""
        return DistLock(lock, client=self.client).holder() or None

    def clear(self, key_prefix: str) -> None:
        """End the hold of every lock whose name starts with ``key_prefix``."""
        for name in names_under(self.client, key_prefix):
            break_hold(self.client, name)
