"""How a lock waits and is handed on: ``_LockWaiting`` (the tries of one blocking acquire, for
the engine), a default lock's release (``default_release``: keep, yield, or hand to a waiter of
this process, ``_hand``) and the work a release leaves to the watchdog thread (``_nudge`` after
a release in a quantum, ``_finish_release`` after a release whose round trip was cut short).
``WaitingLock`` says what they need of the lock (``lock_base._LockBase`` has it), so this module
does not import it."""

from __future__ import annotations

import functools
import logging
import math
import time
from typing import Any, Optional, Protocol, Tuple

import redis

from .._core.deadlines import Tries
from .._core.errors import QuorumError
from .._core.flow import Flow, Hand, Pick, Run, drive
from .._core.keys import Keys
from .._core.outcomes import Busy, Granted, Outcome
from .._core.outcomes import lock_acquire as decode_acquire
from .._core.replies import yielded_grant
from .._core.settings import settings
from .._core.shares import KEEP, NUDGE_AFTER, YIELD, quantum
from .._core.wait_policy import HINTED, LAST, WAIT
from .._session.session import Hold, Session, Waiter
from .engine import Waiting
from .fair import FairLock, FairWaiting, confirm_handed, new_nonce, settle_handed

__all__ = ["WaitingLock", "QUORUM_RETRY_MS", "default_release"]

log = logging.getLogger("distlock")

class WaitingLock(FairLock, Protocol):
    """What a lock's wait and its deferred release work need of the lock."""

    _shares: bool

    def _acks(self) -> Any: ...

    def _call_acquire(self, session: Session, owner: str, ms: int, count: int, mode: str,
                      waiter: Optional[Waiter] = None) -> Flow[int]: ...

    def _call_release(self, hold: Hold, count: int) -> Flow[int]: ...

    def _forget(self, hold: Hold) -> None: ...


#: How long (ms) a blocking acquire on a Redlock quorum that could not be reached waits before
#: it tries again (DistLock(name, client=[...]); see ``_redis.executor_quorum``).
QUORUM_RETRY_MS = 100


class _LockWaiting(Waiting):
    """One wait for a lock (or a writer, see ``_primitives.rwlock``): tries of ``lock_acquire`` that
    register this process' channel with the lock, and answer hints without registering."""

    answers_hints = True
    _modes = {WAIT: "w", LAST: "w", HINTED: "p"}
    #: a Redlock quorum not reached by the last try (raised when the wait ends), and until
    #: when the wait retries it: its timeout, and at most one lease (a master restarted empty
    #: sits out that long)
    short: Optional[QuorumError] = None
    short_until = 0.0

    def __init__(self, lock: WaitingLock, session: Session, owner: str, ms: int, count: int,
                 watchdog: bool) -> None:
        self.channel = lock._keys.waiter_channel(session.id)
        self._lock = lock
        self._session = session
        self._grant_args = (owner, ms, count, watchdog)
        #: set once a try found fair waiters ahead: the wait goes on as theirs
        self._fair: Optional[FairWaiting] = None
        self._waiter: Any = None
        #: the token of the grant its own try got (it may be one a release of this process had
        #: handed it, which the try found its own: lock_acquire): 0 until then
        self.took = 0
        #: a release of this process may hand the lock to this wait (``handoff_args``): a
        #: default lock on one server, Sentinel or a cluster (not a Redlock quorum, whichever
        #: way its client was given), whose grants wait for no replica
        self._takes = lock._shares and lock._acks() is None and session.executor.hands_off
        self.info = session.info + lock._holder
        #: this wait's tries, and when the refused ones were sent: a release of another
        #: process that yields hands the lock to this wait (``free_hold``) after the try whose
        #: record it read, which its message names
        self._tries = Tries()
        if self._takes:
            # names this wait in its process' hand-off record and in the message that hands
            # it the lock (lock_acquire's ARGV[10]); a message for an earlier wait wakes nobody
            self.ident = new_nonce(session.id)
            self.record = self.ident

    def handoff_args(self, others: bool) -> Tuple[Any, ...]:
        """``lock_release``'s ARGV[5...] that hand the lock to this wait (``others``: other
        waiters of the process remain)."""
        owner, ms, count, _ = self._grant_args
        return (owner, ms, ms + settings().fence_retention_ms, self.info, count, self.channel,
                "1" if others else "0")

    def attempt(self, mode: str, waiter: Any) -> Flow[Outcome]:
        if self._fair is not None:
            return (yield from self._fair.attempt(mode, waiter))
        lock, session = self._lock, self._session
        owner, ms, count, watchdog = self._grant_args
        self._waiter = waiter
        if self._takes:
            if waiter.taker is None:
                waiter.taker = self
            # the record a refused try leaves names the try (``_call_acquire``)
            self.record = f"{self.ident}/{self._tries.next()}"
        sent_at = time.monotonic()
        try:
            reply = yield from lock._call_acquire(session, owner, ms, count, self._modes[mode], waiter)
        except QuorumError as exc:
            if self.short is None:
                self.short_until = sent_at + ms / 1000.0
            if mode == LAST or sent_at >= self.short_until:
                raise
            self.short = exc
            return Busy(QUORUM_RETRY_MS / 1000.0)
        self.short = None
        if reply == 0:
            # The lock is free, but fair waiters queue for it: this wait goes on in their
            # queue, at its back, as a fair wait (docs/guides/locks.rst, "Mixed modes").
            fair = self._fair = FairWaiting(lock, session, owner, ms, count, watchdog)
            self.ident = waiter.ident = fair.ident
            if self._takes:
                waiter.taker = None  # a fair wait is handed the lock in its queue's order only
                waiter.payload, waiter.named = None, False  # a hand-off to the plain wait: gone
            self.strict = self.named_grants = True
            return (yield from fair.attempt(mode, waiter))
        outcome = decode_acquire(reply)
        if type(outcome) is not Granted:
            self._tries.refused(sent_at)
            return outcome
        self.took = outcome.token  # before it leaves its queue: see ``_hand``
        lock._grant(session, owner, outcome.token, count, watchdog, ms, sent_at)
        if lock._shares:
            _quantum_starts(lock, session, sent_at, waiter.channel.turns)
        return outcome

    def abandon(self) -> Flow[None]:
        if self._fair is not None:
            yield from self._fair.abandon()

    def named(self) -> Any:
        return self._fair.named() if self._fair is not None else True

    def handed(self, waiter: Any) -> bool:
        return self._takes and self._fair is None and (
            waiter.handed is not None or waiter.payload is not None)

    def claim(self) -> Flow[Any]:
        if self._fair is not None:
            return (yield from self._fair.claim())
        waiter = self._waiter
        if self._takes and waiter is not None:
            if waiter.handed is not None:
                return (yield from self._take_handed(waiter))
            if waiter.payload is not None:
                return (yield from self._take_yielded(waiter))
        return True

    def _take_yielded(self, waiter: Any) -> Flow[Any]:
        """A release of another process that yielded handed the lock to this wait (``free_hold``,
        the direct hand-off): record the hold with the short lease the message carries,
        believed from the send time of the try whose record the release read (it ran after
        that try), and lengthen it, or first confirm it when that leaves too little
        (``fair.settle_handed``). A try this wait no longer keeps: believed from nothing, and
        confirmed. A quantum starts, as after a grant."""
        lock, session = self._lock, self._session
        owner, ms, count, watchdog = self._grant_args
        token, lease, turns, number = yielded_grant(waiter.payload)
        hold = lock._grant(session, owner, token, count, watchdog, lease,
                           self._tries.believed_from(number, lease))
        if _quantum_starts(lock, session, time.monotonic(), turns):
            waiter.channel.turns = turns
        yield from settle_handed(lock, session, hold, ms, hold.valid_for() * 1000.0 > lease / 2)
        return True

    def _take_handed(self, waiter: Any) -> Flow[Any]:
        """A release of this process handed the lock to this wait (``lock_release``, ARGV[5]):
        record the hold, believed from that release's send time (the script wrote the lease
        after it), and confirm it first when that leaves too little (``confirm_handed``).
        The process' quantum does not start again (``_core.shares``): the lock stayed with it."""
        lock, session = self._lock, self._session
        owner, ms, count, watchdog = self._grant_args
        token, sent_at = waiter.handed
        hold = lock._grant(session, owner, token, count, watchdog, ms, sent_at)
        if hold.valid_for() * 1000.0 <= ms / 2:
            yield from confirm_handed(lock, session, hold, ms)
        return True

    def give_back(self, waiter: Any) -> Flow[None]:
        """The wait ended with an error as a release handed it the lock: give that back."""
        if waiter.handed is not None:
            yield from self.give_back_token(waiter.handed[0])
        else:
            yield from self.give_back_token(yielded_grant(waiter.payload)[0])

    def give_back_token(self, token: int) -> Flow[None]:
        """Give back the hold with ``token`` that a release handed this wait, yielding it to
        the next waiting process (also ``_hand``, when the wait had left)."""
        keys = self._lock._keys
        yield Run("lock_release", (keys.lock, keys.queue), (self._grant_args[0], token, 0, YIELD))

    def unregister(self) -> Flow[None]:
        return (yield from self._lock._unregister(self.channel))

    def timed_out(self) -> Any:
        if self.short is not None:
            raise self.short  # never False for a quorum that could not be reached
        return False


def default_release(lock: WaitingLock, hold: Hold, count: int) -> Flow[int]:
    """A default lock's release: the yield rule's keep or yield (``_core.shares``), and the
    hand-off to a waiter of this process that the script may make (``_hand``)."""
    keys = lock._keys
    args: Tuple[Any, ...] = (hold.owner, hold.token)
    shares = lock._shares and settings().barge_limit < math.inf
    keep = False
    now = 0.0
    # a waiter of this process the release may hand the lock to (lock_release, ARGV[5])
    taker = None
    if lock._shares and (count == 0 or count >= hold.count) and lock._acks() is None \
            and hold.session.executor.hands_off:
        taker = yield Pick(keys.waiter_channel(hold.session.id))
    if shares:
        now = time.monotonic()
        keep = hold.session.runs.keeps(hold.key, now)
        args += (count, KEEP if keep else YIELD)
    elif count != 1 or taker is not None:
        args += (count, "")
    if taker is None:
        left = int((yield Run("lock_release", (keys.lock, keys.queue, keys.fence), args)))
    else:
        args += taker.taker.handoff_args(len(taker.channel.waiters) > 1)
        sent_at = time.monotonic()
        left = int((yield Run("lock_release", (keys.lock, keys.queue, keys.fence,
                                               lock._fair_keys.deadlines), args)))
        if left <= -2:  # handed to that waiter: it is woken here, in this process
            yield from _hand(keys, taker, -1 - left, sent_at)
            return 0
    if shares and left == 0 and hold.session.runs.released(hold.key, now, keep):
        # in its quantum: nobody was woken; unless this process takes the lock again
        # first, the next waiter is woken soon (_shares)
        hold.session.defer_at(now + NUDGE_AFTER, functools.partial(_nudge, keys, hold.session))
    return left


def _quantum_starts(lock: WaitingLock, session: Session, at: float, turns: int) -> bool:
    """A grant to a wait of this process starts its quantum (``_core.shares``) at ``at``, its
    length barge_limit shared among ``turns`` processes; False when the yield rule is off."""
    limit = settings().barge_limit
    if limit == math.inf:
        return False
    session.runs.start(lock._keys.lock, at, quantum(limit, turns))
    return True


def _hand(keys: Keys, taker: Any, token: int, sent_at: float) -> Flow[None]:
    """A release handed the lock to ``taker``, a waiter of this process, with ``token``: give
    it the hold and wake it. If it left its queue meanwhile (it timed out, or was interrupted,
    as the hold was handed), give the lock back, yielding it to the next waiting process;
    unless its own try found the hold its own first (a try sent as the release ran) and it
    left with it."""
    if (yield Hand(taker, (token, sent_at))) or taker.taker.took == token:
        return
    try:
        yield from taker.taker.give_back_token(token)
    except redis.RedisError:
        pass  # it ends with its lease


def _nudge(keys: Keys, session: Session) -> None:
    """In the watchdog thread, ``NUDGE_AFTER`` a release in a quantum: if this process has not
    tried to take the lock since, wake the next waiting process (``_core.shares``). At
    interpreter exit (``Session.release_all``), at once: the process will not try again."""
    now = time.monotonic()
    due = session.runs.nudge(keys.lock, now)
    if due is None or session.closed:
        return
    if due > now and not session.exiting:  # released again meanwhile: look again then
        session.defer_at(due, functools.partial(_nudge, keys, session))
        return
    try:
        session.run("lock_nudge", (keys.lock, keys.queue), ())
    except redis.RedisError as exc:  # the waiters' bounded sleeps cover for it
        log.debug("distlock: could not wake a waiter of %r: %r", keys.name, exc)


def _finish_release(lock: WaitingLock, session: Session, hold: Hold, count: int, depth: int) -> None:
    """In the watchdog thread: finish a release whose round trip was cut short. It may have run
    (it is never sent blind, docs/design.rst, principle 13): send it only if the hold is still there at
    the depth it had; then keep the books as the release would have."""
    try:
        held, token = session.read("HMGET", hold.key, hold.owner, ":t")
        if held is not None and token is not None and int(token) == hold.token and int(held) == depth:
            drive(lock._call_release(hold, count), session)
        held = session.read("HGET", hold.key, hold.owner)
    except Exception as exc:  # noqa: BLE001 - what cannot be finished ends with its lease
        log.warning("distlock: could not finish the release of %s: %r", hold.key, exc)
        held = None
    if held is None:
        lock._forget(hold)
        session.drop_hold(hold)
    else:
        hold.count = int(held)
        hold.releasing = False
