"""The pub/sub connection lent to a waiting thread (``dispatcher.Dispatcher``): a thread that sleeps
while no other needs the dispatcher reads the connection itself, so the message that wakes it
(a hint, or a lock handed to it) costs no hop from the dispatcher thread to it: one wake-up of
one thread, as a lone subscriber reading its own socket has.

Still one connection per process, read by one thread at a time:

- The dispatcher thread **parks** when nothing needs it to read: no waiter sleeps on its event,
  and no subscription is on its way (``parkable``). Parked, it looks again each ``tick`` (a
  pass: what arrived meanwhile is dispatched, idle channels are dropped), and at once when
  ``unpark`` is called: a waiter that could not borrow sleeps on its event, a join sent a
  SUBSCRIBE, or a loan ended with others to read for.
- A waiter going to sleep **borrows** the connection when the dispatcher is parked and no one
  else has it. It reads until its sleep ends, dispatching every message (other threads' hints
  and subscriptions too), and nothing else: when the board needs what only the dispatcher does
  (a channel to subscribe again, an idle one to give up: ``needs_dispatcher``), the loan ends,
  and the dispatcher has its pass before anyone borrows again. Woken in the process (a
  hand-off by a release of this process, a promotion in its queue), it is rung through a
  socket pair, which its ``poll`` watches beside the connection, and its loan ends: the sleep
  works its bound out again.
- Anything unexpected (the connection broke, the session closed) ends the loan: the waiter
  sleeps the rest on its event, and the dispatcher, unparked, meets the failure and reconnects
  as it always does.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Optional, Tuple

from .clients import release_listener
from .direct import readable

__all__ = ["Bell", "Lender", "SOON"]

#: ``Lender.borrow``'s answer while the dispatcher is busy a moment (its chores, a subscription
#: on its way) and reads for nobody else: try again in a moment, without asking it to read on
SOON = ("soon",)

log = logging.getLogger("distlock")


class Bell:
    """A borrowing waiter's event while it reads the connection: ``set`` from another thread also
    rings the waiter's ``poll``, which a ``threading.Event`` could not reach."""

    __slots__ = ("inner", "_ring", "_reader")

    def __init__(self, inner: Any, ring: socket.socket) -> None:
        self.inner = inner
        self._ring = ring
        self._reader = threading.get_ident()

    def set(self) -> None:
        self.inner.set()
        if threading.get_ident() != self._reader:
            _ring(self._ring)

    def clear(self) -> None:
        self.inner.clear()

    def is_set(self) -> bool:
        return bool(self.inner.is_set())

    def wait(self, timeout: Optional[float] = None) -> bool:
        return bool(self.inner.wait(timeout))


class Lender:
    """Who reads ``board``'s connection: its dispatcher thread, or the waiter it is lent to.
    Every field is read and written under ``board.mutex``."""

    def __init__(self, board: Any, tick: float) -> None:
        self._board = board
        self._tick = tick
        self.parked = False
        self.lent_to: Any = None
        #: waiters sleeping on their events: the dispatcher must read for them
        self.sleepers = 0
        #: a loan ended for the dispatcher's chores: nobody borrows before its next pass
        self.wanted = False
        self._unpark = threading.Event()
        self._bell: Optional[Tuple[socket.socket, socket.socket]] = None

    # --- the dispatcher thread -----------------------------------------------------------------

    def parkable(self) -> bool:
        """Nothing needs the dispatcher to read now (holds the mutex)."""
        board = self._board
        if self.sleepers or board.closed:
            return False
        for chan in board.channels.values():
            if chan.pending or chan.leaving or chan.moved or (chan.refs and not chan.confirmed.is_set()):
                return False
        return True

    def needs_dispatcher(self) -> bool:
        """The board needs what only the dispatcher does (holds the mutex): a channel waited on
        to subscribe again (after a reconnect, or its UNSUBSCRIBE confirmed as a waiter joined
        it), or an idle one to give up."""
        board = self._board
        now = time.monotonic()
        return any(board._unsubscribed(c) or (board._idle_past(c, now) and not c.leaving)
                   for c in board.channels.values())

    def park(self) -> None:
        """The dispatcher read nothing: wait while nothing needs it, a ``tick`` at most unless the
        connection is lent (then until the loan ends, a ``tick`` at a time)."""
        board = self._board
        with board.mutex:
            if not self.parkable():
                return
            self.parked = True
        while True:
            self._unpark.wait(self._tick)
            self._unpark.clear()
            with board.mutex:
                if self.lent_to is None or board.closed:
                    self.parked = self.wanted = False
                    return

    def unpark(self) -> None:
        if self.parked:
            self._unpark.set()

    def stop(self) -> None:
        """The session closes: the dispatcher stops parking, and a borrower stops reading."""
        self._unpark.set()
        bell = self._bell
        if bell is not None and self.lent_to is not None:
            _ring(bell[1])

    def gone(self) -> None:
        """The dispatcher exits (idle, or closed): no loan can start; the bell goes."""
        self.parked = False
        bell, self._bell = self._bell, None
        if bell is not None:
            for end in bell:
                end.close()

    # --- a waiting thread ----------------------------------------------------------------------

    def borrow(self, waiter: Any) -> Any:
        """Lend the connection to ``waiter`` if the dispatcher is parked and no one else has it:
        its PubSub, its redis-py connection and the bell's reading end; ``SOON`` while the
        dispatcher is busy a moment and reads for no one else; None otherwise (the caller
        sleeps on its event, and the reader reads for it)."""
        board = self._board
        with board.mutex:
            pubsub = board._pubsub
            if board.closed or pubsub is None:
                return None
            if self.parked and self.lent_to is None and not self.wanted and self.needs_dispatcher():
                self.wanted = True
                self._unpark.set()
            if self.wanted or not (self.parked or self.sleepers):
                return SOON
            if not self.parked or self.lent_to is not None:
                return None
            conn = getattr(pubsub, "connection", None)
            if not isinstance(getattr(conn, "_sock", None), socket.socket):
                return None  # not connected, or no socket to watch (fakeredis)
            if self._bell is None:
                try:
                    self._bell = socket.socketpair()
                except OSError:  # out of file descriptors, say: the dispatcher reads
                    return None
                for end in self._bell:
                    end.setblocking(False)
            self.lent_to = waiter
            waiter.event = Bell(waiter.event, self._bell[1])
            return pubsub, conn, self._bell[0]

    def read(self, waiter: Any, loan: Tuple[Any, Any, socket.socket], until: float) -> None:
        """Read the lent connection until ``waiter`` is hinted or ``until`` (time.monotonic()),
        dispatching every message; then give it back. Raises what the connection raised."""
        board = self._board
        pubsub, conn, bell = loan
        tick = self._tick
        try:
            while not waiter.hinted and not board.closed and board._pubsub is pubsub:
                left = until - time.monotonic()
                sock = conn._sock
                if left <= 0 or sock is None:  # (disconnected: the dispatcher reconnects)
                    return
                if conn.can_read(timeout=0):  # what redis-py has buffered, or the socket has
                    # (a message only partly there: the rest is waited for, not spun on)
                    message = pubsub.get_message(timeout=min(left, tick))
                    if message is not None:
                        board._handle(message)
                        if self._wants_dispatcher():
                            return
                    continue
                ready = readable([sock, bell], min(left, tick))
                if bell in ready:
                    # rung from the process: handed the lock, or promoted to the head of its
                    # queue, whose bound is shorter (the sleep works it out again)
                    try:
                        bell.recv(64)
                    except OSError:
                        pass
                    return
                if not ready and self._wants_dispatcher():  # a quiet tick: its chores?
                    return
        finally:
            with board.mutex:
                self.lent_to = None
                event = waiter.event
                if isinstance(event, Bell):
                    waiter.event = event.inner
                wake = self.wanted or not self.parkable()
                gone = board.closed or board._pubsub is not pubsub
            if wake:
                self._unpark.set()
            if gone:  # closed or replaced under this read, which may have reconnected it
                release_listener(pubsub)

    def _wants_dispatcher(self) -> bool:
        with self._board.mutex:
            if self.needs_dispatcher():
                self.wanted = True
        return self.wanted

    def sleeping(self, delta: int) -> None:
        """A waiter starts (+1) or ends (-1) a sleep on its event, which the dispatcher must
        read for."""
        with self._board.mutex:
            self.sleepers += delta
            if delta > 0 and self.parked:
                self._unpark.set()


def _ring(end: socket.socket) -> None:
    """Wake the borrower's wait through the bell's writing ``end``."""
    try:
        end.send(b"\0")
    except OSError:  # full (it rings already), or closed with the session
        pass
