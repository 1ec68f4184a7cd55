"""distlock.asyncio's DistSemaphore, DistBoundedSemaphore, DistEvent and DistBarrier: the
blocking classes' flows, awaited, with ``asyncio``'s semantics."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Optional

from .. import _barrier, _event, _semaphore
from .._flow import Query, Started
from ._shell import AsyncShell, task_ident

__all__ = ["DistSemaphore", "DistBoundedSemaphore", "DistEvent", "DistBarrier", "BrokenBarrierError"]

#: asyncio's own where it exists (Python 3.11+), else threading's
BrokenBarrierError: type = getattr(asyncio, "BrokenBarrierError", threading.BrokenBarrierError)


class DistSemaphore(AsyncShell, _semaphore.DistSemaphore):  # type: ignore[misc]
    """``asyncio.Semaphore`` shared by every process and host that names it on one Redis; the
    same semaphore as ``distlock.DistSemaphore`` of that name. ``acquire`` also takes the
    blocking class' ``blocking`` and ``timeout``; ``release`` its ``n``."""

    async def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:  # type: ignore[override]
        """Take a permit (see the blocking class); a cancelled acquire takes none."""
        return bool(await self._adrive(self._acquire_flow(blocking, timeout)))

    def release(self, n: int = 1) -> Started[None]:  # type: ignore[override]
        """Give ``n`` permits back, at once; await the result for its outcome."""
        return self._start(self._release_flow(n))

    @staticmethod
    def _me() -> Any:
        return task_ident()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.release()


class DistBoundedSemaphore(DistSemaphore, _semaphore.DistBoundedSemaphore):  # type: ignore[misc]
    """``asyncio.BoundedSemaphore`` across processes and hosts: a release beyond the initial
    value raises ValueError (when the returned awaitable is awaited)."""

    def release(self, n: int = 1) -> Started[None]:  # type: ignore[override]
        return self._start(self._release_flow(n))


class DistEvent(AsyncShell, _event.DistEvent):
    """``asyncio.Event`` shared by every process and host that names it on one Redis; the same
    event as ``distlock.DistEvent`` of that name."""

    def is_set(self) -> Query[bool]:  # type: ignore[override]
        """Whether the event is set: ``await event.is_set()``."""
        return self._query(self._is_set_flow)

    def set(self) -> Started[None]:  # type: ignore[override]
        """Set the event, at once: every waiter, anywhere, wakes."""
        return self._start(self._set_flow())

    def clear(self) -> Started[None]:  # type: ignore[override]
        """Clear the event, at once."""
        return self._start(self._clear_flow())

    async def wait(self, timeout: Optional[float] = None) -> bool:  # type: ignore[override]
        """Wait until the event is set (or ``timeout`` seconds, the blocking class' extra);
        True once it is, False on timeout."""
        return bool(await self._adrive(self._wait_flow(timeout)))


class DistBarrier(AsyncShell, _barrier.DistBarrier):
    """``asyncio.Barrier`` shared by every process and host that names it on one Redis; the
    same barrier as ``distlock.DistBarrier`` of that name. Keeps the blocking class' ``action``
    and ``timeout``. A party that is cancelled while the barrier fills leaves it, without
    breaking it, as in asyncio; a timeout breaks it, as in threading. Raises
    ``distlock.asyncio.BrokenBarrierError`` (``asyncio.BrokenBarrierError`` on Python 3.11+)."""

    _leave_mode = "l"

    async def wait(self, timeout: Optional[float] = None) -> int:  # type: ignore[override]
        """Wait until ``parties`` callers, anywhere, wait; return this caller's index."""
        try:
            return int(await self._adrive(self._wait_flow(timeout)))
        except threading.BrokenBarrierError as exc:
            if BrokenBarrierError is threading.BrokenBarrierError:
                raise
            raise BrokenBarrierError(*exc.args) from None

    def n_waiting(self) -> Query[int]:  # type: ignore[override]
        """The number of parties waiting now, anywhere: ``await barrier.n_waiting()``."""
        return self._query(self._n_waiting_flow)

    def broken(self) -> Query[bool]:  # type: ignore[override]
        """Whether the barrier is broken: ``await barrier.broken()``."""
        return self._query(self._broken_flow)

    def reset(self) -> Started[None]:  # type: ignore[override]
        """Reset the barrier, at once (asyncio's ``reset`` is awaited: so may this be)."""
        return self._start(self._reset_flow())

    def abort(self) -> Started[None]:  # type: ignore[override]
        """Break the barrier, at once."""
        return self._start(self._abort_flow())

    async def __aenter__(self) -> int:
        return await self.wait()

    async def __aexit__(self, *exc_info: object) -> None:
        pass
