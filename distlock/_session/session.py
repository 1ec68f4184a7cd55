"""One session per process per Redis server and user; its lifetime.

A session holds:

- its id (uuid4, random and unguessable: owner ids are built from it);
- its :class:`~distlock._redis.executor.Executor`, through which every command goes (``run``,
  ``read``, ``batch``);
- a :class:`~distlock._session.watchdog.Watchdog`: the registry of holds and the thread that renews
  them, in batches;
- a :class:`~distlock._redis.dispatcher.Dispatcher`: one pub/sub connection and one thread for every
  channel this process waits on.

Which session a client gets (``session_for``):

- A plain ``redis.Redis`` on redis-py's own pool gets the session of its server and user
  (host, port, db, credentials, reply decoding, timeouts), which talks through the pool of the
  first such client (``_redis.clients.session_client``). A web handler or a task that makes a client
  per request therefore shares one watchdog, one pub/sub connection and a few pooled
  connections with every other request, instead of leaving a session behind per client; and a
  thread that holds a DistRLock re-enters it through any client of that server, as it would
  through one.
- Any other client (Sentinel, Cluster, subclasses, single-connection clients, fakeredis) gets a
  session of its own, which talks through that very client without keeping it alive.

A session lives while a user holds a reference to one of its clients, or while it has a hold
(docs/design.rst, principle 11). After that it is retired: its threads stop, its connections close, and
the next primitive for that server starts a fresh one. Its threads exit by themselves when
they have had nothing to do for a few seconds, and start again on demand. After ``os.fork()``
the child drops every session it inherited and starts afresh: it owns nothing. At interpreter
exit, every hold still held is given back (``release_at_exit``).
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Set, Tuple, TypeVar

import redis

from .._core.flow import Flow, drive
from .._core.settings import settings
from .._core.shares import Runs
from .._redis import executor_for
from .._redis.clients import ClientArg, server_key, session_client, shareable
from .._redis.dispatcher import Dispatcher
from .._redis.pubsub import Waiter, wake_count, wake_idents
from .config import resolve_client
from .metrics import Meter
from .metrics import meter as make_meter
from .telemetry import lease_lost
from .watchdog import Hold, Watchdog

__all__ = ["Session", "SessionUser", "add_lost_callback", "fire_lost", "Hold", "Waiter", "session_for",
           "wake_count", "wake_idents", "all_sessions", "reset_sessions"]

log = logging.getLogger("distlock")

T = TypeVar("T")

#: How many tries of queued waiters one session has in flight at once.
WAITER_CONCURRENCY = 4


class Session:
    """What one process shares for one server: see the module's docstring.

    ``client`` is the client to talk through: the session's own, or a weak proxy of the
    user's (``user``, a weak reference to it). ``owns``: what the session does with the
    client's pool when it is retired: ``"pool"``, a pool of its own, closed whole;
    ``"idle"``, a user's pool it adopted, of which only the idle connections are closed (the
    user's own commands may be using the others); ``""``, nothing (the user's client).
    """

    def __init__(self, client: Any, *, owns: str, key: Any = None,
                 user: Optional[Callable[[], Any]] = None) -> None:
        self.client: Any = client
        self.owns = owns
        self.key = key
        self._user = user
        self.id = uuid.uuid4().hex
        self.info = f"{socket.gethostname()}:{os.getpid()}"
        self.pid = os.getpid()
        self.closed = False
        #: the interpreter exits (``release_all``): a nudge due later is sent at once
        self.exiting = False
        #: ids of the user clients alive that resolve to this session (see ``session_for``)
        self.users: Set[int] = set()
        self.executor = executor_for(client, None if user is None else user(), owns == "pool")
        #: Tries by queued waiters go through these slots, so that a crowd of waiters woken at
        #: once (subscription confirmed, pub/sub reconnected) cannot grow the connection pool
        #: to one connection per thread. First tries (the uncontended path) do not pay for it.
        self.retry_slots = threading.Semaphore(WAITER_CONCURRENCY)
        me = weakref.ref(self)

        def source() -> Any:
            session = me()
            if session is None:
                raise RuntimeError("distlock: the session was retired")
            return session.executor

        def lost(hold: Hold, cause: str) -> None:
            session = me()
            if session is not None:
                session.mark_lost(hold, cause)

        tag = self.id[:8]
        self.watchdog = Watchdog(source, tag, lost)
        # the connections the direct path keeps out of the pool go back as the watchdog looks
        self.executor.cool_with(self.watchdog.ensure_running)
        #: a ``Dispatcher`` (or, on a cluster, a ``ClusterDispatcher``: the same methods)
        self.dispatcher: Dispatcher = self.executor.dispatcher(source, tag)
        #: the registry of holds, keyed by (key, owner); shared with the watchdog
        self.holds = self.watchdog.holds
        #: the default locks' quanta (``_core.shares``): when this process last got each lock by
        #: waiting for it
        self.runs = Runs()

    # --- holds --------------------------------------------------------------------------------

    def add_hold(self, hold: Hold) -> None:
        if self._user is not None:
            hold.pin = self._user()  # the user's client lives as long as the hold
        self.watchdog.add(hold)

    def drop_hold(self, hold: Hold) -> None:
        granted_at, meter = hold.granted_at, hold.meter
        if granted_at and meter is not None:
            hold.granted_at = 0.0  # its hold time counts once
            meter.held(time.monotonic() - granted_at)
        if self.watchdog.drop(hold) and not self.users:
            _schedule_retire(self)

    def watch(self, hold: Hold) -> None:
        self.watchdog.watch(hold)

    def defer(self, task: Callable[[], object]) -> None:
        """Run ``task`` soon in the watchdog thread, not in the caller's: a clean-up round trip
        that the caller's result does not depend on."""
        self.watchdog.defer(task)

    def defer_at(self, when: float, task: Callable[[], object], slack: float = 0.0) -> None:
        """Run ``task`` in the watchdog thread at ``when`` (time.monotonic()), or soon after
        (by ``when + slack``: ``Watchdog.defer_at``)."""
        self.watchdog.defer_at(when, task, slack)

    def renew_all(self) -> Optional[float]:
        return self.watchdog.renew_all()

    def mark_lost(self, hold: Hold, cause: str = "a release found it gone or someone else's") -> None:
        """Record that ``hold`` is gone and tell everyone who registered ``on_lost``. Once.

        Logged at WARNING with ``lock_name``, ``token``, ``owner`` and ``cause`` as extra
        fields (a LogRecord's ``name`` is the logger's), counted in the metrics, and traced
        where the application traces (see ``_session.telemetry``)."""
        with self.watchdog.mutex:
            if hold.lost:
                return
            hold.lost = True
            hold.cause = cause
            hold.unbelieved_at = hold.unbelieved_at or time.monotonic()
        meter = hold.meter
        name = meter.name if meter is not None else hold.key
        log.warning("distlock: lease lost on %r (token %s, owner %s): %s", name, hold.token,
                    hold.owner, cause,
                    extra={"lock_name": name, "token": hold.token, "owner": hold.owner, "cause": cause})
        if meter is not None:
            meter.lost()
        lease_lost(meter, hold.token, cause)
        notify = hold.notify
        if notify is not None:
            for listener in list(hold.listeners):
                notify(listener)

    def ran_out(self, hold: Hold) -> bool:
        """True when ``hold`` is lost; a hold whose local deadline (or cap) has passed is
        reported lost here and now (as the watchdog thread does at the deadline), so that a release just
        after the deadline sees the loss whichever thread runs first."""
        now = time.monotonic()
        if not hold.lost and not hold.releasing and now >= hold.ends_at():
            hold.ran_out = True
            self.mark_lost(hold, hold.end_cause(now))
        return hold.lost

    def busy(self) -> bool:
        """True while holds or waiters need the session."""
        return bool(self.holds) or self.dispatcher.busy()

    def serves(self, client: Any) -> bool:
        """False for a session of a user's client that is gone, when ``client`` is a new one
        that happens to have the same ``id()``."""
        return self._user is None or self._user() is client

    # --- the ops of a flow (``_core.flow.Port``) -------------------------------------------------

    def run(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...],
            acks: Optional[Tuple[int, int]] = None) -> Any:
        """Script ``name``, a state change, sent once by the executor (``Executor.run``). A
        connection that failed suspends belief in this session's holds until a renewal
        confirms them (``Watchdog.suspend``)."""
        self.watchdog.look_for_reset(always=True)
        try:
            return self.executor.run(name, keys, args, acks)
        except redis.ConnectionError as exc:
            self.connection_failed(exc)
            raise

    def connection_failed(self, exc: BaseException) -> None:
        """A connection to this session's server failed (``exc``): suspend its holds."""
        self.watchdog.suspend(f"a connection to the server failed ({exc!r})")

    def read(self, *command: Any) -> Any:
        """One command that is safe to repeat (``Executor.read``)."""
        return self.executor.read(*command)

    # --- waiting ------------------------------------------------------------------------------

    def join(self, channel_name: str, bound: Optional[float], ident: Optional[str] = None) -> Waiter:
        return self.dispatcher.join(channel_name, bound, ident)

    def leave(self, waiter: Waiter, acquired: bool) -> bool:
        return self.dispatcher.leave(waiter, acquired)

    def sleep(self, waiter: Waiter, head_bound: float, limit: Optional[float] = None) -> bool:
        return self.dispatcher.sleep(waiter, head_bound, limit)

    def slot(self, enter: bool) -> None:
        """Take (``enter``) or give back one of ``retry_slots`` (the ``slot`` op of a flow)."""
        if enter:
            self.retry_slots.acquire()
        else:
            self.retry_slots.release()

    def pick(self, channel_name: str) -> Any:
        return self.dispatcher.pick(channel_name)

    def hand(self, waiter: Any, handed: Tuple[int, float]) -> bool:
        return self.dispatcher.hand(waiter, handed)

    def wake_all_waiters(self) -> None:
        self.dispatcher.wake_all()

    def subscribed_channels(self) -> List[str]:
        return self.dispatcher.subscribed()

    @property
    def pubsub_reconnects(self) -> int:
        return self.dispatcher.reconnects

    # --- the end ------------------------------------------------------------------------------

    def release_all(self) -> None:
        """Give back every hold still held (interpreter exit): other hosts need not wait out
        the lease of a process that is going away; and wake now the waiters this process was
        about to wake (``_core.shares``), those of the releases made here included: a release
        in a quantum wakes nobody and leaves that to a nudge, which the session, closed next,
        would never send. Errors are logged, never raised."""
        self.exiting = True
        for hold in list(self.holds.values()):
            if hold.lost or hold.end is None:
                continue
            try:
                hold.end(hold)
            except Exception as exc:  # noqa: BLE001 - exiting: what fails is left to its lease
                log.warning("distlock: could not release %s at exit: %r", hold.key, exc)
            self.watchdog.drop(hold)
        self.watchdog.run_timed_now()
        # and the clean-ups already handed to the chores worker (closing would drop them)
        self.watchdog.chores.flush(2.0)

    def close(self, join: bool = True) -> None:
        """Stop this session's threads (``join``: and wait for them) and close the connections
        it opened. Holds are not released: what is still held ends with its lease."""
        if join and not self.closed:
            # the clean-ups already handed to the chores worker (an event waiter's entry, a
            # barrier party's last look): closing would drop them, leaving them to expire
            self.watchdog.chores.flush(1.0)
        self.closed = True
        self.watchdog.close(join)
        self.dispatcher.close(join)
        self.executor.close()
        if self.owns:
            try:
                self.client.connection_pool.disconnect(inuse_connections=self.owns == "pool")
            except Exception:  # noqa: BLE001 - it is being thrown away
                pass


def add_lost_callback(callbacks: List[Callable[[Any], Any]], callback: Callable[[Any], Any]) -> None:
    """``on_lost``'s check and registration, for every primitive that has one."""
    if not callable(callback):
        raise TypeError(f"callback must be callable, not {type(callback).__name__}")
    callbacks.append(callback)


def fire_lost(subject: Any, callbacks: List[Callable[[Any], Any]]) -> None:
    """Run ``on_lost`` callbacks with ``subject`` (the primitive); what they raise is logged,
    never propagated (they run in the watchdog thread, among others)."""
    for callback in list(callbacks):
        try:
            callback(subject)
        except Exception:  # noqa: BLE001 - a callback must not kill the watchdog
            log.exception("distlock: on_lost callback %r failed", callback)


class SessionUser:
    """What every primitive has: its session, resolved from its ``client`` argument on first
    use and kept, and resolved again once that session is closed (after a fork, or a reset)."""

    _client_arg: ClientArg = None
    _client: Any = None
    _sess: Optional[Session] = None
    #: what the metrics call this primitive (see ``_session.metrics``), and its name
    _metric_kind = ""
    _name = ""
    _meter: Optional[Meter] = None

    def _metered(self) -> Meter:
        """This object's meter (made on first use; made again when ``configure()`` changed
        the grouping rule)."""
        meter = self._meter
        rule = settings().metric_group
        if meter is None or meter.rule is not rule:
            meter = self._meter = make_meter(self._metric_kind, self._name, rule)
        return meter

    def _drive(self, flow: Flow[T]) -> T:
        """Run one of this primitive's flows (see ``_core.flow``) on its session, blocking: the
        thread shell. The asyncio shell awaits the same flows instead."""
        return drive(flow, self._session())

    def _session(self) -> Session:
        session = self._sess
        if session is None or session.closed:
            client = self._client
            if client is None:
                client = self._client = resolve_client(self._client_arg)
            session = self._sess = session_for(client)
        return session

    def _peek_session(self) -> Optional[Session]:
        """This object's session if it has one, without creating it (for repr)."""
        session = self._sess
        return session if session is not None and not session.closed else None


# --- which session a client gets, and for how long ---------------------------------------------

_sessions: Dict[Any, Session] = {}
_sessions_lock = threading.Lock()


def session_for(client: Any) -> Session:
    """The session ``client`` talks through (made on first need; see the module's docstring)."""
    if shareable(client):
        key: Any = ("server", server_key(client))
    else:
        key = ("client", id(client))
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None or session.closed or not session.serves(client):
            if key[0] == "server":
                own, adopted = session_client(client)
                session = Session(own, owns="idle" if adopted else "pool", key=key)
            else:
                session = Session(weakref.proxy(client), owns="", key=key,
                                  user=weakref.ref(client))
            _sessions[key] = session
        if id(client) not in session.users:
            session.users.add(id(client))
            weakref.finalize(client, _client_gone, id(client), weakref.ref(session))
        return session


def _client_gone(client_id: int, ref: Callable[[], Optional[Session]]) -> None:
    """A user client was garbage collected: retire its session if nothing else needs it.

    This runs wherever the garbage collector happens to run, perhaps inside one of distlock's
    own critical sections: it takes no lock and only schedules the work (``_schedule_retire``).
    """
    session = ref()
    if session is not None:
        session.users.discard(client_id)
        if not session.users:
            _schedule_retire(session)


#: Sessions that may have lost their last user, and whether a reaper thread is on its way.
_pending: Deque[Session] = collections.deque()
_reaping = [False]

#: How long a session without users lingers before it is retired: a client made per request
#: finds the previous request's session still there, with its connections.
RETIRE_AFTER = 1.0


def _schedule_retire(session: Session) -> None:
    """Retire ``session`` ``RETIRE_AFTER`` seconds from now if nothing needs it by then, in a
    short-lived reaper thread (lock-free here: see ``_client_gone``)."""
    _pending.append(session)
    if not _reaping[0]:
        _reaping[0] = True
        try:
            threading.Thread(target=_reap, name="distlock-reaper", daemon=True).start()
        except RuntimeError:  # interpreter shutting down: atexit closes what is left
            _reaping[0] = False


def _reap() -> None:
    while True:
        time.sleep(RETIRE_AFTER)
        later = []
        while _pending:
            session = _pending.popleft()
            if _retire_if_idle(session):
                later.append(session)
        _pending.extend(later)
        _reaping[0] = False
        if not _pending:
            return
        _reaping[0] = True  # scheduled meanwhile, and saw a reaper still on its way


def _retire_if_idle(session: Session) -> bool:
    """Retire ``session`` unless a user client or a hold or waiter still needs it; a session
    with holds is retired after its last hold is dropped. True: look again later (only a
    waiter kept it)."""
    with _sessions_lock:
        if session.users or session.holds:
            return False
        if session.busy():
            return True
        if _sessions.get(session.key) is session:
            del _sessions[session.key]
        # else a new session took its place (a new client with the old one's id()): this one
        # is retired all the same
    session.close(join=False)
    return False


def all_sessions() -> Iterable[Session]:
    return list(_sessions.values())


def reset_sessions() -> None:
    """Close and forget every session (tests use it between servers)."""
    with _sessions_lock:
        sessions = list(_sessions.values())
        _sessions.clear()
    for session in sessions:
        session.close()


def release_at_exit() -> None:
    """At interpreter exit: give back every hold still held, then stop every session."""
    for session in all_sessions():
        if session.pid == os.getpid():
            session.release_all()
    reset_sessions()


atexit.register(release_at_exit)


def _before_fork() -> None:
    _sessions_lock.acquire()


def _after_fork_in_parent() -> None:
    _sessions_lock.release()


def _after_fork_in_child() -> None:
    global _sessions_lock
    # The parent's threads do not exist here, and its holds are not ours: start afresh.
    for session in _sessions.values():
        session.closed = True
        session.watchdog.closed = True
        session.dispatcher.closed = True
        lender = getattr(session.dispatcher, "_lender", None)
        if lender is not None:
            lender.gone()  # the bell's sockets: this process' copies (the parent's stay open)
    _sessions.clear()
    _sessions_lock = threading.Lock()
    # Nor is the parent's reaper here: a session this process retires needs a reaper of its
    # own, which a flag copied while the parent's was on its way would never start.
    _pending.clear()
    _reaping[0] = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
