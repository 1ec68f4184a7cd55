"""The asyncio DistEvent."""

from __future__ import annotations

from typing import Optional

from .._core.flow import Query, Started
from .._primitives import event as _event
from ._shell import AsyncShell


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
