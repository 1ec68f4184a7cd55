"""distlock.asyncio's DistElection: the blocking election's flows, awaited.

``campaign``, ``resign`` and ``leader`` are coroutines, ``observe`` an asynchronous iterator;
``is_leader`` and ``valid_for`` need no round trip and stay plain calls. ``on_revoked``
callbacks run in the loop, a coroutine function's as a task.
"""

from __future__ import annotations

import inspect
from typing import Any, AsyncIterator, Callable, Optional

from .._core.checks import check_seconds
from .._primitives import election as _election
from .._primitives.election import _QUIET, Leader, Leadership
from ._bound import BoundHold
from ._lock import _AsyncLock

__all__ = ["DistElection", "Leadership", "Leader"]


class _AsyncCandidate(_AsyncLock, _election._Candidate):  # type: ignore[misc]
    """The asyncio lock a DistElection campaigns with."""


class DistElection(_election.DistElection):
    """One leader at a time among every process that campaigns for ``name``: the blocking
    class' election (the same election as ``distlock.DistElection`` of that name), awaited.
    ``client`` is a ``redis.asyncio.Redis`` or a URL."""

    _candidate_class = _AsyncCandidate

    async def campaign(self, value: str = "", *, timeout: Optional[float] = None) -> Leadership:  # type: ignore[override]
        """Wait until this process leads; see the blocking class. A cancelled campaign leaves
        no leadership and no waiter entry behind."""
        return await self._lock._adrive(self._campaign(value, timeout))  # type: ignore[attr-defined,no-any-return]

    async def resign(self) -> None:  # type: ignore[override]
        """Give the leadership up; see the blocking class."""
        release: Any = self._lock.release()  # type: ignore[func-returns-value]  # LockNotOwnedError here
        self._leadership = None
        await release

    async def leader(self) -> Optional[Leader]:  # type: ignore[override]
        """Who leads now (one round trip): a ``Leader``, or None."""
        return await self._lock._adrive(self._look())  # type: ignore[attr-defined,no-any-return]

    async def observe(self, timeout: Optional[float] = None) -> AsyncIterator[Optional[Leader]]:  # type: ignore[override]
        """Yield the current leader, then each change of leader; see the blocking class."""
        seconds = None if timeout is None else check_seconds(timeout, "timeout")
        last: Any = _QUIET
        while True:
            found = await self._lock._adrive(self._next_change(last, seconds))  # type: ignore[attr-defined]
            if found is _QUIET:
                return
            last = found
            yield found

    def on_revoked(self, callback: Callable[[Any], Any]) -> None:
        """Call ``callback(election)`` in the loop when a leadership is found lost (a
        coroutine function's coroutine runs as a task)."""
        if inspect.iscoroutinefunction(callback):
            async def revoked(_lock: Any) -> Any:
                return await callback(self)
            self._lock.on_lost(revoked)
        else:
            super().on_revoked(callback)

    def bound(self, value: str = "", *, timeout: Optional[float] = None) -> BoundHold:
        """``async with election.bound(value) as scope:``: campaign, run the block as the
        leader, cancelled when the leadership is lost (LockLostError at the ``async with``),
        and resign: the asyncio ``lock.bound()``."""
        scope: BoundHold = super().bound(value, timeout=timeout)
        return scope
