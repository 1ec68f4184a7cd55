"""DistEvent: ``threading.Event`` across processes and hosts.

The flag is one Redis key that exists while the event is set (see
:class:`~distlock._core.keys.EventKeys`). A waiter that has to wait joins a sorted set of
waiters, its entry leased until a little after its next look. ``set()`` is one script: it sets
the flag, takes every live waiter off the set and names them all in one pub/sub hint. A waiter
named in a hint returns True at once; one that missed the hint finds at its next look that its
entry was taken, which only ``set()`` does, so it returns True even if the event was cleared
meanwhile: ``wait()`` returns True whenever the event was set while it waited.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Optional, TypeVar

import redis

from .._core.checks import check_name, check_wait_timeout
from .._core.deadlines import entry_ms
from .._core.flow import Flow, Read, Run, drive
from .._core.keys import EventKeys
from .._core.outcomes import REJOIN, Busy, Outcome, event_wait
from .._core.replicas import refuse_options
from .._core.settings import settings
from .._core.wait_policy import FIRST, LAST, WAIT
from .._redis.clients import ClientArg, check_client
from .._session.session import Session, SessionUser
from .engine import Waiting, waiting_flow


def event_repr(obj: object, name: str, flag: bool) -> str:
    """``<distlock.DistEvent at 0x…: set name='ready'>``, as of the last round trip."""
    return f"<distlock.DistEvent at {id(obj):#x}: {'set' if flag else 'unset'} name={name!r}>"


__all__ = ["DistEvent"]

T = TypeVar("T")


class DistEvent(SessionUser):
    """``threading.Event`` shared by every process and host that names it on one Redis.

    ``DistEvent(name, *, client=None)``. ``set()`` wakes every waiter on every host;
    ``wait(timeout=None)`` returns True when the event is set, or was set at any moment while
    it waited (even if something cleared it before the waiter woke), and False on timeout.

    **What stays in Redis.** An Event is state: a set event stays set, in Redis, for good,
    until ``clear()``; a clear event leaves nothing (waiters keep a short-lived entry while
    they wait). A waiter that could not reach Redis for longer than its entry's lease
    (``2 * wait_cap * queue_cap_factor + 1`` s, 61 s by default) may miss a ``set()`` that was
    cleared again before it came back; an event that stays set is never missed.

    ``client``: a ``redis.Redis`` or a URL; by default, see ``configure``.
    """

    _metric_kind = "event"

    def __init__(self, name: str, *, client: ClientArg = None, min_replicas: Any = None,
                 replica_timeout: Any = None) -> None:
        self._name = check_name(name)
        refuse_options(type(self).__name__, min_replicas, replica_timeout)
        if client is not None:
            check_client(client, type(self).__name__)
        self._client_arg = client
        self._client: Any = None
        self._keys = EventKeys.of(settings().prefix, self._name)
        #: the flag as of this object's last round trip (for repr, which does no I/O)
        self._seen = False

    @property
    def name(self) -> str:
        """The shared name: every event of this name on every host is the same."""
        return self._name

    def is_set(self) -> bool:
        """Return True if and only if the event is set now, anywhere (one round trip)."""
        return self._drive(self._is_set_flow())

    def isSet(self) -> bool:  # noqa: N802 - threading's deprecated spelling
        """Return True if the event is set; deprecated, use ``is_set()`` (as in ``threading``)."""
        warnings.warn("isSet() is deprecated, use is_set() instead", DeprecationWarning, stacklevel=2)
        return self.is_set()

    def set(self) -> None:
        """Set the event: every thread waiting for it, in any process on any host, wakes up.
        Threads that call ``wait()`` while it is set do not block at all. One round trip."""
        self._drive(self._set_flow())

    def clear(self) -> None:
        """Reset the event: ``wait()`` blocks again until the next ``set()``. Waiters that a
        ``set()`` already picked still return True. One round trip: a script (``run``), never
        sent twice, so that it cannot undo a ``set()`` made after it."""
        self._drive(self._clear_flow())

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Block until the event is set, or until ``timeout`` seconds (a float) pass.

        Return True at once if the event is set; otherwise True as soon as a ``set()`` happens
        anywhere (even if it is cleared again before this waiter wakes), and False on timeout.
        A ``set()`` that lands in the same instant as the timeout counts: True. ``timeout``
        None waits for ever; zero or less does not wait. ``threading``'s errors: TypeError
        for a timeout that is not a number, OverflowError for one too large to wait on. Redis
        errors propagate as ``redis.exceptions``.

        The hint of a ``set()`` names this waiter and wakes it at once; without it (a lost
        message, a dropped connection) it finds out at its next look, at most ``wait_cap``
        seconds later for the first waiter of its process and ``wait_cap * queue_cap_factor``
        for the others.
        """
        return self._drive(self._wait_flow(timeout))

    def __repr__(self) -> str:
        return event_repr(self, self._name, self._seen)

    # --- the flows: the operations above, for both shells (see ``_core.flow``) -------------------

    def _is_set_flow(self) -> Flow[bool]:
        flag = bool((yield Read("EXISTS", self._keys.flag)))
        self._seen = flag
        return flag

    def _set_flow(self) -> Flow[None]:
        keys = self._keys
        yield Run("ev_set", keys.set, ())
        self._seen = True

    def _clear_flow(self) -> Flow[None]:
        yield Run("ev_clear", (self._keys.flag,), ())
        self._seen = False

    def _wait_flow(self, timeout: Optional[float]) -> Flow[bool]:
        """``wait()``: its checks raise before its first round trip."""
        seconds = check_wait_timeout(timeout)
        session = self._session()
        if seconds == 0:
            return (yield from self._is_set_flow())
        waiting = _EventWaiting(self, session)
        waiting.meter = self._metered()
        return self._saw((yield from waiting_flow(waiting, seconds)))

    # --- the machinery ------------------------------------------------------------------------

    def _call(self, wid: str, mode: str, ms: int, known: int) -> Flow[int]:
        keys = self._keys
        if mode == "j":  # a join gives the name its kind: the other kinds' keys go too
            return int((yield Run("ev_wait", keys.join, (wid, mode, ms))))
        return int((yield Run("ev_wait", keys.look, (wid, mode, ms, known))))

    def _consume(self, session: Session, wid: str, ms: int, known: int) -> None:
        """Take our entry out of the set()'s ``taken`` set, so nothing is left behind. The hint
        already proved the set; if Redis cannot be reached now, the entry expires by itself.
        Blocking: it runs in the session's watchdog thread (``Session.defer``)."""
        try:
            drive(self._call(wid, "p", ms, known), session)
        except redis.RedisError:
            pass

    def _saw(self, flag: bool) -> bool:
        self._seen = flag
        return flag


class _EventWaiting(Waiting):
    """One wait for an event: join the waiters (``FIRST``), look again after each sleep,
    leave at the deadline; a set() that names the waiter ends the wait at once."""

    _modes = {WAIT: "p", LAST: "l"}

    def __init__(self, event: DistEvent, session: Session) -> None:
        self.ident = self.wid = f"{session.id}:{os.urandom(8).hex()}"
        self.channel = event._keys.channel
        self._event = event
        self._session = session
        cfg = settings()
        self._ms = entry_ms(cfg.wait_cap, cfg.queue_cap_factor)
        self._known = 0  # our entry, once joined (its score), for the script to check

    def attempt(self, mode: str, waiter: Any) -> Flow[Outcome]:
        call = self._event._call
        if mode == FIRST:
            code = yield from call(self.wid, "j", self._ms, 0)
        else:
            code = yield from call(self.wid, self._modes[mode], self._ms, self._known)
        outcome = event_wait(code, mode == LAST)
        if outcome is REJOIN:  # our entry ran out before anyone took it: join again
            code = yield from call(self.wid, "j", self._ms, 0)
            outcome = event_wait(code, False)
        if type(outcome) is Busy:
            self._known = code
        return outcome

    def abandon(self) -> Flow[None]:
        if self._known > 0:
            yield from self._event._call(self.wid, "l", self._ms, self._known)
        else:  # its join's reply never came: take the entry it may have made off
            try:
                yield Read("ZREM", self._event._keys.waiters, self.wid)
            except redis.RedisError:
                pass

    def named(self) -> bool:
        # Taking our entry out of the set()'s 'taken' set changes nothing we return: it runs in
        # the background, so that the wake-up costs no round trip.
        self._session.defer(functools.partial(
            self._event._consume, self._session, self.wid, self._ms, self._known))
        return True
