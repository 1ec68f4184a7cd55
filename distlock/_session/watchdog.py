"""The watchdog: the registry of a session's holds, the thread that keeps their deadlines, and
the batched renewal of the watchdog holds.

The watchdog thread keeps time and does no I/O (docs/design.rst, principle 14). It wakes for
the earliest local deadline of the holds it serves (``Hold.expires_at``, watchdog holds and
fixed leases alike) and reports a hold lost there, whatever I/O is in flight; it starts a
renewal round every ``renew_interval`` on the ``renewals`` worker, and hands the clean-up round
trips that releases leave behind (``defer``, ``defer_at``, abandoned holds) to the ``chores``
worker. So a renewal that hangs on a blackholed network, or a clean-up on a connection without
a timeout, delays neither ``on_lost`` nor each other.

No exception of any kind stops the watchdog (docs/design.rst, principle 11): a renewal that
fails for any reason, a Redis error or not (redis-py's cluster pipeline raises
RedisClusterException, which is not a RedisError), is logged and tried again soon, and a hold
whose deadline has passed without a renewal is reported lost: ``on_lost`` runs, ``owned()``
turns False, ``release()`` raises LockLostError. A renewal that comes back after its hold was
reported lost gives the hold back, since nobody believes it any more.

A connection to the server that was reset (``suspend``) suspends belief in every hold until a
renewal confirms it (it is believed again) or finds it gone (it is lost). The thread also waits
on the watchdog's idle connection (``_session.wakeup``), and every belief check peeks at it
(``look_for_reset``): no hold is believed once its server's FIN has arrived.

The thread starts with the first hold (or deferred task) and exits after ``IDLE_EXIT`` seconds
with neither; it starts again on demand. As it looks, and as it exits, the executor gives back
the connections it kept out of the pool (``_redis.direct.HotLender``): those unused for a
second, and all of them when the thread exits (the ``chores`` worker gives them back: the pool's
lock, and the re-authentication redis-py may do then, are no place for this thread).
"""

from __future__ import annotations

import collections
import functools
import heapq
import logging
import math
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Tuple

from .._core.settings import settings
from .hold import Hold
from .renewal import give_back_lost, renew_round
from .renewer import OwnConnection
from .wakeup import Wakeup
from .worker import Worker

__all__ = ["Hold", "Watchdog", "IDLE_EXIT"]

log = logging.getLogger("distlock")

#: How long the watchdog thread stays with nothing to renew or run before it exits, and how
#: often it looks (seconds): together well inside the 1 s that CPython's test harness gives the
#: threads a test started to end.
IDLE_EXIT = 0.2
TICK = 0.1


class Watchdog(OwnConnection):
    """The registry of a session's holds and the thread that renews the watchdog ones.

    ``executor`` is called for the executor to renew through (its ``renewal_batch``);
    ``on_lost(hold, cause)`` reports a hold found lost (the session tells the primitives).
    """

    def __init__(self, executor: Callable[[], Any], tag: str,
                 on_lost: Callable[[Hold, str], None]) -> None:
        self._executor = executor
        self._tag = tag
        self._on_lost = on_lost
        self.mutex = threading.Lock()
        self.holds: Dict[Tuple[str, str], Hold] = {}
        self._thread: Optional[threading.Thread] = None
        self._kick = Wakeup()
        #: an idle socket ended the last wait but was not closed: the next wait leaves them out
        self._quiet_sockets = False
        #: clean-up round trips that must not delay the caller (see ``defer``)
        self._deferred: Deque[Callable[[], object]] = collections.deque()
        #: tasks for later: a heap of (when, sequence, task), on time.monotonic()'s clock
        self._timed: List[Tuple[float, int, Callable[[], object]]] = []
        self._timed_seq = 0
        self._abandoned: Deque[Hold] = collections.deque()  # see ``abandon``
        #: the I/O the thread hands off (see the module's docstring)
        self.renewals = Worker(f"distlock-renewals-{tag}")
        self.chores = Worker(f"distlock-chores-{tag}")
        #: a renewal round is in flight on ``renewals``; when the last one ended, and what it
        #: asked for (None: all went through; else the delay before the next try)
        self._round_busy = False
        self._round_ended: Optional[Tuple[float, Optional[float]]] = None
        #: set by ``suspend``: a round is due at once, to confirm or lose the suspended holds
        self._confirm = False
        # the watchdog's own connection (``renewer.OwnConnection``)
        self._renewal_open = self._renewal_io = False
        self._io_executor = None
        self._idle = False  # the thread is sleeping out its idle time (set under the mutex)
        #: when the thread's current wait ends (time.monotonic()); infinity while it is not
        #: waiting (it looks at everything before its next wait): work due no sooner than this
        #: needs no kick, which would wake the thread on the caller's path for nothing
        self._wake_at = math.inf
        self.closed = False

    # --- the registry -------------------------------------------------------------------------

    def add(self, hold: Hold) -> None:
        # the thread must look at the hold by its deadline (it reports it lost there), and a
        # renewed one's a quarter lease earlier (``_renew_at``): the thread's next wait ends
        # within ``TICK``, so a hold of a lease longer than that seldom needs it woken
        due = hold.due() - hold.lease_ms / 4000.0
        with self.mutex:
            self.holds[(hold.key, hold.owner)] = hold
            self._ensure_locked(due)  # it keeps every hold's deadline, fixed leases' too
            opening = not self._renewal_open
            self._renewal_open = True
        if opening:  # once per watchdog connection, not per hold: off the caller's path
            self.renewals.submit(self._open_renewal)

    def drop(self, hold: Hold) -> bool:
        """Forget ``hold``; return True when no hold is left."""
        with self.mutex:
            if self.holds.get((hold.key, hold.owner)) is hold:
                del self.holds[(hold.key, hold.owner)]
            return not self.holds

    def watch(self, hold: Hold) -> None:
        """Turn an existing hold over to the watchdog (a re-entry asked for lease=None)."""
        with self.mutex:
            hold.watchdog = True
            self._ensure_locked()

    def abandon(self, hold: Hold) -> None:
        """The only object that could release ``hold`` was garbage collected: give the hold
        back (a watchdog hold) or forget it (a leased one ends by itself). Runs wherever the
        collector runs, so it takes no lock: the watchdog thread does the round trip."""
        if hold.watchdog and hold.end is not None:
            self._abandoned.append(hold)
            self._kick.set()
        elif self.holds.get((hold.key, hold.owner)) is hold:
            # one atomic dict operation; every reader of ``holds`` iterates a snapshot
            self.holds.pop((hold.key, hold.owner), None)

    def registered(self, hold: Hold) -> bool:
        """True while ``hold`` is still registered (not released meanwhile)."""
        with self.mutex:
            return self.holds.get((hold.key, hold.owner)) is hold

    def defer(self, task: Callable[[], object]) -> None:
        """Run ``task`` soon in the watchdog thread, not in the caller's. Tasks must catch their
        own Redis errors; what is left undone when the session closes expires with its key."""
        with self.mutex:
            self._deferred.append(task)
            self._ensure_locked()

    def defer_at(self, when: float, task: Callable[[], object], slack: float = 0.0) -> None:
        """Run ``task`` in the watchdog thread at ``when`` (time.monotonic()), or soon after:
        by ``when + slack`` at the latest. The thread is woken only when ``task`` is due before
        everything it already waits for, and it would not wake by then anyway."""
        with self.mutex:
            self._timed_seq += 1
            first = not self._timed or when < self._timed[0][0]
            heapq.heappush(self._timed, (when, self._timed_seq, task))
            if first:
                if when + slack < self._wake_at:
                    self._kick.set()
                self._ensure_locked(when + slack)

    def run_timed_now(self) -> None:
        """Run every task deferred (``defer``, not yet handed to the chores worker) or deferred
        to later (``defer_at``), now, in the caller's thread (interpreter exit: the next waiter
        is woken, and a woken event waiter's entry taken out, before the process goes)."""
        with self.mutex:
            tasks = list(self._deferred)
            self._deferred.clear()
            tasks += [task for _, _, task in sorted(self._timed, key=lambda t: t[:2])]
            self._timed.clear()
        for task in tasks:
            try:
                task()
            except Exception:  # noqa: BLE001 - exiting: what fails is covered by bounded sleeps
                log.debug("distlock: deferred task failed at exit", exc_info=True)

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _ensure_locked(self, due: float = -math.inf) -> None:
        """Start the thread, or wake it when it is sleeping out its idle time and would not
        wake by ``due`` (what it was asked to do is due then) by itself."""
        if self._idle and due < self._wake_at:
            self._kick.set()
        if self._thread is None and not self.closed:
            self._thread = threading.Thread(
                target=self._loop, name=f"distlock-watchdog-{self._tag}", daemon=True)
            self._thread.start()

    def ensure_running(self) -> None:
        """Start the thread if it is not running (it looks at the kept connections: ``_cool``)."""
        if self._thread is None:
            with self.mutex:
                self._ensure_locked()

    def _cool(self, force: bool) -> None:
        """The ``chores`` worker gives back the kept connections when due (``force``: all): the
        pool's lock and redis-py's re-authentication (I/O) are not for this thread. Never raises."""
        try:
            executor = self._executor()
            if executor.cool_due(force):
                self.chores.submit(functools.partial(executor.cool, force))
        except Exception:  # noqa: BLE001 - a retired session: its close gave them back
            pass

    def _idle_locked(self) -> bool:
        # a snapshot: ``abandon`` may drop a hold from any thread without the mutex
        return (not self._deferred and not self._abandoned and not self._timed
                and not self._round_busy and not self.chores.busy
                and not any(not h.lost for h in list(self.holds.values())))

    def _times(self) -> Tuple[Optional[float], Optional[float]]:
        """One pass over the holds: the earliest local deadline, cap or alarm of a hold still
        believed, and
        the earliest time a renewed hold's round falls due (one ``renew_interval`` before its
        deadline; see ``_renew_at``); None where there is no such hold."""
        every = settings().renew_interval
        deadline: Optional[float] = None
        renew_by: Optional[float] = None
        for h in list(self.holds.values()):
            if h.lost or h.releasing:  # a release in flight ends it: ``_expire_due`` skips it too
                continue
            due = h.due()
            if deadline is None or due < deadline:
                deadline = due
            if h.watchdog and (renew_by is None or h.expires_at - every < renew_by):
                renew_by = h.expires_at - every
        return deadline, renew_by

    def _renew_at(self, last_round: float, interval: float, renew_by: Optional[float]) -> float:
        """When the next renewal round is due: ``interval`` after the last one ended, or
        earlier, at ``renew_by`` (``_times``). A grant that arrives with little of its lease
        left (a Redlock grant that waited out a stopped master's reply bound is valid for its
        lease less that wait) is renewed in time, not at the regular round that may come after
        its deadline. Never sooner than a quarter interval after the last round, so a server
        that fails every renewal is not asked back to back."""
        if renew_by is None:
            return last_round + interval
        return min(last_round + interval, max(renew_by, last_round + settings().renew_interval / 4))

    # --- the thread ---------------------------------------------------------------------------

    def _loop(self) -> None:
        me = threading.current_thread()
        try:
            self._run()
        finally:
            # However the thread ends, the next hold starts a new one.
            with self.mutex:
                if self._thread is me:
                    self._thread = None
                    if not self.closed and not self._idle_locked():
                        self._ensure_locked()
                # The connection is the executor's, not this thread's: once a new thread has
                # started (a hold came meanwhile), it renews through it. Under the mutex, so
                # that none starts while it is being closed.
                if self._thread is None:
                    self._drop_renewer()
                    self._kick.close()  # the next thread makes its own
            if self._thread is None:
                self._cool(True)  # no thread to look at them any more: give them all back

    def _run(self) -> None:
        last_round = time.monotonic()
        retry_after: Optional[float] = None
        idle_since: Optional[float] = None
        while not self.closed:
            # Every step is inside the ``try``: nothing may stop the watchdog.
            try:
                ended, self._round_ended = self._round_ended, None
                if ended is not None:
                    last_round, retry_after = ended
                # Read the interval afresh each time: configure() may have shortened it (and
                # the lease with it) since the last round.
                interval = retry_after if retry_after is not None else settings().renew_interval
                deadline, renew_by = self._times()
                renew_at = self._renew_at(last_round, interval, renew_by)
                now = time.monotonic()
                with self.mutex:
                    if self._idle_locked():
                        idle_since = now if idle_since is None else idle_since
                        if now - idle_since >= IDLE_EXIT:
                            self._thread = None
                            return
                    else:
                        idle_since = None
                    self._idle = idle_since is not None
                # Look again every TICK (a release that dropped the last hold need not wake it:
                # that costs a thread switch), and at the earliest deadline, to end belief on time.
                # While a round is in flight, its end (a kick) is what the thread waits for, not
                # ``renew_at``, which has passed: waiting 0 s on it would spin until the end.
                if idle_since is not None:
                    wait = min(TICK, idle_since + IDLE_EXIT - now)
                elif self._round_busy:
                    wait = TICK
                elif self._confirm:
                    wait = 0.0  # a suspension asked for a round at once
                else:
                    wait = min(TICK, renew_at - now)
                timed = self._timed
                if timed:
                    wait = min(wait, timed[0][0] - now)
                if deadline is not None:
                    wait = min(wait, deadline - now)
                self._wake_at = now + max(0.0, wait)
                by_socket = self._kick.wait(max(0.0, wait), self._watched())
                self._wake_at = math.inf
                self._kick.clear()
                if self.closed:
                    return
                self._expire_due()
                self._hand_off_chores()
                self._cool(False)
                reset = bool(self.holds) and self._executor().renewal_reset(self._reset)
                self._quiet_sockets = by_socket and not reset
                if self._round_busy:
                    continue  # one round at a time; its end wakes the thread
                if self._round_ended is not None:
                    continue  # a round ended during the wait: the next is due from its end
                if not self._confirm and time.monotonic() < renew_at:
                    continue  # woken for a deadline, deferred work, or to check for idleness
                self._confirm = False
                self._round_busy = True
                self.renewals.submit(self._round)
            except BaseException:  # noqa: BLE001 - nothing may stop the watchdog
                log.exception("distlock: watchdog error; retrying")
                retry_after = min(1.0, settings().renew_interval)
                last_round = time.monotonic()
                time.sleep(min(TICK, retry_after))  # never a hot loop

    def _watched(self) -> List[Any]:
        """The idle sockets the thread's wait also ends on, while there are holds to suspend."""
        try:
            return [] if not self.holds or self._quiet_sockets else self._executor().renewal_sockets()
        except Exception:  # noqa: BLE001 - the thread still looks every TICK
            return []

    def look_for_reset(self, always: bool = False) -> None:
        """A belief check's look (``Hold.believed``; ``always``: before a script is sent, so a
        reset that came before a grant never suspends its hold): a closed idle connection
        suspends belief now. No I/O: a non-blocking peek, microseconds."""
        if self.closed or not (always or self.holds):
            return
        try:
            self._executor().renewal_reset(self._reset)
        except Exception:  # noqa: BLE001 - the thread looks again; a check never fails
            return

    def _reset(self) -> None:  # renewal_reset's ``then``
        self.suspend("the server closed the watchdog's connection")

    def _round(self) -> None:
        """One renewal round, on the ``renewals`` worker; its end wakes the watchdog thread."""
        result: Optional[float] = min(1.0, settings().renew_interval)
        with self.mutex:
            self._begin_io()
        try:
            result = self.renew_all()
        except BaseException:  # noqa: BLE001 - nothing may stop the renewals
            log.exception("distlock: renewal round failed; retrying")
        finally:
            self._round_ended = (time.monotonic(), result)
            self._round_busy = False
            self._kick.set()
            self._drop_if_stale()

    def _expire_due(self) -> None:
        """End belief in every hold whose local deadline or cap has passed (no I/O): ``on_lost``
        fires now, whatever renewal is in flight; a capped hold is then given back on the
        ``chores`` worker. Run the ``on_long_hold`` alarms that fell due."""
        now = time.monotonic()
        for hold in list(self.holds.values()):
            if hold.lost or hold.releasing:
                continue
            while hold.alarms and hold.alarms[0][0] <= now:
                try:
                    hold.alarms.pop(0)[1]()
                except Exception:  # noqa: BLE001 - a callback must not kill the watchdog
                    log.exception("distlock: on_long_hold callback failed")
            if now < hold.ends_at():
                continue
            hold.ran_out = True
            self._on_lost(hold, hold.end_cause(now))
            if now >= hold.cap_at:  # capped: Redis must not keep it for up to a lease more
                self.chores.submit(functools.partial(give_back_lost, self, [hold]))

    def _hand_off_chores(self) -> None:
        """Give the due clean-ups (deferred, timed, abandoned holds) to the ``chores`` worker."""
        if self._abandoned:
            abandoned = []
            while self._abandoned:
                abandoned.append(self._abandoned.popleft())
            self.chores.submit(lambda: self._give_back(abandoned, "a lock object was garbage collected "
                                                                  "while it"))
        now = time.monotonic()
        while True:
            try:
                task = self._deferred.popleft()
            except IndexError:
                with self.mutex:
                    if not self._timed or self._timed[0][0] > now:
                        return
                    task = heapq.heappop(self._timed)[2]
            self.chores.submit(task)

    def suspend(self, why: str) -> None:
        """The connection to this session's server was reset (``why``): stop believing every
        hold until a renewal round, started at once, confirms it or finds it gone."""
        suspended = 0
        now = time.monotonic()
        for hold in list(self.holds.values()):
            if not hold.lost and not hold.suspended:
                hold.unbelieved_at = now
                hold.suspended = True
                suspended += 1
        if suspended:
            log.info("distlock: %s; %d hold(s) not believed until a renewal confirms them",
                     why, suspended)
            with self.mutex:
                self._confirm = True
                self._ensure_locked()
            self._kick.set()

    def _give_back(self, holds: Iterable[Hold], why: str) -> None:
        for hold in holds:
            if hold.lost or not self.registered(hold):
                continue
            log.warning("distlock: %s held %s; giving it back", why, hold.key)
            try:
                hold.end(hold)  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001 - it then ends with its lease
                log.warning("distlock: could not give back %s: %r", hold.key, exc)
            self.drop(hold)

    def renew_all(self) -> Optional[float]:
        """One renewal round (``_session.renewal.renew_round``): None when all went through,
        else a short delay before the next try."""
        return renew_round(self)

    def _expire(self, holds: List[Hold], error: Any = None,
                cause: str = "its lease ran out unrenewed") -> None:
        """Report lost every hold of ``holds`` whose lease has run out unrenewed."""
        now = time.monotonic()
        for hold in holds:
            if now >= hold.expires_at:
                self._on_lost(hold, cause if error is None else f"{cause} ({error!r})")

    def close(self, join: bool) -> None:
        self.closed = True
        self._kick.set()
        thread = self._thread
        if join and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=3.0)
        self.renewals.close(join)
        self.chores.close(join)
        # joined, a renewals job still running waits on I/O: closing its connection ends the
        # wait; not joined (the reaper's), it may be opening it: it closes it as it ends
        with self.mutex:
            self._drop_renewer(under_io=join)
