"""DistSemaphore and DistBoundedSemaphore: ``threading``'s semaphores across processes and hosts.

The count lives in one Redis sorted set (see :class:`~distlock._core.keys.SemKeys`): one member
per held permit, scored by its lease deadline on the server's clock, plus two counters kept as
members with negative scores (the value the semaphore was created with, and the releases beyond
the permits held). Free permits are ``value + extra - live permits``. Every state change is one
Lua script:

- ``sem_acquire``: drop the expired permits (a holder that died), then take one if one is free;
  a waiter that is refused queues itself, so that releases know to publish a hint;
- ``sem_release``: give back permits, raise the count, check a bounded semaphore's limit, wake
  waiters;
- ``sem_renew``: the session watchdog renews every permit this process holds, in its batch.

So a permit never leaks: a holder killed with SIGKILL gives its permits back when their leases
run out, and the waiters, whose sleep is bounded by the first lease to run out, take them.
"""

from __future__ import annotations

import functools
import operator
import os
import threading
import time
from typing import Any, Callable, List, Optional, Tuple, TypeVar

import redis

from .._core.checks import check_lease, check_name, wait_seconds
from .._core.deadlines import entry_ms, lease_ms
from .._core.errors import LockLostError, WrongKindError
from .._core.flow import Flow, Read, Run
from .._core.keys import SemKeys
from .._core.outcomes import MISMATCH, OVERFLOW, RENEWED, TOO_MANY, UNCHECKED, Granted, Outcome, renewal
from .._core.outcomes import sem_acquire as decode_acquire
from .._core.outcomes import sem_release as decode_release
from .._core.permits import permit_id, stamped
from .._core.replicas import Acks, acks_for, check_options, give_back_unacked
from .._core.replies import COUNT_OVERFLOW, TOO_MANY_RELEASES, release_lost, value_mismatch
from .._core.settings import settings
from .._core.wait_policy import LAST, WAIT
from .._redis.clients import ClientArg, check_client
from .._session.session import Hold, Session, SessionUser, add_lost_callback, fire_lost
from .aging import Aging
from .engine import Waiting, waiting_flow
from .lost import settle_permits_release

#: The largest count a semaphore keeps: Redis scores and Lua numbers are doubles, exact up to
#: 2**53, and a larger count would overflow the scripts' integer replies.
MAX_PERMITS = 2 ** 53 - 1


def check_sem_value(value: object) -> int:
    """A semaphore's initial value: ``threading``'s check first (``value < 0`` raises
    ValueError, a value that cannot be compared raises its TypeError), then it must be an
    integer: a count of permits kept in Redis (``threading`` would take 2.5; distlock raises
    TypeError), at most ``MAX_PERMITS`` (OverflowError)."""
    if value < 0:  # type: ignore[operator]  # TypeError for non-numbers, as threading
        raise ValueError("semaphore initial value must be >= 0")
    count = int(operator.index(value))  # type: ignore[arg-type]  # int(): True is 1
    if count > MAX_PERMITS:
        raise OverflowError(f"semaphore initial value must be at most 2**53 - 1, not {count}")
    return count


def check_sem_acquire_args(blocking: object, timeout: object) -> Tuple[bool, Optional[float]]:
    """``Semaphore.acquire(blocking, timeout)`` read as :mod:`threading` reads it.

    Return ``(blocking, seconds)``: seconds None waits for ever, 0.0 tries once.

    - ``blocking`` false with a timeout: ValueError, threading's wording;
    - a timeout threading cannot wait on raises what threading raises when it waits: TypeError
      (from ``time + timeout`` or ``timeout > 0``), OverflowError (CPython's lock code). distlock
      checks it at once, even when a permit is free; threading only when it has to wait;
    - zero or negative: one try, no wait, as threading;
    - NaN: ValueError from CPython's lock code (threading itself would spin for ever).
    """
    if not blocking and timeout is not None:
        raise ValueError("can't specify timeout for non-blocking acquire")
    if not blocking:
        return False, 0.0
    if timeout is None:
        return True, None
    return True, wait_seconds(timeout)


def check_release_n(n: object) -> int:
    """``release(n)``: threading's ``n < 1`` check and wording, then an integer (threading
    fails on a fraction too, after raising the count; distlock raises before changing
    anything)."""
    if n < 1:  # type: ignore[operator]
        raise ValueError("n must be one or more")
    count = int(operator.index(n))  # type: ignore[arg-type]  # int(): True is 1
    if count > MAX_PERMITS:
        raise OverflowError(f"n must be at most 2**53 - 1, not {count}")
    return count


def sem_repr(obj: object, kind: str, name: str, value: int, initial: Optional[int]) -> str:
    """``<distlock.DistSemaphore at 0x…: value=2 name='pool'>``: threading's shape, plus the
    name; ``value=2/3`` for a bounded one. The value is the count of free permits as of this
    object's last round trip (a repr does no I/O)."""
    shown = f"{value}/{initial}" if initial is not None else f"{value}"
    return f"<distlock.{kind} at {id(obj):#x}: value={shown} name={name!r}>"


__all__ = ["DistSemaphore", "DistBoundedSemaphore"]

T = TypeVar("T")


#: Serializes the choice of which local permits a release gives back, across every semaphore
#: object of the process: two threads releasing at once never pick the same permit.
_claims = threading.Lock()


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held it at the fork: that thread does not exist
    # here, and would never let it go. The child holds no permits to choose from anyway.
    global _claims
    _claims = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

#: How many times a call retries when the state it was checked against vanished meanwhile.
_MISMATCH_TRIES = 3


class DistSemaphore(SessionUser, Aging):
    """``threading.Semaphore`` shared by every process and host that names it on one Redis.

    ``DistSemaphore(name, value=1, *, client=None, lease=None)``. The count starts at ``value``;
    ``acquire()`` takes one permit, waiting while none is free anywhere, and ``release(n)``
    gives ``n`` back. A release without an acquire raises the count, as in ``threading``.

    **Permits never leak.** Each acquired permit is recorded in Redis with a lease, renewed by
    the session's watchdog while the process lives (or, with ``lease=`` seconds, left to expire
    after that long). A holder killed with SIGKILL gives its permits back when their leases run
    out, and waiters take them.

    **Which permit a release gives back.** Permits are not owned by threads, as in
    ``threading``: any thread anywhere may release. ``release(n)`` gives back, in this order, a
    permit the calling thread acquired, one another thread of this process acquired, one
    another process holds (the one whose lease runs out first; its owner forgets it quietly),
    and when no permit is held anywhere it raises the count. The count therefore always equals
    ``threading``'s. A permit a process takes and never gives back comes back when that process
    ends: a DistSemaphore counts what is in use, it does not hand tokens between processes.

    **The value.** An integer from 0 to 2**53 - 1 (the largest count Redis keeps exactly;
    above it, OverflowError). The first use of a name records its value in Redis; using it
    with another value while it is recorded raises ValueError naming the recorded one. The
    check is made by the scripts, at the first ``acquire()`` or ``release()``, not by the
    constructor (which does no I/O). A semaphore at rest (nothing held, count not raised)
    leaves nothing in Redis, so the next first use may record another value. A count raised
    above the value stays in Redis, for good, as state; it too is at most 2**53 - 1 (a
    ``release()`` that would take it higher raises OverflowError, changing nothing, where
    ``threading`` has no limit).

    **After os.fork()** the child owns nothing (a fresh session): its ``release()`` is that
    of a process that holds no permit, as above, never a release of the parent's permits as
    its own.

    Keyword-only options: ``client`` (a ``redis.Redis`` or a URL; default: see ``configure``),
    ``lease`` (None: the watchdog keeps permits alive while the process lives; seconds:
    each permit expires by itself after that long), ``min_replicas`` / ``replica_timeout`` (a
    permit counts only once that many replicas acknowledged its grant, else acquire raises
    NotEnoughReplicasError: docs/guides/replicas.rst), ``max_hold`` (docs/guides/bound.rst).
    """

    _metric_kind = "semaphore"
    _bounded = False

    def __init__(self, name: str, value: int = 1, *, client: ClientArg = None,
                 lease: Optional[float] = None, min_replicas: Optional[int] = None,
                 replica_timeout: Optional[float] = None, max_hold: Optional[float] = None) -> None:
        self._name = check_name(name)
        self._initial = check_sem_value(value)
        self._init_aging(max_hold)
        self._min_replicas, self._replica_timeout = check_options(min_replicas, replica_timeout)
        if client is not None:
            check_client(client, type(self).__name__)
        self._client_arg = client
        self._client: Any = None
        self._lease = check_lease(lease)
        self._keys = SemKeys.of(settings().prefix, self._name)
        #: free permits as of this object's last round trip (for repr, which does no I/O)
        self._seen = self._initial
        self._lost_callbacks: List[Callable[[Any], Any]] = []

    # --- threading's surface ------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The shared name: every semaphore of this name on every host is the same."""
        return self._name

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        """Acquire a permit, decrementing the count by one.

        With ``blocking`` true (the default) and no ``timeout``, wait until a permit is free
        anywhere, take it and return True. With a ``timeout``, wait at most that many seconds
        and return False if none could be taken by then (zero or less: one try). With
        ``blocking`` false, try once. ``threading``'s checks and errors: a timeout with
        ``blocking`` false raises ValueError; a timeout that is not a number raises TypeError
        (at once, even when a permit is free). Redis errors propagate as ``redis.exceptions``.

        A release publishes a hint that wakes up to that many waiters per process; a waiter
        that hears nothing tries again after at most min(its time left, the first held
        permit's lease, ``wait_cap``).
        """
        return self._drive(self._acquire_flow(blocking, timeout))

    __enter__ = acquire

    def _acquire_flow(self, blocking: bool, timeout: Optional[float]) -> Flow[bool]:
        """``acquire()``, a flow: its checks raise before its first round trip."""
        blocking_, seconds = check_sem_acquire_args(blocking, timeout)
        session = self._session()
        watchdog = self._lease is None
        ms = lease_ms(settings().lease if self._lease is None else self._lease)
        pid = permit_id(session.id, self._me())
        first = stamped(pid)  # each try asks for its permit stamped with its time (_core.permits)
        meter = self._metered()
        sent_at = time.monotonic()
        try:
            outcome = yield from self._try(first, ms, None)
        except BaseException:
            meter.acquired("error", time.monotonic() - sent_at)
            raise
        if type(outcome) is Granted:
            self._grant(session, first, watchdog, ms, sent_at, outcome.token)
            meter.acquired("acquired", time.monotonic() - sent_at)
            return True
        if not blocking_ or seconds == 0:
            meter.acquired("refused", time.monotonic() - sent_at)
            return False

        cfg = settings()
        queue_ms = entry_ms(cfg.wait_cap, cfg.queue_cap_factor)
        waiting = _SemWaiting(self, session, pid, ms, watchdog, queue_ms)
        waiting.meter, waiting.started = meter, sent_at
        return bool((yield from waiting_flow(waiting, seconds, start=WAIT)))

    def release(self, n: int = 1) -> None:
        """Release ``n`` permits (default 1), incrementing the count by ``n``.

        Any thread, in any process, may release; see the class for which permits are given
        back. Waiters are woken, up to ``n`` per process. ``n`` below 1 raises ValueError
        ("n must be one or more"), as in ``threading``; a fraction raises TypeError, and ``n``
        above 2**53 - 1 (the largest count Redis keeps exactly) raises OverflowError, as does
        a release that would take the count above 2**53 - 1, changing nothing.

        Raise ValueError when the semaphore is in use with another value, and LockLostError (a
        RuntimeError) when permits this process held had been lost before the release (their
        lease ran out, so they had come back already): the rest of the release is done first.
        """
        self._drive(self._release_flow(n))

    def _release_flow(self, n: int) -> Flow[None]:
        """``release(n)``, a flow: its checks, and the choice of the permits it gives back,
        are done before its first round trip."""
        count = check_release_n(n)
        session = self._session()
        holds = self._claim(session, count)
        ids = [hold.owner for hold in holds]
        keys = self._keys
        args: Tuple[Any, ...] = (self._initial, "1" if self._bounded else "0", count, *ids)
        outcome: Any = None
        # A release of the caller's own permits sends no other kinds' keys (it makes no
        # semaphore), unless they were lost and it would: then the script asks for them.
        release = keys.release_own if len(ids) == count else keys.release
        try:
            for _ in range(_MISMATCH_TRIES):
                outcome = decode_release((yield Run("sem_release", release, args)))
                if outcome is UNCHECKED:  # nothing changed: send it with the other kinds' keys
                    release, outcome = keys.release, None
                    outcome = decode_release((yield Run("sem_release", release, args)))
                if outcome is not MISMATCH:
                    break
                stored = yield from _recorded(keys)
                if stored is not None:
                    raise ValueError(value_mismatch(self._name, stored, self._initial))
            if outcome is MISMATCH:  # pragma: no cover - the state vanished at every look
                raise ValueError(value_mismatch(self._name, "another value", self._initial))
        except BaseException as exc:
            for hold in holds:
                hold.releasing = False
            if outcome is None:
                # Its reply was lost: read whether it ran, finish it if not (lost.py); then
                # stop renewing, so that what could not be read ends with its lease.
                if isinstance(exc, redis.RedisError) and ids and len(ids) == count:
                    yield from settle_permits_release(keys.sem, ids, Run("sem_release", release, args))
                for hold in holds:
                    session.drop_hold(hold)
            raise
        if outcome is TOO_MANY or outcome is OVERFLOW:  # nothing changed: the holds are still ours
            for hold in holds:
                hold.releasing = False
            if outcome is OVERFLOW:
                raise OverflowError(COUNT_OVERFLOW)
            raise ValueError(TOO_MANY_RELEASES)
        for hold in holds:
            session.drop_hold(hold)
        self._seen = outcome.free
        if outcome.lost:  # some of ours had been lost before the release
            for hold in holds:
                if hold.owner in outcome.lost:
                    session.mark_lost(hold)
            raise LockLostError(release_lost(len(outcome.lost), self._name), name=self._name)

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    # --- what a distributed semaphore adds ----------------------------------------------------

    def valid_for(self) -> float:
        """Seconds for which a permit the caller holds (this thread's; the task's in
        ``distlock.asyncio``) is still known to be valid, 0.0 when it holds none; no round
        trip. With several, the longest. As a lock's ``valid_for`` (docs/safety.rst, "Belief
        keeps time"): past it the permit may be someone else's, and ``on_lost`` has fired."""
        session = self._peek_session()
        if session is None:
            return 0.0
        own = f"{session.id}:{self._me()}:"
        key = self._keys.sem
        best = 0.0
        for (hold_key, owner), hold in list(session.holds.items()):
            if hold_key == key and owner.startswith(own) and not hold.releasing:
                best = max(best, hold.valid_for())
        return best

    def on_lost(self, callback: Callable[[Any], Any]) -> None:
        """Call ``callback(semaphore)`` when a permit taken through this object is found lost
        (the watchdog could not renew it before its lease ran out). It runs in the watchdog
        thread, or in the thread whose ``release()`` finds it; exceptions it raises are
        logged."""
        add_lost_callback(self._lost_callbacks, callback)

    def __repr__(self) -> str:
        initial = self._initial if self._bounded else None
        return sem_repr(self, type(self).__name__, self._name, self._seen, initial)

    # --- the machinery ------------------------------------------------------------------------

    @staticmethod
    def _me() -> Any:
        """Who acquires: the calling thread (the asyncio shell: the current task). A release
        gives back the permits of the caller first."""
        return threading.get_ident()

    def _try(self, pid: str, ms: int, queue_ms: Optional[int]) -> Flow[Outcome]:
        """One try of ``sem_acquire``, decoded; raise ValueError when the value differs."""
        keys = self._keys
        args: Tuple[Any, ...] = (pid, ms, self._initial)
        if queue_ms is not None:
            args += (queue_ms,)
        acks = self._acks()
        for _ in range(_MISMATCH_TRIES):
            try:
                if acks is None:
                    reply = yield Run("sem_acquire", keys.acquire, args)
                else:
                    reply, acked = yield Run("sem_acquire", keys.acquire, args, acks)
            except (redis.ResponseError, WrongKindError):
                raise  # the script did not run, or failed: nothing was granted
            except BaseException:
                yield from self._undo_lost_grant(pid)
                raise
            outcome = decode_acquire(reply)
            if outcome is not MISMATCH:
                if type(outcome) is not Granted:
                    self._seen = 0
                elif acks is not None:
                    yield from give_back_unacked(self._name, acks, acked,
                                                 functools.partial(self._undo_lost_grant, pid))
                return outcome
            stored = yield from _recorded(keys)
            if stored is not None:
                raise ValueError(value_mismatch(self._name, stored, self._initial))
        # pragma: no cover - the state vanished between every try and its look
        raise ValueError(value_mismatch(self._name, "another value", self._initial))

    def _acks(self) -> Acks:
        """What a grant waits for (``min_replicas``, ``replica_timeout``): None when nothing."""
        return acks_for(self._min_replicas, self._replica_timeout, settings())

    def _undo_lost_grant(self, pid: str) -> Flow[None]:
        """The reply of a try was lost (the connection failed, or the caller was interrupted
        or cancelled while it waited for it), and the try may have granted permit ``pid``
        (it is never sent again: docs/design.rst, principle 13). Give it back if so: renewing succeeds
        only while it is ours (see ``_end``). If the server cannot be reached now either, a
        grant that did happen ends with its lease."""
        try:
            renewed = yield Run("sem_renew", self._keys.renew, (pid, lease_ms(settings().lease)))
            if renewal(renewed) is RENEWED:
                yield Run("sem_release", self._keys.release_own,
                       (self._initial, "1" if self._bounded else "0", 1, pid))
        except redis.RedisError:
            pass

    def _attempt(self, session: Session, mode: str, pid: str, ms: int, watchdog: bool,
                 queue_ms: int) -> Flow[Outcome]:
        """One try for the wait engine; the last one (time is up) also leaves the queue."""
        sent_at = time.monotonic()
        pid = stamped(pid)  # this try's permit; the queue knows the waiter by the unstamped id
        outcome = yield from self._try(pid, ms, 0 if mode == LAST else queue_ms)
        if type(outcome) is Granted:
            self._grant(session, pid, watchdog, ms, sent_at, outcome.token)
        return outcome

    def _grant(self, session: Session, pid: str, watchdog: bool, ms: int, sent_at: float,
               reply: int) -> None:
        self._seen = reply - 1
        hold = Hold(session, self._keys.sem, pid, token=0, count=1, watchdog=watchdog,
                    lease_ms=ms, sent_at=sent_at, renew=self._renewer(), end=self._end,
                    notify=DistSemaphore._fire_lost, meter=self._metered(), grant=True, acks=self._acks())
        hold.listeners.add(self)
        self._age(hold)
        session.add_hold(hold)

    def _end(self, hold: Hold) -> None:
        """Give the permit of ``hold`` back (interpreter exit; see ``Session.release_all``);
        blocking.

        A release names the permits it gives back first but, when one of them was lost, gives
        back one held elsewhere instead: so the permit is first renewed, which succeeds only
        while it is still ours, and then released well inside its fresh lease."""
        session = hold.session
        ms = lease_ms(settings().lease)
        if renewal(session.run("sem_renew", self._keys.renew, (hold.owner, ms))) is RENEWED:
            session.run("sem_release", self._keys.release_own,
                        (self._initial, "1" if self._bounded else "0", 1, hold.owner))

    def _renewer(self) -> Callable[[Any, Hold, int], Any]:
        keys = self._keys.renew

        def renew(batch: Any, hold: Hold, ms: int) -> None:
            batch.script("sem_renew", keys, (hold.owner, ms))

        return renew

    def _claim(self, session: Session, count: int) -> List[Hold]:
        """Pick (and mark as being released) up to ``count`` permits this process holds on
        this semaphore: the caller's first (see ``_me``), then the others', oldest first."""
        own = f"{session.id}:{self._me()}:"
        key = self._keys.sem
        with _claims:
            mine: List[Hold] = []
            others: List[Hold] = []
            for (hold_key, owner), hold in list(session.holds.items()):
                if hold_key != key or hold.releasing:
                    continue
                (mine if owner.startswith(own) else others).append(hold)
            chosen = (mine + others)[:count]
            for hold in chosen:
                hold.releasing = True  # a renewal racing this release does not call it lost
        return chosen

    def _fire_lost(self) -> None:
        fire_lost(self, self._lost_callbacks)


class DistBoundedSemaphore(DistSemaphore):
    """``threading.BoundedSemaphore`` shared by every process and host that names it.

    A DistSemaphore whose ``release()`` raises ValueError ("Semaphore released too many
    times"), changing nothing, when it would raise the count above the initial value, wherever
    the permits were taken. A DistSemaphore and a DistBoundedSemaphore of the same name share
    one count; only the check on release differs.
    """

    _metric_kind = "bounded_semaphore"

    _bounded = True

    def release(self, n: int = 1) -> None:
        """Release ``n`` permits, as ``DistSemaphore.release``; raise ValueError ("Semaphore
        released too many times"), changing nothing, if that would take the count above the
        initial value."""
        super().release(n)


def _recorded(keys: SemKeys) -> Flow[Optional[int]]:
    """The value recorded for a semaphore (for an error message), None when at rest."""
    score = yield Read("ZSCORE", keys.sem, "~v")
    return None if score is None else -int(float(score)) - 1


class _SemWaiting(Waiting):
    """One wait for a permit. Interrupted (or cancelled), it takes its own entry off the queue
    (a ZREM, not a try, which could take a permit; after a connection error, from the chores
    worker); if the server cannot be reached then, it runs out by itself within ``entry_ms``."""

    def __init__(self, sem: DistSemaphore, session: Session, pid: str, ms: int, watchdog: bool,
                 queue_ms: int) -> None:
        self.channel = sem._keys.channel
        self._sem = sem
        self._session = session
        self._args = (pid, ms, watchdog, queue_ms)

    def attempt(self, mode: str, waiter: Any) -> Flow[Outcome]:
        pid, ms, watchdog, queue_ms = self._args
        return (yield from self._sem._attempt(self._session, mode, pid, ms, watchdog, queue_ms))

    def abandon(self) -> Flow[None]:
        try:
            yield Read("ZREM", self._sem._keys.queue, self._args[0])
        except redis.RedisError:
            pass

