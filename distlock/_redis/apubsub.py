"""The pub/sub side of the asyncio shell: one connection and one reader task per event loop and
client, for every channel that loop's tasks wait on.

The bookkeeping (channels, waiters, the head of each queue, hints that name waiters, idle
channels) is ``_redis.pubsub.Board``, shared with the threads' ``Dispatcher``; only the I/O differs:
SUBSCRIBE is awaited, a waiter sleeps on a ``Flag`` (a future and a timer), and a task reads the
connection.
The task starts with the first waiter and ends, closing its connection, once no channel is left
(``UNSUBSCRIBE_AFTER`` after the last waiter left), or when its loop cancels it at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Any, Callable, List, Optional

import redis
import redis.asyncio.connection

from .._core.settings import settings
from .pubsub import TICK, Board, Waiter

__all__ = ["AsyncDispatcher"]

log = logging.getLogger("distlock")


class AsyncDispatcher(Board):
    """``Dispatcher`` for one event loop. ``opener()`` opens a new ``redis.asyncio`` PubSub."""

    event = staticmethod(lambda: Flag())

    def __init__(self, opener: Callable[[], Any]) -> None:
        super().__init__()
        self._opener = opener
        self._io: Optional[asyncio.Lock] = None  # made in the loop (Python 3.9 binds it there)
        self.task: Optional[asyncio.Task[None]] = None

    async def join(self, channel_name: str, bound: Optional[float], ident: Optional[str] = None) -> Waiter:
        """Subscribe to ``channel_name`` (if this loop is not yet) and queue a waiter on it;
        wait for the server's confirmation at most ``bound`` seconds (see ``Dispatcher.join``)."""
        if self._io is None:
            self._io = asyncio.Lock()
        with self.mutex:
            if self.task is None and not self.closed:
                self._connect_locked()
                self.task = asyncio.ensure_future(self._loop())
            waiter, pubsub = self._enqueue(channel_name, ident)
        try:
            if pubsub is not None:
                try:
                    async with self._io:
                        await asyncio.wait_for(pubsub.subscribe(channel_name), settings().wait_cap)
                except (redis.RedisError, asyncio.TimeoutError, OSError, AttributeError) as exc:
                    # the reader reconnects and subscribes again; meanwhile the waiter polls.
                    # AttributeError: the reader closed the connection (it found it broken)
                    # while this SUBSCRIBE was being written, and a closed asyncio transport
                    # has no loop to write with (Python 3.13: "'NoneType' object has no
                    # attribute '_add_writer'"); the nemesis met it after a restart
                    log.debug("distlock: subscribe to %s failed: %r", channel_name, exc)
                if self._pubsub is not pubsub:
                    # the reader started over meanwhile: the connection this join opened is
                    # nobody's (the reader closed it before it had connected)
                    await close_quietly(pubsub)
            if bound is None or bound > 0:
                cap = settings().wait_cap
                await waiter.channel.confirmed.wait(cap if bound is None else min(bound, cap))
        except BaseException:
            self.leave(waiter, False)  # cancelled before the caller had the waiter
            raise
        return waiter

    async def sleep(self, waiter: Waiter, head_bound: float, limit: Optional[float] = None) -> bool:
        """``Dispatcher.sleep`` for a task."""
        started = time.monotonic()
        while not waiter.hinted:
            left = self._bound(waiter, head_bound, limit) - (time.monotonic() - started)
            if left <= 0:
                break
            await waiter.event.wait(left)
            waiter.event.clear()  # a promotion (the head left) only re-reads the bound
        return self._take_hint(waiter)

    # --- the reader task ------------------------------------------------------------------------

    async def _loop(self) -> None:
        backoff = 0.05
        pubsub = self._pubsub
        try:
            while not self.closed:
                _raise_if_cancelled()
                pubsub = self._pubsub
                try:
                    names = self._to_resubscribe()
                    if names:
                        async with self._io:  # type: ignore[union-attr]
                            await pubsub.subscribe(*names)
                    if pubsub.connection is None:
                        # Not connected: redis-py's get_message would raise. A waiter's join
                        # may be connecting, to send the first SUBSCRIBE: it holds the I/O lock
                        # for as long (however slow the connect). Look again soon.
                        if self._io.locked():  # type: ignore[union-attr]
                            await asyncio.sleep(0.002)
                            continue
                        # Nothing is on its way: the join's SUBSCRIBE failed before it
                        # connected (the reader's own has failed or succeeded by now). While
                        # someone waits, start over; else give the channels up, below.
                        if self.busy():
                            raise redis.ConnectionError("the pub/sub connection never connected")
                        with self.mutex:  # no SUBSCRIBE is on its way on it: the channels are
                            self._reset_channels()  # given up below once idle long enough
                        await asyncio.sleep(TICK)  # as redis-py's get_message does unsubscribed
                        message = None
                    else:
                        message = await pubsub.get_message(timeout=TICK)
                    backoff = 0.05
                except Exception as exc:  # noqa: BLE001 - the reader must outlive any failure
                    if self.closed:
                        break
                    if self._drop_idle()[1]:
                        return  # nobody waits any more: no reason to reconnect
                    await self._on_broken(exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                    continue
                try:
                    if message is not None:
                        self._handle(message)
                        # the task it woke runs first: the reader's next read can wait
                        await asyncio.sleep(0)
                    names, done = self._drop_idle()
                    if done:
                        return  # nothing left to wait on: the task and its connection go
                    if names:
                        try:
                            async with self._io:  # type: ignore[union-attr]
                                await pubsub.unsubscribe(*names)
                        except redis.RedisError as exc:  # see Dispatcher._unsubscribe_idle
                            await self._on_broken(exc)
                except Exception:  # noqa: BLE001 - a surprise in one message must not stop the rest
                    log.exception("distlock: pub/sub reader error")
        finally:
            with self.mutex:
                if self.task is asyncio.current_task():
                    self.task = None
                    self._pubsub = None
            await close_quietly(pubsub)

    def _reader_gone(self) -> None:
        self.task = None

    def _open(self) -> Any:
        return self._opener()

    async def _on_broken(self, exc: BaseException) -> None:
        await close_quietly(self._broken(exc))

    def close(self) -> None:
        """Stop the reader task (from its loop)."""
        self.closed = True
        task = self.task
        if task is not None:
            task.cancel()


class Flag:
    """``asyncio.Event``'s ``set``, ``clear`` and ``is_set``, and a wait with a time limit that
    costs a future and a timer, not a task (``asyncio.wait_for`` makes one per call, and
    waiters sleep often). Used only from its loop."""

    __slots__ = ("_set", "_waiting")

    def __init__(self) -> None:
        self._set = False
        self._waiting: List[asyncio.Future[None]] = []

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiting, self._waiting = self._waiting, []
        for fut in waiting:
            if not fut.done():
                fut.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self, timeout: float) -> None:
        """Until set, at most ``timeout`` seconds."""
        if self._set:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._waiting.append(fut)
        timer = loop.call_later(timeout, _expire, fut)
        try:
            await fut
        finally:
            timer.cancel()
            if fut in self._waiting:
                self._waiting.remove(fut)


def _timeouts_take_back_their_cancellations() -> bool:
    """Whether redis-py times its reads with the standard library's ``asyncio.timeout`` (3.11.3
    and later), or with an ``async-timeout`` built on it (5.x, on 3.11), which take back their
    own cancellation (``uncancel``) on the way out: then ``Task.cancelling()`` counts only the
    cancellations of others. Older ``async-timeout`` releases do not in every version: there an
    idle read that timed out would look cancelled."""
    timeout = getattr(redis.asyncio.connection, "async_timeout", None)
    standard = getattr(asyncio, "Timeout", None)
    if timeout is None or standard is None:
        return False
    if timeout is getattr(asyncio, "timeout", None):
        return True
    made = getattr(sys.modules.get(getattr(timeout, "__module__", "")), "Timeout", None)
    return isinstance(made, type) and issubclass(made, standard)


_CANCELLING_IS_TRUSTED = _timeouts_take_back_their_cancellations()


def _raise_if_cancelled() -> None:
    """Raise CancelledError if this task was cancelled and something swallowed it (3.11+ can
    tell: ``Task.cancelling``). A CancelledError that meets a timeout expiring at the same
    moment can come out as a TimeoutError, which the reader shrugs off as a network failure:
    it must still end, or ``asyncio.run`` waits for it for ever when it cancels what is left."""
    if not _CANCELLING_IS_TRUSTED:
        return
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    if cancelling is not None and cancelling():
        raise asyncio.CancelledError


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def close_quietly(pubsub: Any) -> None:
    if pubsub is None:
        return
    try:
        close = getattr(pubsub, "aclose", None) or pubsub.close
        await close()
    except Exception:  # noqa: BLE001 - closing a connection that may already be broken
        pass
