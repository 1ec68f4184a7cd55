"""``async with lock.bound():``: work that stops with its hold (docs/guides/bound.rst).

The scope takes the lock, runs the block, and gives the lock back. While the block runs, the
scope listens on the hold (``Hold.listeners``: ``Session.mark_lost`` tells it, from the
watchdog thread at the hold's local deadline or cap, or from whichever thread found the hold
gone) and cancels the block's task, in its loop, as ``asyncio.timeout`` does at its deadline.
The block sees the cancellation at its next await. The exit turns it into ``LockLostError``
(with the hold's name, token and cause), takes it back from the task (``Task.uncancel``, on
Python 3.11 and newer) and gives back what is left of the hold.

Why the cancellation never lands outside the block: it is asked for only in the loop, only
while the scope is active, and the scope stops being active in the first, synchronous step of
its exit. A task cancelled while suspended at an await is woken there, so the cancellation
is delivered at an await of the block itself.

On Python 3.9 and 3.10 there is no ``Task.uncancel``: a cancellation from outside that comes
while the hold is being lost is delivered once, and taken for the loss (the block ends with
``LockLostError``, not ``CancelledError``). From 3.11 on, the outside one wins, as with
``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import sys
from types import TracebackType
from typing import Any, Optional, Type

from .._core.checks import check_acquire_args
from .._core.errors import LockLostError

__all__ = ["BoundHold"]


class BoundHold:
    """What ``bound()`` returns: an async context manager (use it once)."""

    def __init__(self, lock: Any, blocking: bool, timeout: float) -> None:
        check_acquire_args(blocking, timeout)  # bad arguments raise here, as acquire's would
        self._args = (blocking, timeout)
        self._lock = lock
        self.name: str = lock.name
        #: the fencing token of the hold the scope took (an election's epoch)
        self.token: Optional[int] = None
        self._task: Optional[asyncio.Task[Any]] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._hold: Any = None
        self._active = False
        self._cancelled = False  # the scope cancelled the task
        self._base = 0

    async def __aenter__(self) -> BoundHold:
        if self._task is not None:
            raise RuntimeError("a bound() scope is used once: call lock.bound() again")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("bound() needs a running task")
        self._task, self._loop = task, asyncio.get_running_loop()
        blocking, timeout = self._args
        if not await self._lock.acquire(blocking, timeout):
            raise TimeoutError(f"bound(): {self._lock.name!r} could not be acquired"
                               + ("" if blocking else " (blocking=False)"))
        session = self._lock._port().session
        hold = self._hold = self._lock._current(session)
        self.token = hold.token
        #: what the task had of cancellations on entry: the exit's ``uncancel`` compares with it
        self._base = task.cancelling() if sys.version_info >= (3, 11) else 0
        self._active = True
        hold.listeners.add(self)
        if session.ran_out(hold):  # lost between the grant and here (a suspension is not a loss)
            self._fire_lost()
        return self

    def _fire_lost(self) -> None:
        """The hold was reported lost (any thread): cancel the block, in its loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:  # the loop closed meanwhile: nothing runs to cancel
            pass

    def _cancel(self) -> None:  # in the loop: between two steps of the task, never inside one
        if self._active and not self._cancelled and self._task is not None:
            self._cancelled = True
            self._task.cancel(f"distlock: the hold of {self._lock.name!r} was lost")

    async def __aexit__(self, exc_type: Optional[Type[BaseException]],
                        exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self._active = False  # first, and synchronously: no cancellation is asked for after it
        hold, task = self._hold, self._task
        assert hold is not None and task is not None
        hold.listeners.discard(self)
        outside = False  # a cancellation from outside is pending too (3.11+ can tell)
        if self._cancelled and sys.version_info >= (3, 11):
            outside = task.uncancel() > self._base
        try:
            await self._lock.release()  # what is left of the hold; LockLostError if it was lost
            released_lost = None
        except LockLostError as error:
            released_lost = error
        if outside and exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
            return  # the outside cancellation propagates, as asyncio.timeout lets it
        if self._cancelled or hold.lost or released_lost is not None:
            cause = hold.cause or (released_lost.cause if released_lost is not None else None)
            raise LockLostError(
                f"the hold of {self._lock.name!r} was lost in its bound block"
                + (f": {cause}" if cause else ""),
                name=self._lock.name, token=hold.token, cause=cause) from exc
