"""DistEvent: ``threading.Event`` across processes and hosts.

The flag is one Redis key that exists while the event is set (see
:class:`~distlock._synclogic.EventKeys`). A waiter that has to wait joins a sorted set of
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
from typing import Any, Optional

import redis

from ._condlogic import check_wait_timeout
from ._config import ClientArg, check_client, settings
from ._logic import Deadline, check_name
from ._session import Session, SessionUser
from ._synclogic import EV_EXPIRED, EV_SET, EV_TAKEN, EventKeys, entry_ms, event_repr

__all__ = ["DistEvent"]


class DistEvent(SessionUser):
    """``threading.Event`` shared by every process and host that names it on one Redis.

    ``DistEvent(name, *, client=None)``. ``set()`` wakes every waiter on every host;
    ``wait(timeout=None)`` returns True when the event is set, or was set at any moment while
    it waited (even if something cleared it before the waiter woke), and False on timeout.

    **What stays in Redis.** An Event is state: a set event stays set, in Redis, for good,
    until ``clear()``; a clear event leaves nothing (waiters keep a short-lived entry while
    they wait). A waiter that could not reach Redis for longer than its entry's lease
    (``2 * wait_cap * queue_cap_factor + 1`` s, 41 s by default) may miss a ``set()`` that was
    cleared again before it came back; an event that stays set is never missed.

    ``client``: a ``redis.Redis`` or a URL; by default, see ``configure``.
    """

    def __init__(self, name: str, *, client: ClientArg = None) -> None:
        self._name = check_name(name)
        if client is not None:
            check_client(client)
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
        flag = bool(self._session().client.exists(self._keys.flag))
        self._seen = flag
        return flag

    def isSet(self) -> bool:  # noqa: N802 - threading's deprecated spelling
        """Return True if the event is set; deprecated, use ``is_set()`` (as in ``threading``)."""
        warnings.warn("isSet() is deprecated, use is_set() instead", DeprecationWarning, stacklevel=2)
        return self.is_set()

    def set(self) -> None:
        """Set the event: every thread waiting for it, in any process on any host, wakes up.
        Threads that call ``wait()`` while it is set do not block at all. One round trip."""
        keys = self._keys
        self._session().run("ev_set", (keys.flag, keys.waiters, keys.channel, keys.taken), ())
        self._seen = True

    def clear(self) -> None:
        """Reset the event: ``wait()`` blocks again until the next ``set()``. Waiters that a
        ``set()`` already picked still return True. One round trip."""
        self._session().client.delete(self._keys.flag)
        self._seen = False

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
        seconds = check_wait_timeout(timeout)
        session = self._session()
        if seconds == 0:
            return self.is_set()
        wid = f"{session.id}:{os.urandom(8).hex()}"
        cfg = settings()
        ms = entry_ms(cfg.wait_cap, cfg.queue_cap_factor)
        # Subscribe first: a set() right after the join below finds us listening.
        waiter = session.join(self._keys.channel, seconds, ident=wid)
        known = 0
        try:
            known = self._call(session, wid, "j", ms, 0)
            if known == EV_SET:
                return self._saw(True)
            deadline = Deadline(seconds)
            while True:
                session.sleep(waiter, cfg.wait_cap, deadline.remaining())
                if waiter.named:  # our id in a set()'s hint: the event was set while we waited
                    # Taking our entry out of the set()'s 'taken' set changes nothing we return:
                    # it runs in the background, so that the wake-up costs no round trip.
                    session.defer(functools.partial(self._consume, session, wid, ms, known))
                    return self._saw(True)
                last = deadline.expired()
                reply = self._call(session, wid, "l" if last else "p", ms, known)
                if reply in (EV_SET, EV_TAKEN):
                    return self._saw(True)
                if reply == EV_EXPIRED:
                    if last:
                        return False
                    reply = self._call(session, wid, "j", ms, 0)
                    if reply == EV_SET:
                        return self._saw(True)
                elif last:
                    return False
                known = reply
        except BaseException as exc:
            # Interrupted (KeyboardInterrupt, a Redis error...): leave the waiters now if the
            # server can be reached; otherwise the entry runs out on its own.
            if known > 0 and not isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
                try:
                    self._call(session, wid, "l", ms, known)
                except redis.RedisError:
                    pass
            raise
        finally:
            session.leave(waiter, True)

    def __repr__(self) -> str:
        return event_repr(self, self._name, self._seen)

    # --- the machinery ------------------------------------------------------------------------


    def _call(self, session: Session, wid: str, mode: str, ms: int, known: int) -> int:
        keys = self._keys
        args = (wid, mode, ms) if mode == "j" else (wid, mode, ms, known)
        return int(session.run("ev_wait", (keys.flag, keys.waiters, keys.taken), args))

    def _consume(self, session: Session, wid: str, ms: int, known: int) -> None:
        """Take our entry out of the set()'s ``taken`` set, so nothing is left behind. The hint
        already proved the set; if Redis cannot be reached now, the entry expires by itself."""
        try:
            self._call(session, wid, "p", ms, known)
        except redis.RedisError:
            pass

    def _saw(self, flag: bool) -> bool:
        self._seen = flag
        return flag
