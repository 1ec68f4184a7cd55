"""What a primitive that grants holds adds to them as they age: the cap (``max_hold``) and the
``on_long_hold`` alarms. Both are kept by the watchdog thread (``_session.watchdog``), which
does no I/O for them: at the cap it reports the hold lost (``on_lost``, cause "held longer
than max_hold") and hands the token-checked give-back to its ``chores`` worker; an alarm runs
its callback once, when the hold turns that old, on the thread where ``on_lost`` runs.

A hold refers to its primitive only weakly (``_ring``), so an object that nobody holds any more
is still collected, and its hold given back, as before."""

from __future__ import annotations

import functools
import math
import weakref
from typing import Any, Callable, List, Optional, Tuple

from .._core.checks import check_max_hold, check_seconds
from .._core.settings import settings
from .._session.hold import Hold

__all__ = ["Aging"]


class Aging:
    """Mixed into every primitive that grants holds (the lock family, the semaphores)."""

    _max_hold: Optional[float] = None
    _long_holds: List[Tuple[float, Callable[[Any], Any]]]

    def _init_aging(self, max_hold: object) -> None:
        self._max_hold = check_max_hold(max_hold)
        self._long_holds = []

    @property
    def max_hold(self) -> float:
        """The cap on each hold granted through this object, in seconds: its own ``max_hold``,
        else ``configure()``'s (``math.inf``: no cap)."""
        return settings().max_hold if self._max_hold is None else self._max_hold

    def on_long_hold(self, seconds: float, callback: Callable[[Any], Any]) -> None:
        """Call ``callback(primitive)`` once for each hold granted through this object that is
        still held ``seconds`` after its grant. It runs where ``on_lost`` callbacks run (the
        watchdog thread; in ``distlock.asyncio``, the primitive's loop, a coroutine function
        as a task); exceptions it raises are logged. A hold released or lost before then never
        calls it. TypeError or ValueError on a bad argument."""
        seconds = check_seconds(seconds, "seconds")
        if not callable(callback):
            raise TypeError(f"callback must be callable, not {type(callback).__name__}")
        self._long_holds.append((seconds, callback))

    def _age(self, hold: Hold) -> None:
        """Give a new ``hold`` this object's cap and alarms (before it is registered)."""
        cap = self.max_hold
        if cap != math.inf:
            hold.capped(cap)
        if self._long_holds:
            me = weakref.ref(self)
            for seconds, callback in self._long_holds:
                hold.alarm(seconds, functools.partial(_ring, me, callback))


    def _ring_long(self, callback: Callable[[Any], Any]) -> None:
        """An alarm of ``on_long_hold``, in the watchdog thread (the asyncio shell runs it in
        the primitive's loop instead, as its ``on_lost`` callbacks)."""
        callback(self)


def _ring(ref: Callable[[], Any], callback: Callable[[Any], Any]) -> None:
    subject = ref()
    if subject is not None:
        subject._ring_long(callback)
