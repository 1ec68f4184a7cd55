"""The asyncio DistReadWriteLock and its two sides."""

from __future__ import annotations

from typing import Any, Optional

from .._core.checks import check_lease, check_name
from .._core.keys import RWKeys
from .._core.settings import settings
from .._primitives import rwlock as _rwlock
from .._redis.clients import check_async_client
from ._lock import _AsyncLock
from ._shell import task_ident


class _AsyncSide(_AsyncLock):
    @staticmethod
    def _me() -> Any:
        return task_ident()


class DistReadLock(_AsyncSide, _rwlock.DistReadLock):  # type: ignore[misc]
    """The read side of a ``distlock.asyncio.DistReadWriteLock`` (owned by the task)."""


class DistWriteLock(_AsyncSide, _rwlock.DistWriteLock):  # type: ignore[misc]
    """The write side of a ``distlock.asyncio.DistReadWriteLock`` (owned by the task). A task
    that holds only the read side gets False from a single try (``blocking=False``,
    ``timeout=0``, ``try_lock()``) and RuntimeError from a try that would wait."""


class DistReadWriteLock(_rwlock.DistReadWriteLock):
    """The blocking DistReadWriteLock's semantics for tasks: ``read_lock()`` and
    ``write_lock()`` return its two sides, each with ``distlock.asyncio.DistRLock``'s surface
    (``await side.acquire()``, ``async with side``, ``side.release()``); the same lock as
    ``distlock.DistReadWriteLock`` of that name."""

    def __init__(self, name: str, *, client: Any = None, lease: Optional[float] = None,
                 min_replicas: Optional[int] = None, replica_timeout: Optional[float] = None,
                 max_hold: Optional[float] = None) -> None:
        self._name = check_name(name)
        check_lease(lease)
        if client is not None:  # before the sides' own checks, which name DistReadLock
            check_async_client(client, "DistReadWriteLock")
        rw = RWKeys.of(settings().prefix, self._name)
        self._read = DistReadLock(self._name, rw, client=client, lease=lease, max_hold=max_hold,
                                  min_replicas=min_replicas, replica_timeout=replica_timeout)
        self._write = DistWriteLock(self._name, rw, client=client, lease=lease, max_hold=max_hold,
                                    min_replicas=min_replicas, replica_timeout=replica_timeout)

    def __repr__(self) -> str:
        return f"<distlock.asyncio.DistReadWriteLock object name={self._name!r} at {hex(id(self))}>"
