"""Fair locks: the flows of ``DistLock(name, fair=True)`` and ``DistRLock(name, fair=True)``,
for both shells (see ``_core.flow``).

Waiters queue in Redis in order of arrival on the server, one entry per wait, named by the
wait's nonce (``lua/_fair.lua``). A release hands the lock straight to the first live entry:
it writes the hold for that waiter, with a fresh fencing token, and publishes
``+<nonce> <token> <lease ms>`` on that waiter's process channel only. The process' dispatcher
wakes exactly that wait (``_redis.pubsub.Board``), which returns True without another round trip.
Redis stays the truth: a waiter that misses the message finds the lock its own at its next
try, at most ``wait_cap`` later; a wait that ends without the lock leaves the queue in one
script (``fair_leave``) that also passes on a lock handed to it meanwhile; the entry of a
waiter that died runs out within its lease (``entry_lease_ms``), and a lock handed to it is
stranded no longer than that.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any, Optional, Protocol, Tuple

import redis

from .._core.deadlines import Tries
from .._core.flow import Flow, Run
from .._core.keys import FairKeys, Keys
from .._core.outcomes import RENEWED, Granted, Outcome, renewal
from .._core.outcomes import lock_acquire as decode_acquire
from .._core.replies import handoff_grant
from .._core.settings import settings
from .._core.wait_policy import LAST
from .._redis import QUORUM, topology
from .._session.session import Hold, Session
from .engine import Waiting


def check_fair(fair: object) -> bool:
    """``fair`` as given to a lock's constructor: a bool, or TypeError."""
    if not isinstance(fair, bool):
        raise TypeError(f"fair must be a bool, not {type(fair).__name__}")
    return fair


def refuse_fair_quorum(client: object, fair: object) -> None:
    """TypeError for ``fair=True`` with a Redlock quorum (a list of independent masters): each
    master would keep a line of its own, and a hand-off by one master is no grant of the
    quorum's."""
    if fair is True and topology(client) == QUORUM:
        raise TypeError("fair does not apply to a Redlock quorum (a list of masters): "
                        "use one or the other")


def new_nonce(session_id: str) -> str:
    """A fresh nonce for one wait: it names the wait's queue entry and its hand-off message,
    so that a message for an earlier wait of the same thread wakes nobody."""
    return f"{session_id}:{os.urandom(8).hex()}"


def entry_lease_ms(wait_cap: float) -> int:
    """How long a queue entry lives after its waiter's last try (server ms): ``2 * wait_cap +
    1`` s, 7 s by default. A fair waiter tries at least every ``wait_cap``, wherever it stands,
    so a live one keeps its place; a dead one is dropped within this."""
    return int((2 * wait_cap + 1) * 1000)


__all__ = ["FairWaiting", "fair_try", "fair_leave", "fair_release", "first_try", "end_whole_fair",
           "confirm_handed", "settle_handed"]



class FairLock(Protocol):
    """What a fair wait and a fair release need of their lock (``lock_base._LockBase``): its
    keys, its fair queue's keys, how it records a grant and leaves the registry."""

    _keys: Keys
    _fair_keys: FairKeys
    _holder: str

    def _grant(self, session: Session, owner: str, token: int, count: int, watchdog: bool,
               ms: int, sent_at: float) -> Hold: ...

    def _unregister(self, channel: str) -> Flow[None]: ...

log = logging.getLogger("distlock")


def fair_try(lock: FairLock, session: Session, owner: str, ms: int, count: int, nonce: str,
             mode: str, number: Optional[int] = None) -> Flow[int]:
    """One ``fair_acquire`` try: its raw reply (a token > 0 when the caller holds the lock).
    ``mode``: 'w' queue (or stay queued), 'n' leave the queue when refused; ``number``: the
    try's in its wait, which a hand-off after it names. A reply that was lost is followed by
    ``fair_leave``, which gives back whatever the try may have granted."""
    s = settings()
    args: Tuple[Any, ...] = (owner, ms, s.fence_retention_ms, session.info + lock._holder, nonce,
                             count, lock._keys.waiter_channel(session.id),
                             entry_lease_ms(s.wait_cap), mode)
    if number is not None:
        args += (number,)
    try:
        return int((yield Run("fair_acquire", lock._fair_keys.acquire, args)))
    except redis.ResponseError:
        raise  # the script did not run, or failed: nothing was granted
    except BaseException:  # a WrongKindError too: nothing was granted, but the wait leaves the queue
        try:
            yield from fair_leave(lock, nonce)
        except redis.RedisError:
            pass  # unreachable: the entry, and a hold granted to it, run out by themselves
        raise


def fair_leave(lock: FairLock, nonce: str) -> Flow[int]:
    """The wait of ``nonce`` ends without the lock: leave the queue, and pass on a lock that
    was handed to it meanwhile (2), or free it."""
    return int((yield Run("fair_leave", lock._fair_keys.all,
                       (nonce, settings().fence_retention_ms))))


def fair_release(lock: FairLock, hold: Hold, count: int) -> Flow[int]:
    """``fair_release``: give back ``count`` levels (0: all); the last hands the lock on."""
    return int((yield Run("fair_release", lock._fair_keys.all,
                       (hold.owner, hold.token, count, settings().fence_retention_ms))))


#: how long after a hand-off its hold's lease is lengthened (seconds; see ``named``)
LENGTHEN_AFTER = 0.005


class FairWaiting(Waiting):
    """One wait for a fair lock. Every waiter tries at least every ``wait_cap`` (``strict``),
    wherever it stands in its process: each try keeps its queue entry alive. A hint that names
    its nonce is the grant itself (``named``)."""

    answers_hints = False
    strict = True
    named_grants = True

    def __init__(self, lock: FairLock, session: Session, owner: str, ms: int, count: int,
                 watchdog: bool) -> None:
        self.channel = lock._keys.waiter_channel(session.id)
        self.ident = self.nonce = new_nonce(session.id)
        self._lock = lock
        self._session = session
        self._grant_args = (owner, ms, count, watchdog)
        self._waiter: Any = None
        #: this wait's tries, and when the refused ones were sent: a hand-off came after the
        #: one it names; and the queue entry's lease the tries ask for (a hand-off's lease
        #: ends no sooner than it)
        self._tries = Tries()
        self._entry_ms = entry_lease_ms(settings().wait_cap)

    def attempt(self, mode: str, waiter: Any) -> Flow[Outcome]:
        lock, session = self._lock, self._session
        owner, ms, count, watchdog = self._grant_args
        self._waiter = waiter
        number = self._tries.next()
        sent_at = time.monotonic()
        reply = yield from fair_try(lock, session, owner, ms, count, self.nonce,
                                    "n" if mode == LAST else "w", number)
        outcome = decode_acquire(reply)
        if type(outcome) is Granted:
            lock._grant(session, owner, outcome.token, count, watchdog, ms, sent_at)
        else:
            self._tries.refused(sent_at)
            self._entry_ms = entry_lease_ms(settings().wait_cap)
        return outcome

    def abandon(self) -> Flow[None]:
        yield from fair_leave(self._lock, self.nonce)

    def unregister(self) -> Flow[None]:
        return (yield from self._lock._unregister(self.channel))

    def named(self) -> Any:
        """The lock was handed to this wait: take the hold as the message says (``claim``)."""
        return self._take_handed()[1]

    def _take_handed(self) -> Tuple[Hold, bool]:
        """Record the handed hold. Its lease in Redis is the handed one: the request's lease,
        or the queue entry's time left if shorter; so it ends no sooner than the send time of
        the try that last pushed the entry on, which the message names, plus the shorter of
        the two leases it asked for: the hold's local deadline (docs/safety.rst, "Belief keeps
        time"). A message that names no try this wait keeps (a release of an older version
        names none) is believed from nothing, and confirmed. Return the hold and whether its
        deadline leaves it comfortably believed."""
        lock, session = self._lock, self._session
        owner, ms, count, watchdog = self._grant_args
        token, lease, number = handoff_grant(self._waiter.payload)
        span = min(ms, self._entry_ms)
        hold = lock._grant(session, owner, token, count, watchdog, span,
                           self._tries.believed_from(number, span))
        hold.lease_ms = lease
        return hold, hold.valid_for() * 1000.0 > span / 2

    def claim(self) -> Flow[Any]:
        """The lock was handed to this wait. Usually the hold's local deadline is seconds away
        (the waiter's tries keep its entry alive) and its short lease in Redis is lengthened a
        moment later by the chores worker, off the caller's path. A hold handed long after the
        waiter's last try (a short fixed lease, a process that was paused) would be believed
        too briefly or not at all: it is confirmed first, with one ``lock_renew`` to the lease
        the caller asked for, so that ``acquire()`` never returns a hold it believes without
        cause. A hold found gone by then was granted and lost: ``acquire()`` returns True with
        the hold reported lost (``on_lost`` has run, ``owned()`` is False, ``release()`` raises
        LockLostError)."""
        lock, session = self._lock, self._session
        hold, comfortable = self._take_handed()
        yield from settle_handed(lock, session, hold, self._grant_args[1], comfortable)
        return True


def settle_handed(lock: FairLock, session: Session, hold: Hold, ms: int, comfortable: bool) -> Flow[None]:
    """A hold handed over with a short lease (``hold.lease_ms``, by a fair release or by a
    default lock's yield to another process) that its owner asked ``ms`` of: when its local
    deadline is ``comfortable``, lengthen it a moment later on the watchdog thread, off the
    caller's path; else confirm it first (``confirm_handed``)."""
    if comfortable:
        if hold.lease_ms < ms:
            # a moment later: that round trip then does not compete with the caller's
            # return (the handed lease is seconds long, or a quarter of it is waited). Nor
            # does the watchdog thread's wake-up: within a quarter of what is left is soon
            # enough, and it wakes by then by itself unless that is under its TICK
            now = time.monotonic()
            slack = min(hold.lease_ms / 4000, (hold.expires_at - now) / 4)
            session.defer_at(now + min(LENGTHEN_AFTER, hold.lease_ms / 4000), functools.partial(
                _lengthen, lock, session, hold, ms, now), max(0.0, slack))
        return
    yield from confirm_handed(lock, session, hold, ms)


def confirm_handed(lock: FairLock, session: Session, hold: Hold, ms: int) -> Flow[None]:
    """A hold handed over (by a fair release, or in-process by a default lock's) whose local
    deadline is too near to be believed without cause: one ``lock_renew`` to the lease the
    waiter asked for. Found gone, it was granted and lost before it could be used: as any lost
    hold, it is reported (``on_lost``, ``owned()`` False) and ``release()`` raises
    LockLostError; the acquire still returns True."""
    sent_at = time.monotonic()
    try:
        reply = yield Run("lock_renew", (hold.key, lock._keys.fence),
                          (hold.owner, hold.token, ms, ms + settings().fence_retention_ms))
    except BaseException:
        # the hold may still be ours: it ends with its short lease; this wait reports it
        session.mark_lost(hold, "its hand-off could not be confirmed")
        raise
    if renewal(reply) is RENEWED:
        hold.lease_ms = ms
        hold.expires_at = sent_at + ms / 1000.0
    else:
        session.mark_lost(hold, "it was gone before its hand-off could be confirmed")


def _lengthen(lock: FairLock, session: Session, hold: Hold, ms: int, received_at: float) -> None:
    """In the watchdog thread: give a hold that was handed over the lease its owner asked for
    (the internal lease, or what is left of a fixed one); one ``lock_renew``, tried again
    while the handed lease lasts if it fails."""
    if hold.lost or hold.releasing or not session.watchdog.registered(hold):
        return
    lease = ms if hold.watchdog else max(1, ms - int((time.monotonic() - received_at) * 1000))
    sent_at = time.monotonic()
    try:
        reply = session.run("lock_renew", (hold.key, lock._keys.fence),
                            (hold.owner, hold.token, lease, lease + settings().fence_retention_ms))
    except Exception as exc:  # noqa: BLE001 - tried again, or it ends with its short lease
        # Nothing else lengthens it in time: the watchdog's next round may come after the
        # handed lease ran out, and a fixed lease is never renewed.
        left = hold.expires_at - time.monotonic()
        log.warning("distlock: could not lengthen the lease of %s after a hand-off: %r%s",
                    hold.key, exc, "; trying again" if left > LENGTHEN_AFTER else "")
        if left > LENGTHEN_AFTER:
            session.defer_at(time.monotonic() + min(1.0, settings().renew_interval, left / 2),
                             functools.partial(_lengthen, lock, session, hold, ms, received_at))
        return
    if renewal(reply) is RENEWED:
        hold.lease_ms = lease
        hold.expires_at = sent_at + lease / 1000.0
    elif not hold.releasing and session.watchdog.registered(hold):
        session.mark_lost(hold, "it was gone before its hand-off lease was lengthened")


def first_try(lock: FairLock, session: Session, owner: str, ms: int, count: int) -> Flow[int]:
    """A fair lock's try before any waiting: takes the lock only when it is free and nobody
    live queues for it; never queues (the wait that follows does, once subscribed, so that a
    hand-off always finds its waiter listening)."""
    return (yield from fair_try(lock, session, owner, ms, count, new_nonce(session.id), "n"))




def end_whole_fair(keys: FairKeys, hold: Hold) -> None:
    """Give a fair DistLock's whole hold back without a reference to the object (an abandoned
    object, interpreter exit); blocking."""
    hold.session.run("fair_release", keys.all,
                     (hold.owner, hold.token, 0, settings().fence_retention_ms))
