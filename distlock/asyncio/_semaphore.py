"""distlock.asyncio's DistSemaphore, DistBoundedSemaphore, DistEvent and DistBarrier: the
blocking classes' flows, awaited, with ``asyncio``'s semantics."""

from __future__ import annotations

from typing import Any, Optional

from .._core.flow import Started
from .._primitives import semaphore as _semaphore
from ._shell import AsyncShell, task_ident

__all__ = ["DistSemaphore", "DistBoundedSemaphore"]


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


