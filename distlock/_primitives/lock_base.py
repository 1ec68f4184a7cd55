"""What the lock family shares: ``_LockBase`` (the acquire loop, leases, tokens, callbacks,
releases) under DistLock, DistRLock, the RW lock's sides and a Condition's default lock, and the
helpers that reach a lock's hold from outside it (the command line, DistCondition)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any, Callable, List, Optional, Tuple, TypeVar

import redis

from .._core.checks import check_acquire_args, check_lease, check_name, check_try_lock_timeout
from .._core.deadlines import lease_ms, registry_lease_ms
from .._core.errors import LockLostError, QuorumError, WrongKindError
from .._core.flow import Flow, Read, Run, drive
from .._core.keys import FairKeys, Keys
from .._core.outcomes import LOST
from .._core.outcomes import lock_reenter as decode_reenter
from .._core.outcomes import lock_release as decode_release
from .._core.replicas import Acks, acks_for, check_options, give_back_unacked, refuse_quorum
from .._core.settings import settings
from .._core.wait_policy import WAIT
from .._redis import QUORUM, topology
from .._redis.clients import ClientArg, check_client
from .._redis.executor import Batch
from .._session.session import Hold, Session, SessionUser, Waiter, add_lost_callback, fire_lost
from .aging import Aging
from .bound import Bindable
from .engine import Waiting, waiting_flow
from .fair import FairWaiting, check_fair, fair_release, first_try, refuse_fair_quorum
from .lock_wait import QUORUM_RETRY_MS, _finish_release, _LockWaiting, default_release
from .lost import reentry_lost, settle_release, surplus

log = logging.getLogger("distlock")

_UNSET: Any = object()

#: a fair lock's grants are made by other processes' releases too, with no caller to wait for replicas
FAIR_REPLICAS = "min_replicas does not apply to a fair lock: use one or the other"

T = TypeVar("T")


class _LockBase(SessionUser, Aging, Bindable):
    """The logic both locks share: the acquire loop, leases, tokens, callbacks.

    Subclasses say who the owner is (``_owner_for``), where the hold is kept (``_current`` /
    ``_remember`` / ``_forget``) and how an unowned release is worded.
    """

    _reentrant, _unowned_message = "0", "release unlocked lock"
    #: what a repr puts before the class name (the asyncio shell: ``asyncio.``)
    _repr_prefix = ""
    #: what follows ``host:pid`` in the info of its holds (an election's value, ``_core.election``)
    _holder = ""

    def __init__(self, name: str, *, client: ClientArg = None, lease: Optional[float] = None,
                 min_replicas: Optional[int] = None, replica_timeout: Optional[float] = None,
                 fair: bool = False, max_hold: Optional[float] = None) -> None:
        self._name = check_name(name)
        self._init_aging(max_hold)
        self._min_replicas, self._replica_timeout = check_options(min_replicas, replica_timeout)
        refuse_quorum(topology(client) == QUORUM, self._min_replicas)
        if client is not None:
            check_client(client, type(self).__name__)
        self._client_arg = client
        self._lease = check_lease(lease)
        self._fair = check_fair(fair)
        refuse_fair_quorum(client, fair)
        if fair and self._min_replicas:
            raise TypeError(FAIR_REPLICAS)
        self._keys = Keys(settings().prefix, self._name)
        #: the fair queue's keys (``_primitives.fair``); a plain try reads them too: no queue jumping
        self._fair_keys = FairKeys(self._keys)
        self._know_topology(client)
        self._acquire_keys = (self._keys.lock, self._keys.fence, self._keys.queue,
                              self._fair_keys.deadlines, *self._keys.others, *self._keys.rw)
        #: what the watchdog calls to queue one renewal of a hold of this primitive, and what gives
        #: a whole hold back (at interpreter exit; see ``Session.release_all``): made once
        self._renew_fn: Callable[[Any, Hold, int], Any] = functools.partial(
            _renew_exclusive, self._keys.fence)
        self._end_fn: Callable[[Hold], Any] = self._end
        self._lost_callbacks: List[Callable[[Any], Any]] = []

    # --- public surface ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The shared name: every object of this name on every host is the same lock."""
        return self._name

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Acquire the lock, blocking or non-blocking, as ``threading`` does.

        With ``blocking`` true (the default), wait until the lock is free anywhere, take it and
        return True. With a positive ``timeout``, wait at most that many seconds and return
        False if the lock could not be taken by then. With ``blocking`` false, try once and
        return at once. Arguments are checked exactly as by ``threading.Lock.acquire`` (same
        ValueError, OverflowError and TypeError). Redis errors propagate as
        ``redis.exceptions``; they never turn into False.
        """
        blocking_, timeout_ = check_acquire_args(blocking, timeout)
        return self._drive(self._acquire(blocking_, timeout_, _UNSET, 1))

    def try_lock(self, timeout: Optional[float] = 0.0, lease: Optional[float] = None) -> bool:
        """Try to take the lock for at most ``timeout`` seconds; ``tryLock(wait, lease)``.

        ``timeout`` 0 (the default) tries once; ``None`` waits as long as it takes. ``lease``
        None uses this lock's own lease (the watchdog unless the constructor said otherwise);
        a number of seconds makes this hold expire by itself after that long, never renewed.
        Return True when the lock was taken.
        """
        return self._drive(self._try_lock(timeout, lease))

    def locked(self) -> bool:
        """Return True if anyone, in any process on any host, holds the lock (one round trip)."""
        return self._drive(self._locked())

    def _try_lock(self, timeout: Optional[float], lease: Optional[float]) -> Flow[bool]:
        timeout_ = check_try_lock_timeout(timeout)
        lease_ = self._lease if lease is None else check_lease(lease)
        return self._acquire(True, timeout_, lease_, 1)

    def _locked(self) -> Flow[bool]:
        return bool((yield Read("EXISTS", self._keys.lock)))

    @property
    def token(self) -> Optional[int]:
        """The fencing token of the caller's current hold; None when it holds nothing.

        Tokens of one name strictly increase with every grant (re-entries keep theirs), also
        across a restart of a Redis that kept nothing. Pass it to the resource you write, and
        let the resource refuse any token lower than one it has seen. On a Redlock quorum
        (``client=[...]``) it is the largest of the quorum's tokens, and independent masters'
        tokens do not compose: it is not promised to increase (docs/guides/redlock.rst).
        """
        hold = self._current(self._session())
        return hold.token if hold is not None and hold.believed() else None

    def owned(self) -> bool:
        """True when the caller (this thread for DistRLock, this object for DistLock) holds
        the lock: its hold is not known to be lost, its connection to the server was not reset
        since its last renewal, and its local deadline (the send time of its last acknowledged
        grant or renewal, plus the lease) has not passed. Needs no round trip
        (docs/safety.rst, "Belief keeps time")."""
        hold = self._current(self._session())
        return hold is not None and hold.believed()

    def valid_for(self) -> float:
        """Seconds for which the caller's hold is still known to be valid, 0.0 when it has
        none; no round trip. Call it right before a side effect that the lock protects, and
        give the resource the fencing ``token`` too, so that it can refuse a holder that was
        paused past this (docs/safety.rst, "Belief keeps time")."""
        hold = self._current(self._session())
        return 0.0 if hold is None else hold.valid_for()

    def on_lost(self, callback: Callable[[Any], Any]) -> None:
        """Call ``callback(lock)`` when a hold taken through this object is found lost.

        It runs in the watchdog thread when a renewal finds the hold gone or someone else's, or
        in the releasing thread when ``release()`` finds it so. Exceptions it raises are logged.
        """
        add_lost_callback(self._lost_callbacks, callback)

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    # --- the shared machinery ---------------------------------------------------------------

    def _know_topology(self, client: Any) -> None:
        """What the kind of ``client`` decides, asked once, not per acquire. The asyncio shell
        calls it again with its own client, which it keeps from the blocking constructor."""
        #: a Redlock quorum (a list of masters)
        self._quorum = topology(client) == QUORUM
        #: the yield rule applies (``_core.shares``): a default lock on one server or a cluster (a
        #: Redlock quorum's masters could keep the lock for different processes)
        self._shares = not self._fair and not self._quorum

    def _acks(self) -> Acks:
        """What a grant waits for (``min_replicas``, ``replica_timeout``): None when nothing,
        and always for a Redlock quorum, whose masters have no replicas to wait for: there a
        ``configure(min_replicas=...)`` default does not apply (given to the constructor, the
        option is a TypeError: ``refuse_quorum``)."""
        if self._quorum:
            return None
        return acks_for(self._min_replicas, self._replica_timeout, settings())

    def _call_acquire(self, session: Session, owner: str, ms: int, count: int, mode: str,
                      waiter: Optional[Waiter] = None) -> Flow[int]:
        """One try. ``mode``: '' first try, 'w' a queued waiter's try, 'p' a try answering a
        hint (not registering), else the token being re-entered. A try for a new hold of a
        lock made with ``min_replicas`` waits for the replicas' acknowledgement (a re-entry
        creates no grant: it does not); too few, and the grant is given back and
        NotEnoughReplicasError raised."""
        keys = self._acquire_keys
        args: Tuple[Any, ...] = (owner, ms, ms + settings().fence_retention_ms, session.info + self._holder)
        if waiter is not None:
            others = "1" if len(waiter.channel.waiters) > 1 else "0"
            args += (mode, count, waiter.channel.name, registry_lease_ms(settings().wait_cap), others)
            if mode != "" and getattr(waiter, "taker", None) is not None:  # see lock_wait
                args += (waiter.taker.record,)  # its hand-off record (lock_acquire, ARGV[10])
        elif mode or count != 1:
            args += (mode,) if count == 1 else (mode, count)
        fresh = mode in ("", "w", "p")
        acks = self._acks() if fresh else None
        try:
            if acks is None:
                return int((yield Run("lock_acquire", keys, args)))
            reply, acked = yield Run("lock_acquire", keys, args, acks)
        except (redis.ResponseError, QuorumError, WrongKindError):
            raise  # the script did not run, or failed, or (Redlock) was undone: nothing was granted
        except BaseException:
            if fresh:
                yield from self._undo_lost_grant(owner)
            raise
        if int(reply) > 0:
            yield from give_back_unacked(self._name, acks, acked,
                                         functools.partial(self._undo_lost_grant, owner))
        return int(reply)

    def _undo_lost_grant(self, owner: str) -> Flow[None]:
        """The reply of a try for a new hold was lost (the connection failed, or the caller
        was interrupted or cancelled while it waited for it), and the try may have run (it is
        never sent again: docs/design.rst, principle 13). Read what happened; if the hold was granted,
        give it back, since the caller is told the acquire failed. If the server cannot be
        reached now either, a grant that did happen ends with its lease."""
        keys = self._keys
        try:
            count, token = yield Read("HMGET", keys.lock, owner, ":t")
            if count is not None and token is not None:
                yield Run("lock_release", (keys.lock, keys.queue), (owner, token, 0))
        except redis.RedisError:
            pass

    def _unregister(self, channel: str) -> Flow[None]:
        """The process' last waiter left without the lock: leave the registry, so that no
        release wakes this process for nothing (best effort: the entry expires anyway)."""
        try:
            yield Run("lock_unwait", (self._keys.queue, self._keys.lock), (channel,))
        except redis.RedisError:
            pass

    def _call_release(self, hold: Hold, count: int) -> Flow[int]:
        if self._fair:
            return (yield from fair_release(self, hold, count))
        return (yield from default_release(self, hold, count))

    def _acquire(self, blocking: bool, timeout: Optional[float], lease: Any, count: int) -> Flow[bool]:
        session = self._session()
        lease_s = self._lease if lease is _UNSET else lease
        watchdog = lease_s is None
        ms = lease_ms(settings().lease if lease_s is None else lease_s)

        meter = self._metered()
        sent_at = time.monotonic()
        held = self._current(session)
        if held is not None and self._reentrant == "1":
            try:
                yield from self._reenter(session, held, ms, count, watchdog)
            except BaseException:
                meter.acquired("error", time.monotonic() - sent_at)
                raise
            meter.acquired("acquired", time.monotonic() - sent_at)
            return True

        owner = self._owner_for(session)
        short: Optional[QuorumError] = None
        try:
            reply = yield from self._first_try(session, owner, ms, count, blocking and timeout != 0)
        except QuorumError as exc:
            # a Redlock quorum not reached: a blocking acquire tries again while it may wait
            if not blocking or timeout == 0:
                meter.acquired("error", time.monotonic() - sent_at)
                raise
            reply, short = -(QUORUM_RETRY_MS + 1), exc
        except BaseException:
            meter.acquired("error", time.monotonic() - sent_at)
            raise
        if reply > 0:
            self._grant(session, owner, reply, count, watchdog, ms, sent_at)
            meter.acquired("acquired", time.monotonic() - sent_at)
            return True
        if not blocking or timeout == 0:
            meter.acquired("refused", time.monotonic() - sent_at)
            return False
        waiting = self._waiting(session, owner, ms, count, watchdog)
        waiting.meter, waiting.started = meter, sent_at
        if short is not None and isinstance(waiting, _LockWaiting):
            waiting.short = short
            waiting.short_until = sent_at + ms / 1000.0
        return bool((yield from waiting_flow(waiting, timeout, start=WAIT)))

    def _first_try(self, session: Session, owner: str, ms: int, count: int, waits: bool) -> Flow[int]:
        """The try before any waiting (the uncontended path): its raw reply, a token > 0 on a
        grant. ``waits``: a refusal will be followed by a wait."""
        if self._fair:
            if self._acks() is not None:
                raise TypeError(FAIR_REPLICAS)
            return (yield from first_try(self, session, owner, ms, count))
        if self._shares:
            session.runs.touch(self._keys.lock, time.monotonic())
        return (yield from self._call_acquire(session, owner, ms, count, ""))

    def _waiting(self, session: Session, owner: str, ms: int, count: int, watchdog: bool) -> Waiting:
        """The wait after a refused first try. Each process waits on its own channel for this
        lock, registered (by its failed tries) with the lock, so that a release wakes one
        waiting process, not every subscriber. A fair lock's waiters queue in order (``_primitives.fair``)."""
        if self._fair:
            return FairWaiting(self, session, owner, ms, count, watchdog)
        return _LockWaiting(self, session, owner, ms, count, watchdog)

    def _reenter(self, session: Session, held: Hold, ms: int, count: int, watchdog: bool) -> Flow[bool]:
        if session.ran_out(held):  # lost, or past its local deadline or cap
            raise LockLostError(f"lease on {self._name!r} was lost; cannot re-enter it",
                                name=self._name, token=held.token)
        try:
            reply = yield from self._call_acquire(session, held.owner, ms, count, str(held.token))
        except (redis.ResponseError, QuorumError, WrongKindError):
            raise  # it did not run, or failed, or (Redlock) was undone: nothing was added
        except BaseException:
            yield from self._undo_lost_reentry(held, count)  # its reply was lost: lost.py
            raise
        if decode_reenter(reply) is LOST:
            session.mark_lost(held)
            raise LockLostError(f"lease on {self._name!r} was lost; cannot re-enter it",
                                name=self._name, token=held.token)
        held.count += count
        held.listeners.add(self)
        if watchdog and not held.watchdog:
            session.watch(held)
        return True

    @property
    def _hold_key(self) -> str:
        """The key a hold of this primitive is registered under (and renewed through)."""
        return self._keys.lock

    def _grant(self, session: Session, owner: str, token: int, count: int, watchdog: bool,
               ms: int, sent_at: float) -> Hold:
        hold = Hold(session, self._hold_key, owner, token=token, count=count, watchdog=watchdog,
                    lease_ms=ms, sent_at=sent_at, renew=self._renew_fn, end=self._end_fn,
                    notify=_notify_lost, meter=self._meter, grant=True, acks=self._acks())
        hold.expires_at -= session.executor.margin(ms)  # a Redlock hold: its clock drift
        hold.listeners.add(self)
        self._age(hold)
        self._remember(hold)
        session.add_hold(hold)
        return hold

    def _release(self, hold: Hold, session: Session, count: int) -> Flow[int]:
        """Give back ``count`` (0: all) of ``hold``; return the count still held.

        Raise LockLostError, after running the ``on_lost`` callbacks, when the hold turns out
        to be gone or someone else's, or its local deadline has passed (``Session.ran_out``).
        """
        if session.ran_out(hold):
            left = 0 if count == 0 else max(0, hold.count - count)
            hold.count = left
            if left == 0:
                self._forget(hold)
                session.drop_hold(hold)
                # Its belief may have ended at its local deadline while Redis still has it
                # (or a reader's entry lingers): give back whatever is still ours, once; the
                # script checks the owner and token, so it never touches another's hold.
                try:
                    yield from self._call_release(hold, 0)
                except redis.RedisError:
                    pass  # it then ends with its lease in Redis
            raise LockLostError(f"lease on {self._name!r} was lost before release",
                                name=self._name, token=hold.token, cause=hold.cause)
        hold.releasing = True  # a renewal racing this release must not call the hold lost
        depth = hold.count
        try:
            outcome = decode_release((yield from self._call_release(hold, count)))
        except BaseException as exc:
            cancelled = isinstance(exc, asyncio.CancelledError)
            if cancelled and self._hold_key == self._keys.lock:
                # An asyncio release cut short (its loop is shutting down and cancelled the
                # tasks it waits on): the watchdog thread finishes it, reading first whether
                # it ran. The hold stays registered meanwhile, so interpreter exit gives it
                # back if the process ends first. A release is never left undone.
                session.defer(functools.partial(_finish_release, self, session, hold, count, depth))
                raise
            # Its reply was lost: read whether it ran, finish it if not (lost.py). What cannot
            # be read: stop renewing, so that, at worst, the hold ends with its lease.
            kept = None if cancelled else (yield from self._settle_lost_release(hold, count, depth))
            if kept is None:
                self._forget(hold)
                session.drop_hold(hold)
            else:
                hold.count, hold.releasing = kept, False
            raise
        extra = 0 if outcome is LOST else surplus(hold, outcome.left, depth - count if count else 0)  # type: ignore[union-attr]
        if extra > 0:  # levels of a re-entry whose reply was lost, not read then: give them back
            outcome = decode_release((yield from self._call_release(hold, extra)))
        if outcome is LOST:
            self._forget(hold)
            session.drop_hold(hold)
            session.mark_lost(hold)
            raise LockLostError(f"lease on {self._name!r} was lost before release",
                                name=self._name, token=hold.token, cause=hold.cause)
        left = hold.count = outcome.left  # type: ignore[union-attr]  # Released
        if left == 0:
            self._forget(hold)
            session.drop_hold(hold)
        else:
            hold.releasing = False
        return left

    def _undo_lost_reentry(self, hold: Hold, added: int) -> Flow[None]:
        """A re-entry of ``hold`` lost its reply: give back the levels it added (lost.py)."""
        keys = self._keys
        yield from reentry_lost(hold, keys.lock, added, lambda n: Run(
            "lock_release", (keys.lock, keys.queue), (hold.owner, hold.token, n)))

    def _settle_lost_release(self, hold: Hold, count: int, depth: int) -> Flow[Optional[int]]:
        """A release of ``hold`` lost its reply: the levels still held, None for none or
        unknown (lost.py)."""
        return (yield from settle_release(hold, hold.key, count, depth,
                                          lambda: self._call_release(hold, count)))

    def _still_held(self, hold: Hold) -> bool:
        """One round trip: is ``hold`` still in Redis, with its token? (``distlock run``
        checks this every second.) Redis errors propagate: a reply of the wrong type is never
        taken for an answer."""
        current = hold.session.read("HGET", hold.key, ":t")
        return current is not None and int(current) == hold.token

    def _end(self, hold: Hold) -> None:
        drive(self._call_release(hold, 0), hold.session)

    def _fire_lost(self) -> None:
        fire_lost(self, self._lost_callbacks)

    # --- what subclasses define -------------------------------------------------------------

    def release(self) -> None:
        self._drive(self._release_one())

    def _release_one(self) -> Flow[None]:
        """``release()``, a flow: its checks raise before its first round trip."""
        raise NotImplementedError
        yield

    def _owner_for(self, session: Session) -> str:
        raise NotImplementedError

    def _current(self, session: Session) -> Optional[Hold]:
        raise NotImplementedError

    def _remember(self, hold: Hold) -> None:
        raise NotImplementedError

    def _forget(self, hold: Hold) -> None:
        raise NotImplementedError


def _notify_lost(lock: _LockBase) -> None:
    lock._fire_lost()


def _renew_exclusive(fence: str, batch: Batch, hold: Hold, ms: int) -> None:
    """Queue one ``lock_renew`` of ``hold`` (an exclusive hash: a lock, or a writer)."""
    batch.script("lock_renew", (hold.key, fence),
                 (hold.owner, hold.token, ms, ms + settings().fence_retention_ms))


def _end_whole(keys: Keys, hold: Hold) -> None:
    """Give a DistLock's whole hold back without a reference to the object (see ``__del__``);
    blocking (the watchdog thread, or interpreter exit)."""
    hold.session.run("lock_release", (keys.lock, keys.queue), (hold.owner, hold.token, 0))


