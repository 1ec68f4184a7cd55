"""distlock.asyncio's DistCondition and DistReadWriteLock."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Optional, TypeVar

from .._core.checks import check_name, refuse_max_hold
from .._core.flow import Query, Started
from .._core.replicas import refuse_options
from .._primitives import condition as _condition
from .._primitives import lock as _lock
from .._primitives.lock_base import _UNSET
from .._redis.clients import check_async_client
from ._lock import DistLock, DistRLock, _AsyncLock
from ._shell import AsyncShell

__all__ = ["DistCondition"]

T = TypeVar("T")


class DistCondition(AsyncShell, _condition.DistCondition):
    """``asyncio.Condition`` shared by every process and host that names it on one Redis; the
    same condition as ``distlock.DistCondition`` of that name.

    ``lock`` is a ``distlock.asyncio`` lock (a DistLock, a DistRLock, or a side of a
    DistReadWriteLock); by default a DistLock of the same name, as asyncio's default is a
    Lock. ``wait`` releases it and joins the queue in one script, as the blocking class does.
    """

    _atomic_types = (DistLock, DistRLock)

    def __init__(self, name: str, lock: Any = None, *, client: Any = None,
                 min_replicas: Any = None, replica_timeout: Any = None,
                 max_hold: Optional[float] = None) -> None:
        check_name(name)
        refuse_options(type(self).__name__, min_replicas, replica_timeout)
        refuse_max_hold(lock, max_hold)
        if client is not None:  # before the default lock's own check, which names DistLock
            check_async_client(client, type(self).__name__)
        if lock is None:
            lock = DistLock(name, client=client, max_hold=max_hold)
        elif not isinstance(lock, _AsyncLock):
            raise TypeError("lock must be a distlock.asyncio lock (DistLock, DistRLock, or a side "
                            f"of a DistReadWriteLock), not {type(lock).__name__}")
        super().__init__(name, lock, client=client)

    def _session(self) -> Any:
        if self._client_arg is None:
            return self._lock._session()
        return super()._session()

    def _release_save_flow(self, session: Any) -> Any:
        """The lock's own flows, always: an asyncio lock has no blocking methods to call."""
        lock = self._lock
        if isinstance(lock, _lock._ThreadOwned):
            return (yield from lock._release_all())
        yield from lock._release_one()
        return None

    def _acquire_restore_flow(self, session: Any, saved: Any) -> Any:
        """Take the lock back at the end of a wait. Cancelled meanwhile, go on taking it, and
        raise the cancellation once it is held, as ``asyncio.Condition.wait`` does: the caller's
        ``async with`` then releases a lock it holds."""
        lock = self._lock
        cancelled: Optional[BaseException] = None
        while True:
            try:
                if isinstance(lock, _lock._ThreadOwned) and isinstance(saved, tuple) \
                        and saved is not _condition._SELF_RELEASED:
                    yield from lock._restore(saved)
                else:
                    yield from lock._acquire(True, None, _UNSET, 1)
                break
            except asyncio.CancelledError as exc:  # the try left nothing behind: try again
                cancelled = exc
        if cancelled is not None:
            raise cancelled

    def locked(self) -> Query[bool]:
        """Whether anyone holds the lock: ``await cond.locked()``."""
        return self._lock.locked()  # type: ignore[no-any-return]

    async def wait(self, timeout: Optional[float] = None) -> bool:  # type: ignore[override]
        """Release the lock, wait until notified (or ``timeout`` seconds, the blocking class'
        extra), take the lock back; True when notified. A cancelled wait takes the lock back
        before the cancellation propagates, as asyncio's does."""
        return bool(await self._adrive(self._wait_flow(timeout)))

    async def wait_for(self, predicate: Callable[[], T], timeout: Optional[float] = None) -> T:  # type: ignore[override]
        """Wait until ``predicate()`` (a plain callable) is true; return its last result."""
        return await self._adrive(self._wait_for_flow(predicate, timeout))  # type: ignore[no-any-return]

    def notify(self, n: int = 1) -> Started[None]:  # type: ignore[override]
        """Wake ``n`` waiters, anywhere, at once. RuntimeError here unless the lock is held."""
        return self._start(self._notify_flow(n))

    def notify_all(self) -> Started[None]:  # type: ignore[override]
        """Wake every waiter, anywhere, at once."""
        return self._start(self._notify_all_flow())

    async def __aenter__(self) -> None:
        await self._lock.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        await self._lock.release()


