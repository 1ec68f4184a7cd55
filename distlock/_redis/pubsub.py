"""The books of a session's pub/sub, without I/O (``Board``): its channels and their waiters,
for the dispatcher of threads (``_redis.dispatcher``) and that of an event loop
(``_redis.apubsub``).

Waiters join a channel (subscribing it if this process is not subscribed yet), sleep until a
hint or their bound, and leave. Subscriptions are reference-counted and dropped
``UNSUBSCRIBE_AFTER`` seconds after their last waiter left.

A channel given up stays on the board, ``leaving``, until the server confirms its UNSUBSCRIBE;
no SUBSCRIBE is sent for it meanwhile (one that overtook the UNSUBSCRIBE would be undone by it,
the dispatcher believing the channel subscribed), and if waiters joined it, the reader
subscribes it again once the confirmation came.

Hints are only hints (docs/design.rst, principle 1): a lost message or a dropped connection costs a
waiter at most its bound.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from .._core.replies import handoff, wake_count, wake_idents, yield_turns
from .._core.settings import settings

__all__ = ["Board", "Channel", "Waiter", "wake_count", "wake_idents", "TICK", "UNSUBSCRIBE_AFTER"]

log = logging.getLogger("distlock")

#: How long a channel stays subscribed after its last waiter left: a lock contended again at
#: once does not pay SUBSCRIBE/UNSUBSCRIBE each time. Once no channel is left, the dispatcher
#: exits. Short, so that the thread is gone within CPython's own test harness' bound (its
#: ``threading_cleanup`` waits 1 s for the threads a test started to end).
UNSUBSCRIBE_AFTER = 0.3

#: How long one read of the pub/sub connection blocks: the dispatcher's tick (unsubscribing idle
#: channels, noticing it has nothing left to do or that its session closed).
TICK = 0.1


class Waiter:
    """One thread waiting on one channel of this process.

    ``ident`` (optional) names this waiter to hints that wake chosen waiters only: a payload
    ``=id1,id2`` wakes exactly the local waiters of that channel whose ident is listed, and
    sets their ``named`` (it stays set: the primitive that published it may treat it as news);
    ``+<ident> <payload>`` (a fair lock's hand-off) names exactly one and hands it ``payload``.
    """

    __slots__ = ("event", "channel", "ident", "named", "hinted", "payload", "taker", "handed")

    def __init__(self, channel: Channel, ident: Optional[str] = None,
                 event: Callable[[], Any] = threading.Event) -> None:
        #: a ``threading.Event`` (an ``asyncio.Event`` in the asyncio shell's dispatcher)
        self.event = event()
        self.channel = channel
        self.ident = ident
        self.named = False
        #: a hint (or a hand-over) asked this waiter to try again; set only under the mutex
        self.hinted = False
        #: what a hint that named this waiter alone carried (a fair lock's hand-off: the token
        #: and lease of the hold it was given; see ``_core.replies.handoff``)
        self.payload: Optional[str] = None
        #: a default lock's wait, which a release of this process may hand the lock to
        #: (``_primitives.lock_wait``), and what it was handed (``hand``: token, send time)
        self.taker: Any = None
        self.handed: Optional[Tuple[int, float]] = None


class Channel:
    __slots__ = ("name", "refs", "pending", "confirmed", "waiters", "idle_since", "was_up", "moved",
                 "turns", "leaving")

    def __init__(self, name: str, event: Callable[[], Any] = threading.Event) -> None:
        self.name = name
        self.refs = 0
        self.pending = 0  # SUBSCRIBE commands sent whose confirmation has not arrived yet
        self.confirmed = event()
        self.waiters: Deque[Waiter] = collections.deque()
        self.idle_since = 0.0
        self.was_up = False  # subscribed on a connection that broke: wake its waiters when back
        #: its slot moved to another node of a cluster (``_redis.pubsub_cluster``): not subscribed
        #: again here; its waiters move to the new owner
        self.moved = False
        #: how many processes took turns with a default lock at the last yield to this
        #: process (a 'y<n>' hint; 0: none yet): its next quantum is barge_limit / n (_shares)
        self.turns = 0
        #: UNSUBSCRIBE decided (``_drop_idle``), its confirmation not arrived yet: no SUBSCRIBE
        #: is sent until it has, so that the server never runs one before the other
        self.leaving = False


class Board:
    """The bookkeeping of one pub/sub connection's channels and waiters, without I/O: what a
    dispatcher for threads (``Dispatcher``) and one for an event loop
    (``_redis.apubsub.AsyncDispatcher``) share. ``event`` makes the waiters' and channels' events
    (``threading.Event`` or ``asyncio.Event``: both have ``set``, ``clear`` and ``is_set``).
    """

    event: Callable[[], Any] = threading.Event

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.channels: Dict[str, Channel] = {}
        self._pubsub: Any = None
        self.reconnects = 0
        self.closed = False

    def _enqueue(self, channel_name: str, ident: Optional[str]) -> tuple[Waiter, Any]:
        """Queue a new waiter on ``channel_name``; return it and the pub/sub connection to
        send SUBSCRIBE on (None: already subscribed, or on its way). Holds the mutex."""
        chan = self.channels.get(channel_name)
        if chan is None:
            chan = self.channels[channel_name] = Channel(channel_name, self.event)
        chan.refs += 1
        if chan.moved:  # joined here again: the slot map says this node owns it (again)
            chan.moved = False
        waiter = Waiter(chan, ident, self.event)
        chan.waiters.append(waiter)
        pubsub = self._pubsub
        # a channel leaving is subscribed again by the reader once its UNSUBSCRIBE is confirmed
        send = (chan.pending == 0 and not chan.confirmed.is_set() and not chan.leaving
                and pubsub is not None)
        if send:
            chan.pending += 1
        return waiter, pubsub if send else None

    def leave(self, waiter: Waiter, acquired: bool) -> bool:
        """Take ``waiter`` off its queue; return True when it was the last one on its channel.

        A waiter that leaves without the lock hands its place at the head (and with it the
        short polling bound) to the next one."""
        chan = waiter.channel
        with self.mutex:
            was_head = bool(chan.waiters) and chan.waiters[0] is waiter
            try:
                chan.waiters.remove(waiter)
            except ValueError:
                pass
            if not acquired and (was_head or waiter.taker is not None):
                _wake(chan, 1)  # (a taker: the next try replaces its hand-off record)
            elif was_head and chan.waiters:
                # Promote the new head without a try: it goes back to sleep with the head's
                # short bound instead of the long one it fell asleep with (see sleep()).
                chan.waiters[0].event.set()
            chan.refs -= 1
            if chan.refs == 0:
                chan.idle_since = time.monotonic()
            return not chan.waiters

    def pick(self, channel_name: str) -> Optional[Waiter]:
        """The first waiter on ``channel_name`` a release may hand its lock to (it has a
        ``taker``, nothing handed by any process yet), or None. No mutex on the usual path."""
        chan = self.channels.get(channel_name)
        if chan is None or not chan.waiters:
            return None
        with self.mutex:
            chan = self.channels.get(channel_name)
            if chan is not None:
                for waiter in chan.waiters:
                    if waiter.taker is not None and not (waiter.handed or waiter.payload):
                        return waiter
        return None

    def hand(self, waiter: Waiter, handed: Tuple[int, float]) -> bool:
        """Give ``waiter`` the lock a release of this process handed it, and wake it; False when
        it has left its queue (the releaser then gives the lock back). Under the mutex, as
        ``leave``: a waiter gets it before it leaves (and sees it as it leaves), or not at all."""
        with self.mutex:
            if waiter not in waiter.channel.waiters:
                return False
            waiter.handed = handed
            waiter.named = True
            waiter.hinted = True
            waiter.event.set()
            return True

    @staticmethod
    def _bound(waiter: Waiter, head_bound: float, limit: Optional[float]) -> float:
        """How long ``waiter`` sleeps now (see ``Dispatcher.sleep``)."""
        chan = waiter.channel
        bound = head_bound
        if not (chan.waiters and chan.waiters[0] is waiter):
            bound = head_bound * settings().queue_cap_factor
        return bound if limit is None else min(bound, limit)

    def _take_hint(self, waiter: Waiter) -> bool:
        """The end of a sleep: whether a hint ended it (and forget that hint)."""
        with self.mutex:
            hinted = waiter.hinted
            waiter.hinted = False
        waiter.event.clear()
        return hinted

    def busy(self) -> bool:
        """True while any waiter of this process waits on any channel."""
        with self.mutex:
            return any(chan.refs > 0 for chan in self.channels.values())

    def wake_all(self) -> None:
        with self.mutex:
            for chan in self.channels.values():
                _wake(chan, None)

    def subscribed(self) -> List[str]:
        with self.mutex:
            return [c.name for c in self.channels.values() if c.confirmed.is_set()]

    def _open(self) -> Any:
        """A new pub/sub connection (redis-py's PubSub, blocking or asyncio)."""
        raise NotImplementedError

    def _connect_locked(self) -> None:
        """Open a new pub/sub connection, on which every channel must be subscribed again
        (holds the mutex)."""
        self._pubsub = self._open()
        self._reset_channels()

    def _broken(self, exc: BaseException) -> Any:
        """The pub/sub connection failed: start over on a fresh one, which subscribes again;
        return the old one, to close. Waiters are woken when the server confirms that
        re-subscription (see ``_handle``), not now: a try now would most likely meet the same
        broken server and raise ConnectionError; meanwhile each sleeps no longer than its
        bound."""
        log.warning("distlock: pub/sub connection lost (%r); reconnecting", exc)
        with self.mutex:
            old = self._pubsub
            self._connect_locked()
            self.reconnects += 1
        return old

    def _reset_channels(self) -> None:
        """A new pub/sub connection: every channel must be subscribed again (holds the mutex)."""
        for chan in self.channels.values():
            chan.was_up = chan.was_up or chan.confirmed.is_set()
            chan.confirmed.clear()
            chan.pending = 0
            chan.leaving = False  # nothing is subscribed on a new connection

    @staticmethod
    def _unsubscribed(c: Channel) -> bool:
        """``c`` has waiters and is neither subscribed nor on its way (nor leaving: its
        UNSUBSCRIBE goes first): the reader must subscribe it again."""
        return (c.refs > 0 and c.pending == 0 and not c.confirmed.is_set() and not c.moved
                and not c.leaving)

    @staticmethod
    def _idle_past(c: Channel, now: float) -> bool:
        """``c`` has had no waiter, and nothing on its way, for UNSUBSCRIBE_AFTER."""
        return c.refs == 0 and c.pending == 0 and now - c.idle_since > UNSUBSCRIBE_AFTER

    def _to_resubscribe(self) -> List[str]:
        """The channels to subscribe again (``_unsubscribed``); counted as on their way from
        now."""
        with self.mutex:
            names = [c.name for c in self.channels.values() if self._unsubscribed(c)]
            for name in names:
                self.channels[name].pending += 1
        return names

    def _drop_idle(self) -> tuple[List[str], bool]:
        """Give up channels idle for UNSUBSCRIBE_AFTER; return those subscribed, to UNSUBSCRIBE,
        and whether none is left (the reader should then exit: it has given up its place, and
        must close its connection, which unsubscribes everything).

        A subscribed channel stays on the board, ``leaving``, until the server confirms the
        UNSUBSCRIBE (``_handle``); one that is not subscribed is forgotten now."""
        now = time.monotonic()
        with self.mutex:
            idle = [c for c in self.channels.values()
                    if (c.leaving and c.refs == 0 and c.pending == 0) or self._idle_past(c, now)]
            if len(idle) == len(self.channels):
                self.channels.clear()
                self._reader_gone()
                self._pubsub = None
                return [], True
            names = []
            for chan in idle:
                if chan.confirmed.is_set():
                    chan.confirmed.clear()
                    chan.leaving = True
                    names.append(chan.name)
                elif not chan.leaving:
                    del self.channels[chan.name]
        return names, False

    def _reader_gone(self) -> None:
        """The reader exits idle (holds the mutex)."""

    def _handle(self, message: Dict[str, Any]) -> None:
        kind = message.get("type")
        channel = message.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode("utf-8", "surrogateescape")
        with self.mutex:
            chan = self.channels.get(channel) if channel is not None else None
            if chan is None:
                return
            if kind == "subscribe":
                # A confirmation for a channel that was subscribed before is a re-subscription
                # (ours, or redis-py's own after it reconnected inside get_message): hints sent
                # while the connection was down are lost, so every waiter tries again now. On a
                # channel leaving it is redis-py's (its UNSUBSCRIBE went with the old connection).
                chan.leaving = False
                again = chan.was_up or chan.confirmed.is_set()
                chan.pending = max(0, chan.pending - 1)
                if chan.pending == 0:
                    chan.confirmed.set()
                if again:
                    chan.was_up = False
                    _wake(chan, None)
            elif kind == "unsubscribe":
                # The server no longer has it subscribed (ours confirmed, or one redis-py sent
                # again after it reconnected): gone if unused, else the reader subscribes it
                # again (_to_resubscribe), waking its waiters if it had been confirmed.
                chan.leaving = False
                chan.was_up = chan.was_up or chan.confirmed.is_set()
                chan.confirmed.clear()
                if chan.refs == 0 and chan.pending == 0:
                    del self.channels[chan.name]
            elif kind == "moved":
                # A cluster moved the channel's slot to another node (``_redis.pubsub_cluster``):
                # every waiter tries again, and then waits on the new owner.
                chan.moved = True
                chan.pending = 0
                chan.leaving = False
                chan.confirmed.clear()
                _wake(chan, None)
            elif kind == "message":
                data = message.get("data")
                if isinstance(data, bytes):
                    data = data.decode("ascii", "replace")
                handed = handoff(data)
                idents = wake_idents(data) if handed is None else None
                if handed is not None:
                    for waiter in chan.waiters:  # only the wait of that nonce; late ones: none
                        if waiter.ident == handed[0]:
                            waiter.payload = handed[1]
                            waiter.named = True
                            waiter.hinted = True
                            waiter.event.set()
                elif idents is not None:
                    for waiter in chan.waiters:
                        if waiter.ident is not None and waiter.ident in idents:
                            waiter.named = True
                            waiter.hinted = True
                            waiter.event.set()
                else:
                    turns = yield_turns(data)
                    if turns:
                        chan.turns = turns
                    _wake(chan, wake_count(data))


def _wake(chan: Channel, n: Optional[int]) -> None:
    """Wake the ``n`` oldest waiters not woken yet (all when ``n`` is None); holds the mutex."""
    for waiter in chan.waiters:
        if n is not None and n <= 0:
            break
        if not waiter.hinted:
            waiter.hinted = True
            waiter.event.set()
            if n is not None:
                n -= 1
