"""The asyncio DistBarrier and BrokenBarrierError."""

from __future__ import annotations

import asyncio
import threading
from typing import Optional

from .._core.flow import Query, Started
from .._primitives import barrier as _barrier
from ._shell import AsyncShell

#: asyncio's own where it exists (Python 3.11+), else threading's
BrokenBarrierError: type = getattr(asyncio, "BrokenBarrierError", threading.BrokenBarrierError)


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
