"""One session per process per Redis client.

A session holds:

- its id (uuid4, random and unguessable: owner ids are built from it);
- the registered scripts;
- one pub/sub connection, read by one dispatcher thread, for every channel this process waits
  on (subscriptions reference-counted, dropped a little after their last waiter leaves);
- one watchdog thread that renews every watchdog hold of the session, in batches;
- the registry of holds, which the watchdog walks and the locks share.

Threads are started on first need. After ``os.fork()`` the child drops every session it
inherited and starts afresh: it owns nothing.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Set, Tuple

import redis

from ._clients import bounded, direct_executor, renewer
from ._config import settings
from ._scripts import script_names, script_source

__all__ = ["Session", "Hold", "Waiter", "session_for"]

log = logging.getLogger("distlock")


class Hold:
    """What this process knows of one hold it was granted.

    ``count`` mirrors the reentrancy count kept in Redis; ``token`` is the fencing token of the
    grant. ``lost`` is set once the hold is found gone or someone else's; after that ``release``
    raises LockLostError and the watchdog leaves it alone.
    """

    __slots__ = (
        "session", "key", "owner", "token", "count", "watchdog", "lease_ms", "expires_at",
        "lost", "listeners", "renew", "releasing", "__weakref__",
    )

    def __init__(self, session: Session, key: str, owner: str, token: int, count: int,
                 watchdog: bool, lease_ms: int, sent_at: float,
                 renew: Callable[[Any, Hold, int], Any]) -> None:
        self.session = session
        self.key = key
        self.owner = owner
        self.token = token
        self.count = count
        self.watchdog = watchdog
        self.lease_ms = lease_ms
        #: monotonic time by which the lease runs out unless renewed (counted from the moment the
        #: grant was *sent*, so it is never later than the server's own deadline)
        self.expires_at = sent_at + lease_ms / 1000.0
        self.lost = False
        #: set while a release of this hold is in flight: a renewal that finds the hold gone
        #: then raced the release, and says nothing about a lost lease
        self.releasing = False
        self.listeners: weakref.WeakSet[Any] = weakref.WeakSet()
        #: renew(pipeline, hold, lease_ms): queue one renewal of this hold on ``pipeline``; the
        #: primitive that made the hold knows its script and keys.
        self.renew = renew


class Waiter:
    """One thread waiting on one channel of this process.

    ``ident`` (optional) names this waiter to hints that wake chosen waiters only: a payload
    ``=id1,id2`` wakes exactly the local waiters of that channel whose ident is listed, and
    sets their ``named`` (it stays set: the primitive that published it may treat it as news).
    """

    __slots__ = ("event", "channel", "ident", "named", "hinted")

    def __init__(self, channel: _Channel, ident: Optional[str] = None) -> None:
        self.event = threading.Event()
        self.channel = channel
        self.ident = ident
        self.named = False
        #: a hint (or a hand-over) asked this waiter to try again; set only under _mutex
        self.hinted = False


class _Channel:
    __slots__ = ("name", "refs", "pending", "confirmed", "waiters", "idle_since", "was_up")

    def __init__(self, name: str) -> None:
        self.name = name
        self.refs = 0
        self.pending = 0  # SUBSCRIBE commands sent whose confirmation has not arrived yet
        self.confirmed = threading.Event()
        self.waiters: Deque[Waiter] = collections.deque()
        self.idle_since = 0.0
        self.was_up = False  # subscribed on a connection that broke: wake its waiters when back


#: A renewal's reply meaning "this hold ended, and nothing was lost": the watchdog forgets it
#: quietly (1 means renewed; anything else, lost). A semaphore permit that another process
#: released on its owner's behalf ends so.
RENEW_ENDED = 2

#: How many times ``Session.run`` loads a script again after NOSCRIPT before it gives up.
_NOSCRIPT_TRIES = 3

#: How many tries of queued waiters one session has in flight at once.
WAITER_CONCURRENCY = 4

#: How many scripts one session has in flight at once (its connections stay at most this many,
#: plus the pub/sub and watchdog ones).
SCRIPT_CONCURRENCY = 4

#: How long a channel stays subscribed after its last waiter left: a lock contended again soon
#: does not pay SUBSCRIBE/UNSUBSCRIBE each time.
UNSUBSCRIBE_AFTER = 5.0


class Session:
    def __init__(self, client: redis.Redis) -> None:
        #: the client this session is for (its identity in ``session_for``)
        self.given = client
        #: the client it talks through: the same, or a twin with a socket timeout when the given
        #: one has none (see ``_clients.bounded``), so no command can wait forever
        client = bounded(client)
        self.client: Any = client
        self._renewer: Any = None  # (renew interval, twin) of the watchdog, made on first renewal
        self.id = uuid.uuid4().hex
        self.info = f"{socket.gethostname()}:{os.getpid()}"
        self.pid = os.getpid()
        self.scripts = {name: client.register_script(script_source(name)) for name in script_names()}
        self._execute: Callable[..., Any] = direct_executor(client)
        self._mutex = threading.Lock()
        #: Tries by queued waiters go through these slots, so that a crowd of waiters woken at
        #: once (subscription confirmed, pub/sub reconnected) cannot grow the connection pool
        #: to one connection per thread. First tries (the uncontended path) do not pay for it.
        self.retry_slots = threading.Semaphore(WAITER_CONCURRENCY)
        #: Free run slots (see ``run``): a list used as a GIL-atomic token pool, with a
        #: condition only for the rare caller that finds it empty.
        self._gate: List[None] = [None] * SCRIPT_CONCURRENCY
        self._gate_cond = threading.Condition(threading.Lock())
        self._gate_waiting = 0
        # pub/sub
        #: Serializes SUBSCRIBE/UNSUBSCRIBE: redis-py's PubSub is not thread-safe, and two
        #: threads' first subscribes would each open a connection, one of them orphaned with its
        #: channels (their wake-ups lost, waiters left to their polling bound).
        self._pubsub_io = threading.Lock()
        self._channels: Dict[str, _Channel] = {}
        self._pubsub: Any = None
        self._dispatcher: Optional[threading.Thread] = None
        self._pubsub_up = threading.Event()
        self.pubsub_reconnects = 0
        # watchdog
        self.holds: Dict[Tuple[str, str], Hold] = {}
        self._watchdog: Optional[threading.Thread] = None
        self._watchdog_kick = threading.Event()
        #: clean-up round trips that must not delay the caller (see ``defer``), run by the
        #: watchdog thread between renewals
        self._deferred: Deque[Callable[[], object]] = collections.deque()
        self._closed = False

    def run(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...]) -> Any:
        """Run script ``name`` as one EVALSHA; on NOSCRIPT (server restarted or SCRIPT FLUSH)
        load it and run it again.

        The hot path calls the client's ``execute_command`` directly: redis-py's Script wrapper
        costs a measurable share of an uncontended acquire. At most ``SCRIPT_CONCURRENCY`` runs
        of one session are in flight at once, so a hundred threads arriving together do not
        open a hundred connections.
        """
        script = self.scripts[name]
        gate = self._gate
        try:
            gate.pop()  # atomic under the GIL: the uncontended path never blocks here
        except IndexError:
            self._gate_wait()
        try:
            for _ in range(_NOSCRIPT_TRIES):
                try:
                    return self._execute("EVALSHA", script.sha, len(keys), *keys, *args)
                except redis.exceptions.NoScriptError:
                    # Another SCRIPT FLUSH may land between the load and the run: try again.
                    script.sha = self.client.script_load(script.script)
            return self._execute("EVALSHA", script.sha, len(keys), *keys, *args)
        finally:
            gate.append(None)
            if self._gate_waiting:
                with self._gate_cond:
                    self._gate_cond.notify()

    def _gate_wait(self) -> None:
        """Block until a run slot is free (all ``SCRIPT_CONCURRENCY`` are in flight).

        A returning run appends its slot before it reads ``_gate_waiting``, and a waiter counts
        itself before it tries to take a slot, so no wake-up is lost between the two; the short
        wait bound is only a second line of defence."""
        with self._gate_cond:
            self._gate_waiting += 1
            try:
                while True:
                    try:
                        self._gate.pop()
                        return
                    except IndexError:
                        self._gate_cond.wait(0.05)
            finally:
                self._gate_waiting -= 1

    # --- holds ------------------------------------------------------------------------------

    def add_hold(self, hold: Hold) -> None:
        with self._mutex:
            self.holds[(hold.key, hold.owner)] = hold
        if hold.watchdog:
            self._ensure_watchdog()

    def drop_hold(self, hold: Hold) -> None:
        with self._mutex:
            if self.holds.get((hold.key, hold.owner)) is hold:
                del self.holds[(hold.key, hold.owner)]

    def watch(self, hold: Hold) -> None:
        """Turn an existing hold over to the watchdog (a re-entry asked for lease=None)."""
        hold.watchdog = True
        self._ensure_watchdog()

    def mark_lost(self, hold: Hold) -> None:
        """Record that ``hold`` is gone and tell everyone who registered ``on_lost``. Once."""
        with self._mutex:
            if hold.lost:
                return
            hold.lost = True
        log.warning("distlock: lease lost on %s (owner %s, token %s)", hold.key, hold.owner, hold.token)
        for lock in list(hold.listeners):
            lock._fire_lost()

    def _ensure_watchdog(self) -> None:
        if self._watchdog is not None:
            return
        with self._mutex:
            if self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watchdog_loop, name=f"distlock-watchdog-{self.id[:8]}", daemon=True)
                self._watchdog.start()

    def defer(self, task: Callable[[], object]) -> None:
        """Run ``task`` soon in the watchdog thread, not in the caller's: a clean-up round trip
        that the caller's result does not depend on (an event waiter taking its entry out after
        the hint already told it the answer). Tasks must catch their own Redis errors; what is
        left undone when the session closes expires with its key."""
        self._deferred.append(task)
        self._ensure_watchdog()
        self._watchdog_kick.set()

    def _run_deferred(self) -> None:
        while True:
            try:
                task = self._deferred.popleft()
            except IndexError:
                return
            try:
                task()
            except Exception:  # noqa: BLE001 - a clean-up must not kill the watchdog
                log.debug("distlock: deferred clean-up failed", exc_info=True)

    def _watchdog_loop(self) -> None:
        renew_at = time.monotonic() + settings().renew_interval
        while not self._closed:
            self._watchdog_kick.wait(max(0.0, renew_at - time.monotonic()))
            self._watchdog_kick.clear()
            if self._closed:
                return
            self._run_deferred()
            if time.monotonic() < renew_at:
                continue  # woken for deferred work only
            retry_after = self.renew_all()
            renew_at = time.monotonic() + (
                retry_after if retry_after is not None else settings().renew_interval)

    def renew_all(self) -> Optional[float]:
        """Renew every live watchdog hold in one pipelined round trip.

        Return None when all went through, or a short delay before the next try after a
        connection error. A hold that cannot be renewed before its lease runs out is marked
        lost: a renewal that fails is never silent.
        """
        with self._mutex:
            holds = [h for h in self.holds.values() if h.watchdog and not h.lost]
        if not holds:
            return None
        lease_ms = max(1, int(settings().lease * 1000))
        sent_at = time.monotonic()
        try:
            pipe = self._renewal_client().pipeline(transaction=False)
            for hold in holds:
                hold.renew(pipe, hold, lease_ms)
            replies = pipe.execute(raise_on_error=False)
        except redis.RedisError as exc:
            log.warning("distlock: watchdog could not renew %d hold(s): %r", len(holds), exc)
            now = time.monotonic()
            for hold in holds:
                if now >= hold.expires_at:
                    self.mark_lost(hold)
            return min(1.0, settings().renew_interval)
        failed = False
        for hold, reply in zip(holds, replies):
            if isinstance(reply, Exception):
                log.warning("distlock: watchdog renewal of %s failed: %r", hold.key, reply)
                failed = True
                if time.monotonic() >= hold.expires_at:
                    self.mark_lost(hold)
            elif reply == 1:
                hold.lease_ms = lease_ms
                hold.expires_at = sent_at + lease_ms / 1000.0
            elif reply == RENEW_ENDED:
                self.drop_hold(hold)  # ended without a loss (a permit released on our behalf)
            elif not hold.releasing and self._registered(hold):
                self.mark_lost(hold)
        return min(1.0, settings().renew_interval) if failed else None

    def _registered(self, hold: Hold) -> bool:
        """True while ``hold`` is still this session's (not released meanwhile)."""
        with self._mutex:
            return self.holds.get((hold.key, hold.owner)) is hold

    # --- waiting ----------------------------------------------------------------------------

    def join(self, channel_name: str, bound: Optional[float], ident: Optional[str] = None) -> Waiter:
        """Subscribe to ``channel_name`` (if this process is not yet) and queue a waiter on it.

        Wait for the server's confirmation of the subscription at most ``bound`` seconds, so a
        release that happens after the caller's next try is never missed in normal operation.
        """
        self._ensure_dispatcher()
        with self._mutex:
            chan = self._channels.get(channel_name)
            if chan is None:
                chan = self._channels[channel_name] = _Channel(channel_name)
            chan.refs += 1
            waiter = Waiter(chan, ident)
            chan.waiters.append(waiter)
            send = chan.pending == 0 and not chan.confirmed.is_set() and self._pubsub is not None
            if send:
                chan.pending += 1
        if send:
            try:
                with self._pubsub_io:
                    self._pubsub.subscribe(channel_name)
            except redis.RedisError as exc:  # the dispatcher reconnects and subscribes again
                log.debug("distlock: subscribe to %s failed: %r", channel_name, exc)
        if bound is None or bound > 0:
            chan.confirmed.wait(settings().wait_cap if bound is None else min(bound, settings().wait_cap))
        return waiter

    def leave(self, waiter: Waiter, acquired: bool) -> bool:
        """Take ``waiter`` off its queue; return True when it was the last one on its channel.

        A waiter that leaves without the lock hands its place at the head (and with it the
        short polling bound) to the next one."""
        chan = waiter.channel
        with self._mutex:
            was_head = bool(chan.waiters) and chan.waiters[0] is waiter
            try:
                chan.waiters.remove(waiter)
            except ValueError:
                pass
            if was_head and not acquired:
                self._wake(chan, 1)
            elif was_head and chan.waiters:
                # Promote the new head without a try: it goes back to sleep with the head's
                # short bound instead of the long one it fell asleep with (see sleep()).
                chan.waiters[0].event.set()
            chan.refs -= 1
            if chan.refs == 0:
                chan.idle_since = time.monotonic()
            return not chan.waiters

    def sleep(self, waiter: Waiter, head_bound: float, limit: Optional[float] = None) -> bool:
        """Sleep until woken by a hint, or at most the bound: ``head_bound`` for the head of
        this process' queue, ``head_bound * queue_cap_factor`` for the others, who are handed
        the head's place in order: a head that leaves without the lock hands a wake-up on, and
        one that leaves with it promotes the next, which then sleeps out the head's bound.
        ``limit`` (e.g. the caller's time left) caps either bound. Return True when a hint
        (not the bound) ended the sleep."""
        chan = waiter.channel
        started = time.monotonic()
        while not waiter.hinted:
            bound = head_bound
            if not (chan.waiters and chan.waiters[0] is waiter):
                bound = head_bound * settings().queue_cap_factor
            if limit is not None:
                bound = min(bound, limit)
            left = bound - (time.monotonic() - started)
            if left <= 0:
                break
            waiter.event.wait(left)
            waiter.event.clear()  # a promotion (the head left) only re-reads the bound
        with self._mutex:
            hinted = waiter.hinted
            waiter.hinted = False
        waiter.event.clear()
        return hinted

    def _wake(self, chan: _Channel, n: Optional[int]) -> None:
        """Wake the ``n`` oldest waiters not woken yet (all when ``n`` is None). Holds _mutex."""
        for waiter in chan.waiters:
            if n is not None and n <= 0:
                break
            if not waiter.hinted:
                waiter.hinted = True
                waiter.event.set()
                if n is not None:
                    n -= 1

    def _ensure_dispatcher(self) -> None:
        if self._dispatcher is not None:
            return
        with self._mutex:
            if self._dispatcher is None:
                self._connect_pubsub_locked()
                self._dispatcher = threading.Thread(
                    target=self._dispatch_loop, name=f"distlock-pubsub-{self.id[:8]}", daemon=True)
                self._dispatcher.start()

    def _connect_pubsub_locked(self) -> None:
        self._pubsub = self.client.pubsub()
        for chan in self._channels.values():
            chan.was_up = chan.was_up or chan.confirmed.is_set()
            chan.confirmed.clear()
            chan.pending = 0

    def _dispatch_loop(self) -> None:
        backoff = 0.05
        while not self._closed:
            pubsub = self._pubsub
            try:
                self._resubscribe_if_needed(pubsub)
                message = pubsub.get_message(timeout=1.0)
                backoff = 0.05
            except Exception as exc:  # noqa: BLE001 - this thread must outlive any failure
                self._on_pubsub_broken(exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            if message is not None:
                self._handle(message)
            self._unsubscribe_idle(pubsub)

    def _resubscribe_if_needed(self, pubsub: Any) -> None:
        with self._mutex:
            names = [c.name for c in self._channels.values()
                     if c.refs > 0 and c.pending == 0 and not c.confirmed.is_set()]
            for name in names:
                self._channels[name].pending += 1
        if names:
            with self._pubsub_io:
                pubsub.subscribe(*names)

    def _handle(self, message: Dict[str, Any]) -> None:
        kind = message.get("type")
        channel = message.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode("utf-8", "surrogateescape")
        with self._mutex:
            chan = self._channels.get(channel) if channel is not None else None
            if chan is None:
                return
            if kind == "subscribe":
                # A confirmation for a channel that was subscribed before is a re-subscription
                # (ours, or redis-py's own after it reconnected inside get_message): hints sent
                # while the connection was down are lost, so every waiter tries again now.
                again = chan.was_up or chan.confirmed.is_set()
                chan.pending = max(0, chan.pending - 1)
                if chan.pending == 0:
                    chan.confirmed.set()
                if again:
                    chan.was_up = False
                    self._wake(chan, None)
            elif kind == "message":
                data = message.get("data")
                if isinstance(data, bytes):
                    data = data.decode("ascii", "replace")
                idents = wake_idents(data)
                if idents is not None:
                    for waiter in chan.waiters:
                        if waiter.ident is not None and waiter.ident in idents:
                            waiter.named = True
                            waiter.hinted = True
                            waiter.event.set()
                else:
                    self._wake(chan, wake_count(data))

    def _unsubscribe_idle(self, pubsub: Any) -> None:
        now = time.monotonic()
        with self._mutex:
            idle = [c for c in self._channels.values()
                    if c.refs == 0 and c.pending == 0 and now - c.idle_since > UNSUBSCRIBE_AFTER]
            for chan in idle:
                del self._channels[chan.name]
        if idle and any(c.confirmed.is_set() for c in idle):
            with self._pubsub_io:
                pubsub.unsubscribe(*[c.name for c in idle if c.confirmed.is_set()])

    def _on_pubsub_broken(self, exc: BaseException) -> None:
        """The pub/sub connection failed: start over on a fresh connection, which subscribes
        again. Waiters are woken when the server confirms that re-subscription (see
        ``_handle``), not now: a try now would most likely meet the same broken server and
        raise ConnectionError; meanwhile each sleeps no longer than its bound."""
        log.warning("distlock: pub/sub connection lost (%r); reconnecting", exc)
        with self._mutex:
            old = self._pubsub
            self._connect_pubsub_locked()
            self.pubsub_reconnects += 1
        try:
            old.close()
        except Exception:  # noqa: BLE001 - the connection is already broken
            pass

    def wake_all_waiters(self) -> None:
        with self._mutex:
            for chan in self._channels.values():
                self._wake(chan, None)

    def subscribed_channels(self) -> List[str]:
        with self._mutex:
            return [c.name for c in self._channels.values() if c.confirmed.is_set()]

    def close(self) -> None:
        """Stop this session's threads (tests and interpreter exit; holds are not released)."""
        self._closed = True
        self._watchdog_kick.set()
        pubsub = self._pubsub
        for thread in (self._dispatcher, self._watchdog):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=3.0)
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001
                pass
        own = [self._renewer[1]] if self._renewer is not None else []
        if self.client is not self.given:
            own.append(self.client)
        for twin in own:
            try:
                twin.connection_pool.disconnect()
            except Exception:  # noqa: BLE001
                pass

    def _renewal_client(self) -> Any:
        """The watchdog's own connection (see ``_clients.renewer``): not from the user's pool,
        and bounded by the renew interval. Remade when configure() changed that interval."""
        interval = settings().renew_interval
        current = self._renewer
        if current is not None and current[0] == interval:
            return current[1]
        twin = renewer(self.client, interval)
        if twin is None:
            return self.client
        self._renewer = (interval, twin)
        if current is not None:
            try:
                current[1].connection_pool.disconnect()
            except Exception:  # noqa: BLE001
                pass
        return twin


def wake_idents(data: Any) -> Optional[Set[str]]:
    """The idents a ``=id1,id2`` hint wakes (each exactly, wherever it is in the queue), or
    None when the hint is a count (``1``, ``3``, ``*``) instead."""
    if isinstance(data, str) and data.startswith("="):
        return set(data[1:].split(","))
    return None


def wake_count(data: Any) -> Optional[int]:
    """How many local waiters one hint wakes: an integer, or ``*`` for all of them."""
    if data == "*":
        return None
    try:
        return max(1, int(data))
    except (TypeError, ValueError):
        return 1


# --- one session per process per client ------------------------------------------------------

_sessions: Dict[int, Session] = {}
_sessions_lock = threading.Lock()


def session_for(client: redis.Redis) -> Session:
    session = _sessions.get(id(client))
    if session is not None and session.given is client:
        return session
    with _sessions_lock:
        session = _sessions.get(id(client))
        if session is None or session.given is not client:
            session = _sessions[id(client)] = Session(client)
        return session


def all_sessions() -> Iterable[Session]:
    return list(_sessions.values())


def reset_sessions() -> None:
    """Close and forget every session (tests use it between servers)."""
    with _sessions_lock:
        sessions = list(_sessions.values())
        _sessions.clear()
    for session in sessions:
        session.close()


def _before_fork() -> None:
    _sessions_lock.acquire()


def _after_fork_in_parent() -> None:
    _sessions_lock.release()


def _after_fork_in_child() -> None:
    global _sessions_lock
    # The parent's threads do not exist here, and its holds are not ours: start afresh.
    for session in _sessions.values():
        session._closed = True
    _sessions.clear()
    _sessions_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
