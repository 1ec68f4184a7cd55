"""Typed outcomes of the scripts' replies, and the decoders that make them. No I/O.

Every try a primitive makes for the wait engine (``_primitives/engine.py``) ends in one of these:

- ``Granted(token)``: the caller holds it now (a lock, a permit); ``token`` is the fencing
  token, or what the script returned with the grant (a semaphore's count left, plus one);
- ``Busy(bound)``: not yet; sleep at most ``bound`` seconds (the holder's lease left; None
  when the script knows no bound), within the caller's time left, then try again;
- ``Pending(bound)``: not yet, and the caller's deadline does not count: something that always
  ends by itself runs (a barrier's action, for instance); sleep, then make the same try again;
- ``Done(value)``: finished without a grant (an event found set, a barrier tripped, a
  condition notified or not); the wait returns ``value``;
- ``Failed(error)``: finished, and the wait raises ``error``.

The wait engine ends a wait in two more ways, ``TIMED_OUT`` and ``NAMED`` (a hint named the
waiter). Releases decode to ``Released(left)`` or ``LOST``. The decoders are the only place
that knows how the scripts spell these (see each script's header); ``tests/unit/test_outcomes.py``
checks them without Redis. One deliberate exception: the locks' uncontended first try reads a
grant as ``reply > 0`` inline (a token is positive, as ``lock_acquire`` here says), to keep a
call and an allocation off the hot path; every other try goes through ``lock_acquire``.
"""

from __future__ import annotations

import threading
from typing import Any, FrozenSet, Optional, Union

from .replies import (
    BAR_BROKEN,
    BAR_BUSY,
    BAR_MISMATCH,
    BAR_PENDING,
    BAR_RUN,
    BAR_TRIPPED,
    EV_EXPIRED,
    EV_SET,
    EV_TAKEN,
    LEAVE_NOTIFIED,
    REL_MISMATCH,
    REL_OVERFLOW,
    REL_TOO_MANY,
    REL_UNCHECKED,
    SEM_MISMATCH,
)

__all__ = [
    "Granted", "Busy", "Pending", "Done", "Failed", "Released", "LOST", "TIMED_OUT", "NAMED",
    "Outcome", "FINAL", "lock_acquire", "lock_reenter", "lock_release", "holder_bound", "sem_acquire",
    "REJOIN", "event_wait", "barrier_poll", "cond_leave", "RENEWED", "ENDED", "renewal",
    "MISMATCH", "TOO_MANY", "OVERFLOW", "UNCHECKED", "Freed", "sem_release", "RUN_ACTION", "JOINED",
    "barrier_arrival", "barrier_done",
]


class _One:
    """An outcome that carries one value, named by ``_field``: equal when of the same type and
    value, and shown as ``Type(value)``."""

    __slots__ = ()
    _field = ""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and getattr(other, self._field) == getattr(self, self._field)

    def __hash__(self) -> int:
        return hash((type(self), getattr(self, self._field)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({getattr(self, self._field)!r})"


class Granted(_One):
    __slots__ = ("token",)
    _field = "token"

    def __init__(self, token: int) -> None:
        self.token = token


class Busy(_One):
    __slots__ = ("bound",)
    _field = "bound"

    def __init__(self, bound: Optional[float] = None) -> None:
        self.bound = bound


class Pending(Busy):
    __slots__ = ()


class Done(_One):
    __slots__ = ("value",)
    _field = "value"

    def __init__(self, value: Any) -> None:
        self.value = value


class Failed(_One):
    __slots__ = ("error",)
    _field = "error"

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Released(_One):
    """A release went through; ``left`` is the reentrancy count still held (0: ended)."""

    __slots__ = ("left",)
    _field = "left"

    def __init__(self, left: int) -> None:
        self.left = left


class _Marker:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: a release (or re-entry) found the hold gone or someone else's
LOST = _Marker("LOST")
#: the wait's last try, at its deadline, was refused
TIMED_OUT = _Marker("TIMED_OUT")
#: a hint named this waiter: what it waited for happened, nothing to ask Redis
NAMED = _Marker("NAMED")

Outcome = Union[Granted, Busy, Done, Failed, _Marker]

#: the outcomes that end a wait as soon as a try returns them
FINAL = (Granted, Done, Failed)


def holder_bound(code: int) -> Optional[float]:
    """A refusal's ``-(pttl + 1)`` (the holder's lease left, in ms; -1 when unknown) as a
    sleep bound in seconds, or None when there is none."""
    pttl = -code - 1
    return pttl / 1000.0 if pttl > 0 else None


def lock_acquire(reply: Any) -> Union[Granted, Busy]:
    """``lock_acquire``, ``rw_read_acquire``, ``rw_write_acquire``: the token (> 0) of a grant,
    or ``-(pttl + 1)`` of the hold in the way."""
    code = int(reply)
    if code > 0:
        return Granted(code)
    return Busy(holder_bound(code))


def lock_reenter(reply: Any) -> Union[Granted, _Marker]:
    """A re-entry's ``lock_acquire`` / ``rw_*_acquire``: the hold's token, or 0: it is gone."""
    token = int(reply)
    return Granted(token) if token > 0 else LOST


#: the common release, without an allocation
_RELEASED_ALL = Released(0)


def lock_release(reply: Any) -> Union[Released, _Marker]:
    """``lock_release``, ``rw_*_release``: the count left (0: released), or -1: not ours."""
    left = int(reply)
    if left == 0:
        return _RELEASED_ALL
    return LOST if left < 0 else Released(left)


#: a semaphore's or barrier's script found it in use with another value / number of parties
MISMATCH = _Marker("MISMATCH")
#: sem_release: nothing changed; send it again with the other kinds' keys (``REL_UNCHECKED``)
UNCHECKED = _Marker("UNCHECKED")
#: a bounded semaphore's release would raise the count above its value; nothing changed
TOO_MANY = _Marker("TOO_MANY")
#: a release would raise the count past 2**53 - 1; nothing changed
OVERFLOW = _Marker("OVERFLOW")


class Freed(_One):
    """A semaphore's release went through: ``free`` permits are free now, and ``lost`` holds
    the ids among the caller's that had been lost before it (their lease ran out)."""

    __slots__ = ("free", "lost")
    _field = "free"

    def __init__(self, free: int, lost: FrozenSet[str] = frozenset()) -> None:
        self.free = free
        self.lost = lost


def sem_acquire(reply: Any) -> Union[Granted, Busy, _Marker]:
    """``sem_acquire``: permits left + 1 on a grant; 0, the semaphore is in use with another
    value (``MISMATCH``); else ``-(pttl + 1)`` of the permit that runs out first."""
    code = int(reply)
    if code > 0:
        return Granted(code)
    if code == SEM_MISMATCH:
        return MISMATCH
    return Busy(holder_bound(code))


def sem_release(reply: Any) -> Union[Freed, _Marker]:
    """``sem_release``: the permits free now; or a list {free, lost id, ...} when some of the
    caller's permits had been lost; or ``MISMATCH``, ``TOO_MANY``, ``OVERFLOW``, ``UNCHECKED``."""
    if isinstance(reply, list):
        return Freed(int(reply[0]), frozenset(
            raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else str(raw)
            for raw in reply[1:]))
    code = int(reply)
    if code >= 0:
        return Freed(code)
    return {REL_MISMATCH: MISMATCH, REL_TOO_MANY: TOO_MANY, REL_OVERFLOW: OVERFLOW,
            REL_UNCHECKED: UNCHECKED}.get(code, MISMATCH)


# --- the watchdog's renewals ------------------------------------------------------------------

#: a renewal extended the hold
RENEWED = _Marker("RENEWED")
#: the hold ended without a loss (a semaphore permit released on its owner's behalf): forget it
ENDED = _Marker("ENDED")


def renewal(reply: Any) -> _Marker:
    """Every renewal script (``lock_renew``, ``rw_read_renew``, ``sem_renew``, ``cond_renew``,
    ``bar_renew``): 1 renewed, 2 ended without a loss, anything else: the hold is gone or
    someone else's (``LOST``)."""
    if reply == 1:
        return RENEWED
    return ENDED if reply == 2 else LOST


# --- the waiting primitives' replies ---------------------------------------------------------

#: an event waiter must join again (its entry ran out): not a wait's end
REJOIN = _Marker("REJOIN")


def event_wait(code: int, last: bool) -> Outcome:
    """``ev_wait``: the event set (or set while we waited) ends the wait with True; on the last
    look, anything else ends it with False."""
    if code in (EV_SET, EV_TAKEN):
        return Done(True)
    if last:
        return Done(False)
    return REJOIN if code == EV_EXPIRED else Busy(None)


#: ``bar_wait``: the caller is the last party and runs the action before the trip
RUN_ACTION = _Marker("RUN_ACTION")
#: ``bar_wait``: the caller joined the generation and waits
JOINED = _Marker("JOINED")


def barrier_arrival(code: int, index: int) -> Outcome:
    """``bar_wait``'s code: the previous generation's action runs (``Pending``: arrive again
    within ``index`` ms); ``MISMATCH``; broken (``Failed``); tripped by this arrival
    (``Done(index)``); ``RUN_ACTION``; or ``JOINED``."""
    if code == BAR_BUSY:
        return Pending(index / 1000.0)
    if code == BAR_MISMATCH:
        return MISMATCH
    if code == BAR_BROKEN:
        return Failed(threading.BrokenBarrierError())
    if code == BAR_TRIPPED:
        return Done(index)
    return RUN_ACTION if code == BAR_RUN else JOINED


def barrier_done(reply: Any) -> Outcome:
    """``bar_done`` (the action's runner trips the generation): broken meanwhile (``Failed``)
    or tripped (``Done(None)``)."""
    if int(reply) == BAR_BROKEN:
        return Failed(threading.BrokenBarrierError())
    return Done(None)


def barrier_poll(code: int, index: int, last: bool) -> Outcome:
    """``bar_poll``: tripped ends the wait with the caller's ``index``; broken raises
    ``threading.BrokenBarrierError``; at the deadline (``last``, the poll that breaks the
    barrier) an action still running is waited for: a timeout does not break it then."""
    if code == BAR_TRIPPED:
        return Done(index)
    if code == BAR_BROKEN:
        return Failed(threading.BrokenBarrierError())
    if code == BAR_PENDING and last:
        return Pending(None)
    return Busy(None)


def cond_leave(code: int, last: bool) -> Outcome:
    """``cond_leave``: notified ends the wait with True; the last look (which leaves the
    queue) ends it with False otherwise."""
    if code == LEAVE_NOTIFIED:
        return Done(True)
    return Done(False) if last else Busy(None)
