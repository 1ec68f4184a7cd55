"""DistBarrier: ``threading.Barrier`` across processes and hosts.

The barrier's state is one Redis hash and two sorted sets (see
:class:`~distlock._core.keys.BarrierKeys`): the current generation, the parties of that
generation waiting (each with a lease, renewed by the session watchdog), and a record of the
generations that ended broken. Each arrival is one script: it either joins the waiters (its
index is how many arrived before it) or, for the last party, trips the generation, naming every
waiter in one pub/sub hint, so they return without another round trip. With an ``action``, the
last party runs it first, under a lease of its own, and reports back. A break (timeout,
``abort()``, ``reset()``, an action that raised, a party whose lease ran out because its process
died) is published to every waiter, which then raises ``threading.BrokenBarrierError``.

Generations replace ``threading``'s "draining" state: a party that arrives right after a trip
joins the next generation at once, while the released ones leave.
"""

from __future__ import annotations

import operator
import os
import threading
import time
from typing import Any, Callable, Optional, Tuple, TypeVar

import redis

from .._core.checks import check_name, wait_seconds
from .._core.deadlines import lease_ms
from .._core.flow import Flow, Read, Run
from .._core.keys import BarrierKeys
from .._core.outcomes import (
    JOINED,
    MISMATCH,
    RUN_ACTION,
    Busy,
    Done,
    Failed,
    Outcome,
    barrier_arrival,
    barrier_done,
    barrier_poll,
)
from .._core.replicas import refuse_options
from .._core.replies import parties_mismatch
from .._core.settings import settings
from .._core.wait_policy import FIRST, LAST
from .._redis.clients import ClientArg, check_client
from .._session.session import Hold, Session, SessionUser
from .engine import Waiting, waiting_flow


def check_parties(parties: object) -> int:
    """A barrier's parties: an integer, at least 1 (``threading`` checks neither before Python
    3.13; a barrier of 0 parties would never trip)."""
    count = int(operator.index(parties))  # type: ignore[arg-type]  # int(): True is 1
    if count < 1:
        raise ValueError("parties must be >= 1")
    return count


def check_barrier_timeout(timeout: object) -> Optional[float]:
    """A barrier's timeout: None (wait for ever), or seconds; zero or negative breaks the
    barrier at once unless the caller is the last party, as in ``threading``. The errors are
    the ones threading raises when it waits: TypeError, OverflowError; NaN raises ValueError
    (threading would spin for ever)."""
    if timeout is None:
        return None
    return wait_seconds(timeout)


def check_action(action: object) -> None:
    if action is not None and not callable(action):
        raise TypeError(f"action must be callable or None, not {type(action).__name__}")


def broken_keep_ms(lease: float, wait_cap: float, queue_cap_factor: float) -> int:
    """How long a barrier remembers that a generation broke: far longer than any of its waiters
    can go without looking (a waiter that cannot look that long has lost its lease too)."""
    return lease_ms(max(10.0 * lease, 4.0 * wait_cap * queue_cap_factor, 60.0))


def barrier_repr(obj: object, name: str, broken: bool, waiting: int, parties: int) -> str:
    """``<distlock.DistBarrier at 0x…: waiters=1/3 name='b'>`` or ``…: broken name='b'>``."""
    state = "broken" if broken else f"waiters={waiting}/{parties}"
    return f"<distlock.DistBarrier at {id(obj):#x}: {state} name={name!r}>"


__all__ = ["DistBarrier"]

BrokenBarrierError = threading.BrokenBarrierError

T = TypeVar("T")


class DistBarrier(SessionUser):
    """``threading.Barrier`` shared by every process and host that names it on one Redis.

    ``DistBarrier(name, parties, action=None, timeout=None, *, client=None)``. ``wait()``
    blocks until ``parties`` callers, anywhere, are waiting, then releases them all; each gets
    a distinct index from 0 to ``parties - 1``. The barrier is reusable: the next ``parties``
    calls form the next generation.

    - ``action``, when given, is called once per generation by the last party to arrive
      (in that party's process, so every process should pass the same action) before the
      others are released. If it raises, the barrier breaks and the exception propagates in
      that party; the others raise ``threading.BrokenBarrierError``.
    - ``timeout`` is the default for ``wait()``. A wait that times out breaks the barrier, as in
      ``threading``.
    - Breaking raises ``threading.BrokenBarrierError`` itself, in every waiter on every host.
      A broken barrier stays broken (in Redis, for good) until ``reset()``.
    - A party that dies while it waits breaks the barrier when its lease runs out (the session
      watchdog renews it while the process lives; ``configure(lease=...)``), so the others are
      never left hanging, with or without a timeout. A party interrupted while it waits
      (KeyboardInterrupt, say) breaks it at once.
    - ``parties``, ``n_waiting`` and ``broken`` as in ``threading``; the last two ask Redis.

    Every process must give a barrier the same ``parties``: the first arrival records it, and a
    barrier in use with another number raises ValueError naming the recorded one (checked by
    the scripts, at the first ``wait()``; the constructor does no I/O). A barrier at rest (no
    one waiting, not broken) leaves nothing in Redis once the leases of the parties its last
    trip released have run out (until then, the record of that trip, which a party that
    missed the trip's hint reads); the number of parties is forgotten at rest.

    **Lost state is not a trip.** A party is released only when Redis shows that its generation
    tripped. If the server loses its data while parties wait (a restart without persistence),
    or their process could not renew their leases before they ran out (stopped, cut off), the
    waiting parties raise ``threading.BrokenBarrierError`` when they next look. Out of memory
    (maxmemory under noeviction), the parties' renewals, a trip, a break (timeout,
    ``abort()``) and ``reset()`` still work; a party that would join, which needs memory,
    raises Redis' ``OutOfMemoryError`` and changes nothing.

    ``client``: a ``redis.Redis`` or a URL; by default, see ``configure``.
    """

    _metric_kind = "barrier"
    #: how an interrupted party leaves (``bar_poll``): 'b' breaks the barrier, as threading
    #: does; the asyncio shell's 'l' leaves a filling barrier as it is, as asyncio does
    _leave_mode = "b"

    def __init__(self, name: str, parties: int, action: Optional[Callable[[], Any]] = None,
                 timeout: Optional[float] = None, *, client: ClientArg = None,
                 min_replicas: Any = None, replica_timeout: Any = None) -> None:
        self._name = check_name(name)
        refuse_options(type(self).__name__, min_replicas, replica_timeout)
        self._parties = check_parties(parties)
        check_action(action)
        self._action = action
        self._timeout = check_barrier_timeout(timeout)
        if client is not None:
            check_client(client, type(self).__name__)
        self._client_arg = client
        self._client: Any = None
        self._keys = BarrierKeys.of(settings().prefix, self._name)
        #: (broken, waiting) as of this object's last round trip (for repr, which does no I/O)
        self._seen: Tuple[bool, int] = (False, 0)

    # --- threading's surface ------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The shared name: every barrier of this name on every host is the same."""
        return self._name

    @property
    def parties(self) -> int:
        """The number of parties required to trip the barrier."""
        return self._parties

    @property
    def n_waiting(self) -> int:
        """The number of parties waiting in the current generation now, anywhere (0 while
        broken). One round trip."""
        return self._drive(self._n_waiting_flow())

    @property
    def broken(self) -> bool:
        """True if the barrier is broken. One round trip."""
        return self._drive(self._broken_flow())

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait until ``parties`` callers, anywhere, wait on the barrier; return this caller's
        index, distinct within the generation, from 0 to ``parties - 1``.

        ``timeout`` (seconds) defaults to the barrier's own. When it runs out before the
        generation trips, the barrier breaks and ``threading.BrokenBarrierError`` is raised
        (zero or less: at once, unless this caller is the last party). The last party runs
        the action, if any, before anyone is released; if the action raises, the barrier
        breaks and the exception propagates here. ``threading.BrokenBarrierError`` when the
        barrier is broken on entry or breaks while waiting. ValueError when the barrier is in
        use with another number of parties. ``threading``'s errors for a bad timeout
        (TypeError, OverflowError; ValueError for NaN). Redis errors propagate as
        ``redis.exceptions``.
        """
        return self._drive(self._wait_flow(timeout))

    def reset(self) -> None:
        """Reset the barrier to its initial state: the parties waiting now, anywhere, raise
        ``threading.BrokenBarrierError``, and the barrier is usable again (no longer broken).
        One round trip."""
        self._drive(self._reset_flow())

    def abort(self) -> None:
        """Put the barrier into the broken state: every party waiting now and every later
        ``wait()``, anywhere, raises ``threading.BrokenBarrierError`` until ``reset()``. One
        round trip."""
        self._drive(self._abort_flow())

    def __repr__(self) -> str:
        broken, waiting = self._seen
        return barrier_repr(self, self._name, broken, waiting, self._parties)

    # --- the flows: the operations above, for both shells (see ``_core.flow``) -------------------

    def _n_waiting_flow(self) -> Flow[int]:
        return (yield from self._info())[1]

    def _broken_flow(self) -> Flow[bool]:
        return (yield from self._info())[0]

    def _wait_flow(self, timeout: Optional[float]) -> Flow[int]:
        """``wait()``: its checks raise before its first round trip."""
        seconds = self._timeout if timeout is None else check_barrier_timeout(timeout)
        session = self._session()
        waiting = _BarrierWaiting(self, session)
        waiting.meter = self._metered()
        try:
            return int((yield from waiting_flow(waiting, seconds)))
        finally:
            if waiting.hold is not None:
                session.drop_hold(waiting.hold)

    def _reset_flow(self) -> Flow[None]:
        yield Run("bar_reset", self._keys.all, ("r", self._parties, self._keep()))
        self._seen = (False, 0)

    def _abort_flow(self) -> Flow[None]:
        yield Run("bar_reset", self._keys.checked, ("a", self._parties, self._keep()))
        self._seen = (True, 0)

    # --- the machinery ------------------------------------------------------------------------

    @staticmethod
    def _keep() -> int:
        cfg = settings()
        return broken_keep_ms(cfg.lease, cfg.wait_cap, cfg.queue_cap_factor)

    def _arrive(self, wid: str, ms: int, keep: int) -> Flow[Tuple[int, int, int]]:
        reply = yield Run("bar_wait", self._keys.checked,
                       (wid, ms, self._parties, "1" if self._action else "0", keep))
        return int(reply[0]), int(reply[1]), int(reply[2])

    def _poll(self, wid: str, gen: int, mode: str, keep: int) -> Flow[int]:
        return int((yield Run("bar_poll", self._keys.all, (wid, gen, mode, keep))))

    def _info(self) -> Flow[Tuple[bool, int]]:
        """(broken, waiting), one round trip."""
        reply = yield Run("bar_info", self._keys.all, (self._keep(),))
        self._seen = (bool(int(reply[0])), int(reply[1]))
        return self._seen

    def _renewer(self, kind: str) -> Callable[[Any, Hold, int], Any]:
        keys = self._keys.all

        def renew(batch: Any, hold: Hold, ms: int) -> None:
            batch.script("bar_renew", keys, (hold.owner, ms, kind))

        return renew

    def _run_action(self, wid: str, gen: int, index: int, keep: int) -> Flow[int]:
        """The last party: run the action, then trip the generation (or break the barrier)."""
        action = self._action
        assert action is not None
        try:
            action()
        except BaseException:
            self._seen = (True, 0)
            yield Run("bar_done", self._keys.all, (wid, gen, "0", keep))
            raise
        if type(barrier_done((yield Run("bar_done", self._keys.all, (wid, gen, "1", keep))))) is Failed:
            self._seen = (True, 0)
            raise BrokenBarrierError
        self._seen = (False, 0)
        return index

    def _arrived(self, session: Session, wid: str, code: int, index: int, gen: int,
                 sent_at: float, keep: int) -> Flow[Tuple[Outcome, Optional[Hold]]]:
        """What ``bar_wait``'s reply means (``_core.outcomes.barrier_arrival``): the wait's outcome,
        and the hold whose lease the watchdog now renews (the action's runner, or a waiting
        party)."""
        outcome = barrier_arrival(code, index)
        if outcome is MISMATCH:
            return Failed(ValueError(parties_mismatch(self._name, index, self._parties))), None
        if outcome is not RUN_ACTION and outcome is not JOINED:
            if type(outcome) is Failed:
                self._seen = (True, 0)
            elif type(outcome) is Done:
                self._seen = (False, 0)
            return outcome, None
        runs = outcome is RUN_ACTION
        ms = lease_ms(settings().lease)
        hold = Hold(session, self._keys.state if runs else self._keys.waiters,
                    wid, token=0, count=1, watchdog=True, lease_ms=ms, sent_at=sent_at,
                    renew=self._renewer("a" if runs else "w"), meter=self._metered())
        session.add_hold(hold)
        if runs:
            try:
                return Done((yield from self._run_action(wid, gen, index, keep))), hold
            except BaseException:
                session.drop_hold(hold)  # the wait never learns of this hold: drop it here
                raise
        self._seen = (False, index + 1)
        return Busy(None), hold

    def _polled(self, code: int, index: int, last: bool) -> Outcome:
        outcome = barrier_poll(code, index, last)
        if type(outcome) is Done:
            self._seen = (False, 0)
        elif type(outcome) is Failed:
            self._seen = (True, 0)
        return outcome


class _BarrierWaiting(Waiting):
    """One party's wait: arrive (``FIRST``; again while the previous generation's action
    runs), then look after each sleep until the generation trips; the look at the deadline
    breaks the barrier. Interrupted while waiting, it breaks the barrier at once: the
    generation cannot complete as it stands."""

    def __init__(self, barrier: DistBarrier, session: Session) -> None:
        self.ident = self.wid = f"{session.id}:{os.urandom(8).hex()}"
        self.channel = barrier._keys.channel
        self.hold: Optional[Hold] = None
        self._barrier = barrier
        self._session = session
        self._ms = lease_ms(settings().lease)
        self._keep = barrier._keep()
        self._index = self._gen = 0

    def attempt(self, mode: str, waiter: Any) -> Flow[Outcome]:
        barrier, session = self._barrier, self._session
        if mode == FIRST:
            sent_at = time.monotonic()
            code, self._index, self._gen = yield from barrier._arrive(self.wid, self._ms, self._keep)
            outcome, self.hold = yield from barrier._arrived(session, self.wid, code, self._index,
                                                             self._gen, sent_at, self._keep)
            return outcome
        last = mode == LAST
        code = yield from barrier._poll(self.wid, self._gen, "b" if last else "p", self._keep)
        return barrier._polled(code, self._index, last)

    def abandon(self) -> Flow[None]:
        barrier = self._barrier
        if self.hold is not None and self.hold.key == barrier._keys.waiters:
            yield from barrier._poll(self.wid, self._gen, barrier._leave_mode, self._keep)
        elif self.hold is None and barrier._leave_mode == "l":
            # the arrival's reply never came (cancelled): it may have arrived; leave
            try:
                yield Read("ZREM", barrier._keys.waiters, self.wid)
            except redis.RedisError:
                pass

    def named(self) -> int:  # our id in a trip's hint: released, nothing to ask
        self._barrier._seen = (False, 0)
        return self._index
