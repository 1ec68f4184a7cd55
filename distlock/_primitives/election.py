"""DistElection: one leader at a time among every process that campaigns for a name, with an
epoch (docs/guides/elections.rst).

A leadership is the exclusive hold of the name, taken by a DistLock (a name is one lock:
a DistLock of the same name competes with the candidates), whose holder info carries the
leader's value (``_core.election``). So the lock gives everything else: the wait, the
watchdog's renewals, the belief rule (``is_leader``, ``valid_for``), ``max_hold``, ``bound()``,
the loss report (``on_revoked``), and the epoch, which is the hold's fencing token: strictly
greater than every earlier leader's, also across a restart of a server that kept nothing.
Tokens of a Redlock quorum give no such order, so a quorum is refused.

Every grant and every release of a candidate publishes a hint on the election's channel, off
the caller's path (the session's chores); ``observe()`` looks again at each hint, and at most
``wait_cap`` seconds, or the leader's lease, after its last look (docs/design.rst, principle 1).
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Iterator, Optional

import redis

from .._core.checks import check_seconds
from .._core.election import Leader, check_value, holder_suffix
from .._core.errors import LockLostError, LockNotOwnedError
from .._core.flow import Flow, drive
from .._core.outcomes import Busy, Done, Outcome
from .._redis import QUORUM, topology
from .._session.session import Hold, Session
from .engine import Waiting, waiting_flow
from .lock import DistLock
from .lock_base import _UNSET

__all__ = ["DistElection", "Leadership", "Leader", "refuse_election_quorum"]

#: what ``observe()``'s wait returns when its timeout passed with no change
_QUIET = object()


def refuse_election_quorum(client: object) -> None:
    """TypeError for a Redlock quorum: independent masters' tokens are no epochs."""
    if topology(client) == QUORUM:
        raise TypeError("DistElection does not run on a Redlock quorum (a list of masters): its "
                        "epochs must strictly increase, and independent masters' tokens do not; "
                        "use one server, Sentinel or a cluster")


def check_campaign_timeout(timeout: object) -> Optional[float]:
    """``campaign(timeout=...)``: None (or infinity) waits as long as it takes, 0 tries once,
    else seconds; TypeError and ValueError for anything else."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__}")
    if timeout != timeout or timeout < 0:
        raise ValueError(f"timeout must be 0 or more seconds, not {timeout!r}")
    return None if math.isinf(timeout) else float(timeout)


def _hint(session: Session, lock: _Candidate) -> None:
    """Tell every observer to look (a chore: the caller's result does not depend on it, and an
    observer that misses it looks by itself within its bound)."""
    try:
        drive(lock._read_leader(publish=True), session)
    except redis.RedisError:
        pass


class _Candidate(DistLock):
    """The lock a DistElection campaigns with: its holds carry the value, and each grant and
    release hints the election's observers."""

    _metric_kind = "election"

    def _grant(self, session: Session, owner: str, token: int, count: int, watchdog: bool,
               ms: int, sent_at: float) -> Hold:
        hold = super()._grant(session, owner, token, count, watchdog, ms, sent_at)
        session.defer(functools.partial(_hint, session, self))
        return hold

    def _release(self, hold: Hold, session: Session, count: int) -> Flow[int]:
        try:
            return (yield from super()._release(hold, session, count))
        finally:
            session.defer(functools.partial(_hint, session, self))


class Leadership:
    """What a won ``campaign()`` returns: this process' leadership of one election.

    ``epoch`` is the hold's fencing token: pass it to whatever the leader writes, so that a
    leader paused past its lease is refused there. ``is_leader()`` and ``valid_for()`` follow
    the belief rule (no round trip). ``with election.campaign(...) as leadership:`` resigns
    at the end of the block.
    """

    __slots__ = ("election", "value", "epoch")

    def __init__(self, election: DistElection, value: str, epoch: int) -> None:
        self.election = election
        self.value = value
        self.epoch = epoch

    @property
    def name(self) -> str:
        return self.election.name

    def is_leader(self) -> bool:
        """True while this leadership is believed (see ``DistElection.is_leader``)."""
        return self.election._holds(self) and self.election._lock.owned()

    def valid_for(self) -> float:
        """Seconds this leadership is still known to be valid; 0.0 once it is not."""
        return self.election._lock.valid_for() if self.election._holds(self) else 0.0

    def resign(self) -> Any:
        """``election.resign()`` for this leadership (LockNotOwnedError when it already ended)."""
        if not self.election._holds(self):
            raise LockNotOwnedError("this leadership has ended", name=self.name)
        return self.election.resign()

    def __enter__(self) -> Leadership:
        if inspect.iscoroutinefunction(self.election.resign):
            raise TypeError("a distlock.asyncio leadership resigns with 'async with'")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.election._holds(self):
            self.election.resign()

    async def __aenter__(self) -> Leadership:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self.election._holds(self):
            ended: Any = self.election.resign()  # type: ignore[func-returns-value]
            if inspect.isawaitable(ended):  # the asyncio shell's
                await ended

    def __repr__(self) -> str:
        state = "leading" if self.is_leader() else "ended"
        return f"<distlock.Leadership {state} name={self.name!r} epoch={self.epoch} value={self.value!r}>"


class DistElection:
    """One leader at a time among every process, on every host, that campaigns for ``name``.

    ``campaign(value="", timeout=None)`` waits until this process leads and returns a
    ``Leadership`` whose ``epoch`` is its fencing token; TimeoutError when ``timeout`` seconds
    passed first. ``is_leader()``, ``valid_for()``: the belief rule, no round trip.
    ``resign()`` gives the leadership up (the next candidate is woken). ``on_revoked(cb)``
    calls ``cb(election)`` when a leadership is found lost. ``bound(value, timeout)`` runs a
    block as the leader and stops it when the leadership is lost, as ``lock.bound()`` does.
    ``leader()`` reads the current leader (a ``Leader``, or None) without campaigning, and
    ``observe()`` yields each change of leader.

    Keyword-only options, as DistLock's: ``client``, ``lease``, ``max_hold``, ``min_replicas``,
    ``replica_timeout``. TypeError for a Redlock quorum. The election of a name is the lock of
    that name: a DistLock of the same name, while held, is the leader (with the value "").
    """

    _candidate_class: Any = _Candidate

    def __init__(self, name: str, *, client: Any = None, lease: Optional[float] = None,
                 max_hold: Optional[float] = None, min_replicas: Optional[int] = None,
                 replica_timeout: Optional[float] = None) -> None:
        refuse_election_quorum(client)
        self._lock: _Candidate = self._candidate_class(name, client=client, lease=lease, max_hold=max_hold,
                                           min_replicas=min_replicas, replica_timeout=replica_timeout)
        self._leadership: Optional[Leadership] = None

    @property
    def name(self) -> str:
        return str(self._lock.name)

    def campaign(self, value: str = "", *, timeout: Optional[float] = None) -> Leadership:
        """Wait until this process leads the election; return its ``Leadership``.

        ``value`` (a str of at most 1024 characters) is what ``leader()`` and ``observe()``
        show for it. ``timeout`` None waits as long as it takes; a number waits at most that
        many seconds (0: one try) and then raises TimeoutError. RuntimeError when this object
        leads already. Redis errors propagate."""
        return self._lock._drive(self._campaign(value, timeout))

    def resign(self) -> None:
        """Give the leadership up: the next candidate is woken. LockNotOwnedError (a
        RuntimeError) when this object does not lead; LockLostError when the leadership had
        been lost meanwhile (nothing is then given up)."""
        self._lock.release()
        self._leadership = None

    def is_leader(self) -> bool:
        """True when this object leads and its leadership is believed: not known lost, and its
        local deadline not passed (docs/safety.rst, "Belief keeps time"). No round trip."""
        return self._lock.owned()

    def valid_for(self) -> float:
        """Seconds for which this object's leadership is still known to be valid (0.0 when it
        has none). Check it, and pass the ``epoch`` on, before each act of the leader."""
        return self._lock.valid_for()

    def on_revoked(self, callback: Callable[[Any], Any]) -> None:
        """Call ``callback(election)`` when a leadership of this object is found lost (its
        lease ran out unrenewed, its local deadline or ``max_hold`` passed, someone else took
        the name); in the watchdog thread (asyncio: the loop), as ``on_lost``."""
        self._lock.on_lost(functools.partial(_revoked, self, callback))

    def bound(self, value: str = "", *, timeout: Optional[float] = None) -> Any:
        """``with election.bound(value) as scope:`` campaigns (TimeoutError after ``timeout``),
        runs the block as the leader (``scope.token`` is the epoch), stops it with
        LockLostError when the leadership is lost, and resigns at its end: ``lock.bound()``,
        with its limits (docs/guides/bound.rst)."""
        holder = holder_suffix(check_value(value))
        seconds = check_campaign_timeout(timeout)
        held = self._lock._current(self._lock._session())
        if held is not None and not held.lost:  # its own hold would keep it waiting for ever
            raise RuntimeError(f"this DistElection leads {self.name!r} already: resign() first")
        scope = self._lock.bound(False) if seconds == 0 else self._lock.bound(
            True, -1 if seconds is None else seconds)
        self._lock._holder = holder
        return scope

    def leader(self) -> Optional[Leader]:
        """Who leads now, read from Redis (one round trip): a ``Leader`` (value, epoch, host,
        pid, ttl), or None when nobody does."""
        return self._lock._drive(self._look())

    def observe(self, timeout: Optional[float] = None) -> Iterator[Optional[Leader]]:
        """Yield the current leader (a ``Leader``, or None while nobody leads), then each
        change of leader as it happens. A leadership that began and ended between two looks
        may be missed; epochs only grow. With ``timeout``, the iteration ends when that many
        seconds pass with no change."""
        seconds = None if timeout is None else check_seconds(timeout, "timeout")
        last: Any = _QUIET
        while True:
            found = self._lock._drive(self._next_change(last, seconds))
            if found is _QUIET:
                return
            last = found
            yield found

    def __repr__(self) -> str:
        token = self._lock.token
        state = "not leading" if token is None else f"leading epoch={token}"
        return f"<distlock.DistElection name={self.name!r} {state} at {id(self):#x}>"

    # --- the flows, for both shells ------------------------------------------------------------

    def _holds(self, leadership: Leadership) -> bool:
        return self._leadership is leadership and self._lock._current(self._lock._session()) is not None

    def _campaign(self, value: str, timeout: Optional[float]) -> Flow[Leadership]:
        value = check_value(value)
        seconds = check_campaign_timeout(timeout)
        lock = self._lock
        session = lock._session()
        held = lock._current(session)
        if held is not None:
            if not (held.lost or session.ran_out(held)):  # believed, or suspended after a reset
                raise RuntimeError(f"this DistElection leads {self.name!r} already: resign() first")
            try:  # a leadership that ended (lost, or past its deadline) and was never resigned
                yield from lock._release_one()
            except LockLostError:
                pass
            self._leadership = None
        lock._holder = holder_suffix(value)
        if not (yield from lock._acquire(seconds != 0, seconds, _UNSET, 1)):
            raise TimeoutError(f"not elected leader of {self.name!r} within {timeout} s")
        hold = lock._current(session)
        if hold is None:  # released meanwhile by another thread of this process (resign)
            raise RuntimeError(f"the leadership of {self.name!r} ended as it was won")
        leadership = self._leadership = Leadership(self, value, hold.token)
        return leadership

    def _look(self) -> Flow[Optional[Leader]]:
        return (yield from self._lock._read_leader())

    def _next_change(self, last: Any, timeout: Optional[float]) -> Flow[Any]:
        waiting = _Observing(self, last)
        waiting._session = self._lock._session()
        return (yield from waiting_flow(waiting, timeout))


def _revoked(election: DistElection, callback: Callable[[Any], Any], _lock: Any) -> Any:
    return callback(election)


class _Observing(Waiting):
    """One wait of ``observe()`` for a leader other than ``last`` (its epoch, 0 for none)."""

    strict = True  # every observer of the process looks within its bound, not only the first

    def __init__(self, election: DistElection, last: Any) -> None:
        self.channel = election._lock._look_keys[1]
        self._election = election
        self._last = last

    def attempt(self, mode: str, waiter: Any) -> Flow[Outcome]:
        leader = yield from self._election._look()
        epoch = leader.epoch if leader is not None else 0
        if self._last is _QUIET or epoch != (self._last.epoch if self._last is not None else 0):
            return Done(leader)
        return Busy(leader.ttl + 0.001 if leader is not None else None)

    def timed_out(self) -> Any:
        return _QUIET
