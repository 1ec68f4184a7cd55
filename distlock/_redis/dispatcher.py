"""The thread side of a session's pub/sub (``pubsub.Board`` keeps the books): one connection and
one dispatcher thread for every channel this process waits on, or a waiting thread reading that
connection itself while the dispatcher has nothing else to read for (``_redis.lending``).

The dispatcher thread starts with the first waiter and exits, closing its connection, once no
channel is left: a process that stops waiting keeps no thread and no connection for it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

import redis

from .._core.settings import settings
from .clients import release_listener
from .lending import SOON, Lender
from .pubsub import TICK, Board, Waiter

__all__ = ["Dispatcher"]

log = logging.getLogger("distlock")

#: How long a sleeping thread waits for a busy dispatcher before it tries to borrow again, and
#: how many times per sleep (then it sleeps on its event, and the dispatcher reads for it)
SOON_AFTER = 0.002
SOON_TRIES = 5


class Dispatcher(Board):
    """Channels, their waiters, and the thread that reads the pub/sub connection, or lends it to
    a sleeping waiter (``lends``: see ``_redis.lending``).

    ``executor`` is called for the executor whose ``pubsub()`` opens the pub/sub connection
    (each time one is opened: after a failure, or when the thread starts again after it had
    exited idle).
    """

    #: A sleeping waiter may borrow the connection (the topologies whose dispatcher reads a
    #: translated or shared stream turn it off: ``pubsub_cluster``, ``pubsub_quorum``).
    lends = True

    def __init__(self, executor: Callable[[], Any], tag: str) -> None:
        super().__init__()
        self._executor = executor
        self._tag = tag
        #: Serializes SUBSCRIBE/UNSUBSCRIBE: redis-py's PubSub is not thread-safe, and two
        #: threads' first subscribes would each open a connection, one of them orphaned with its
        #: channels (their wake-ups lost, waiters left to their polling bound).
        self._io = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._lender = Lender(self, TICK)

    # --- waiting ----------------------------------------------------------------------------

    def join(self, channel_name: str, bound: Optional[float], ident: Optional[str] = None) -> Waiter:
        """Subscribe to ``channel_name`` (if this process is not yet) and queue a waiter on it.

        Wait for the server's confirmation of the subscription at most ``bound`` seconds, so a
        release that happens after the caller's next try is never missed in normal operation.
        """
        with self.mutex:
            if self._thread is None and not self.closed:
                self._connect_locked()
                self._thread = threading.Thread(
                    target=self._loop, name=f"distlock-pubsub-{self._tag}", daemon=True)
                self._thread.start()
            waiter, pubsub = self._enqueue(channel_name, ident)
        chan = waiter.channel
        send = pubsub is not None
        try:
            if send:
                try:
                    with self._io:
                        pubsub.subscribe(channel_name)
                except redis.RedisError as exc:  # the dispatcher reconnects and subscribes again
                    log.debug("distlock: subscribe to %s failed: %r", channel_name, exc)
                self._lender.unpark()  # it reads the confirmation
            if bound is None or bound > 0:
                cap = settings().wait_cap
                chan.confirmed.wait(cap if bound is None else min(bound, cap))
        except BaseException:
            # Interrupted (KeyboardInterrupt, a non-Redis error) before the caller had the
            # waiter: nobody else can take it off its queue.
            self.leave(waiter, False)
            raise
        return waiter

    def sleep(self, waiter: Waiter, head_bound: float, limit: Optional[float] = None) -> bool:
        """Sleep until woken by a hint, or at most the bound: ``head_bound`` for the head of
        this process' queue, ``head_bound * queue_cap_factor`` for the others, who are handed
        the head's place in order: a head that leaves without the lock hands a wake-up on, and
        one that leaves with it promotes the next, which then sleeps out the head's bound.
        ``limit`` (e.g. the caller's time left) caps either bound. Return True when a hint
        (not the bound) ended the sleep. While the dispatcher has nothing else to read for, the
        sleeping thread reads the connection itself (``_redis.lending``)."""
        started = time.monotonic()
        lender = self._lender if self.lends else None
        soon = 0
        while not waiter.hinted:
            left = self._bound(waiter, head_bound, limit) - (time.monotonic() - started)
            if left <= 0:
                break
            if lender is None:
                waiter.event.wait(left)
            else:
                loan = lender.borrow(waiter)
                if loan is SOON and soon < SOON_TRIES:  # a moment, then borrow again
                    soon += 1
                    waiter.event.wait(min(left, SOON_AFTER))
                    waiter.event.clear()
                    continue
                if loan is not None and loan is not SOON:
                    try:
                        lender.read(waiter, loan, time.monotonic() + left)
                        continue
                    except (redis.RedisError, OSError, ValueError) as exc:  # the dispatcher meets it
                        log.debug("distlock: reading the lent pub/sub connection failed: %r", exc)
                lender.sleeping(1)
                try:
                    waiter.event.wait(min(left, TICK))  # then borrow again, if it can
                finally:
                    lender.sleeping(-1)
            waiter.event.clear()  # a promotion (the head left) only re-reads the bound
        return self._take_hint(waiter)

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    # --- the thread ---------------------------------------------------------------------------

    def _open(self) -> Any:
        return self._executor().pubsub()

    def _loop(self) -> None:
        backoff = 0.05
        lender = self._lender if self.lends else None
        while not self.closed:
            pubsub = self._pubsub
            try:
                self._resubscribe_if_needed(pubsub)
                message = pubsub.get_message(timeout=self._read_for(lender))
                backoff = 0.05
            except Exception as exc:  # noqa: BLE001 - this thread must outlive any failure
                if self.closed:
                    break
                try:
                    self._on_broken(exc)
                except ReferenceError:
                    # the user's client the session talked through (a weak proxy: a Sentinel
                    # client, say) is gone, and with it every primitive and waiter of it
                    with self.mutex:
                        self._reader_gone()
                        self._pubsub = None
                    break
                except Exception:  # noqa: BLE001 - no new connection yet: try again
                    log.exception("distlock: pub/sub reconnect failed")
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            try:
                if message is not None:
                    self._handle(message)
                if self._unsubscribe_idle(pubsub):
                    return  # nothing left to wait on: the thread and its connection go
                if message is None and lender is not None:
                    lender.park()  # until something needs this thread to read
                    if self._unsubscribe_idle(pubsub):  # the chores a loan left to it
                        return
            except Exception:  # noqa: BLE001 - a surprise in one message must not stop the rest
                log.exception("distlock: pub/sub dispatcher error")
        _close_quietly(pubsub)
        with self.mutex:
            if self._thread in (None, threading.current_thread()):  # not a newer thread's
                self._lender.gone()

    def _read_for(self, lender: Optional[Lender]) -> float:
        """How long the next read may block: not at all when the thread is about to park."""
        if lender is None:
            return TICK
        with self.mutex:
            return 0.0 if lender.parkable() else TICK

    def _resubscribe_if_needed(self, pubsub: Any) -> None:
        names = self._to_resubscribe()
        if names:
            with self._io:
                pubsub.subscribe(*names)

    def _unsubscribe_idle(self, pubsub: Any) -> bool:
        """Drop channels idle for UNSUBSCRIBE_AFTER; return True when the thread should exit
        (no channel left: it has then given up its place, and its connection is closed)."""
        names, done = self._drop_idle()
        if done:
            _close_quietly(pubsub)
        elif names:
            try:
                with self._io:
                    pubsub.unsubscribe(*names)
            except redis.RedisError as exc:
                # Whether the server ran it is unknown, and the channels wait for its
                # confirmation: start over on a fresh connection, where nothing is subscribed.
                self._on_broken(exc)
        return done

    def _reader_gone(self) -> None:
        self._thread = None
        self._lender.gone()

    def _on_broken(self, exc: BaseException) -> None:
        _close_quietly(self._broken(exc))

    def close(self, join: bool) -> None:
        """Stop the thread (``join``: and wait for it) and close the connection."""
        self.closed = True
        with self.mutex:
            thread, pubsub = self._thread, self._pubsub
            self._lender.stop()
        if join and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=3.0)
        _close_quietly(pubsub)


def _close_quietly(pubsub: Any) -> None:
    if pubsub is None:
        return
    try:
        pubsub.close()
    except Exception:  # noqa: BLE001 - closing a connection that may already be broken
        pass
    release_listener(pubsub)
