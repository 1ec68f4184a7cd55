"""The asyncio pub/sub reader ends when it should, whatever its connection did, and does not
start over on a connection that is only slow.

Both were found by the nemesis (``python -m distlock.testing.nemesis --topology redlock
--shell asyncio --nemesis partition``): after a partition, a worker's ``asyncio.run`` never
returned, because the reader task it cancelled at the end went on running.

- A pub/sub connection that never connected (a waiter's SUBSCRIBE failed before it did) left the
  reader looking every 2 ms for a connection that would never come, for ever: it neither gave
  up the channel nobody waited on any more nor started over.
- A cancellation that a library turned into another error (3.11's timeouts can, when a timeout
  expires as the task is cancelled) was shrugged off as a network failure: the reader must end
  all the same.

- And the other way round: a first connection that takes longer than the reader's poll to
  connect is not taken for a failed one (a Sentinel lookup, TLS, a busy pool): no second
  connection, no warning.
- A join whose SUBSCRIBE is written to a connection the reader has just closed (it found it
  broken: a restart) gets what asyncio gives a closed transport, an AttributeError on 3.13
  (the nemesis met it on Redlock): the join still returns its waiter, which polls until the
  reader has subscribed again, instead of failing the caller's acquire.

A fake PubSub plays the connection, so that each case is exact; the bounds are hang bounds.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, List, Optional, Tuple

import pytest
import redis
from _support import BOUND

from distlock._redis.apubsub import _CANCELLING_IS_TRUSTED, AsyncDispatcher


class _NeverConnects:
    """A ``redis.asyncio`` PubSub whose SUBSCRIBE fails before it connects. ``swallow``: a
    cancellation that reaches its SUBSCRIBE comes out as a ``redis.TimeoutError``."""

    def __init__(self, swallow: bool = False) -> None:
        self.connection: Optional[Any] = None
        self.swallow = swallow
        self.subscribes = 0

    async def subscribe(self, *names: str) -> None:
        self.subscribes += 1
        if self.swallow:
            try:
                await asyncio.sleep(BOUND)
            except asyncio.CancelledError:
                raise redis.TimeoutError("Timeout reading from socket") from None
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    async def get_message(self, timeout: float = 0.0) -> None:
        raise RuntimeError("pubsub connection not set: did you forget to call subscribe()?")

    async def unsubscribe(self, *names: str) -> None:
        pass

    async def aclose(self) -> None:
        pass


async def _closed(dispatcher: AsyncDispatcher, waiter: Any) -> None:
    """The waiter gone, the dispatcher closed, and its reader task ended."""
    dispatcher.leave(waiter, False)
    dispatcher.close()
    if dispatcher.task is not None:
        await asyncio.wait([dispatcher.task], timeout=BOUND)


class _SlowToConnect(_NeverConnects):
    """Its SUBSCRIBE connects after ``delay`` seconds, and then works."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def subscribe(self, *names: str) -> None:
        self.subscribes += 1
        await asyncio.sleep(self.delay)
        self.connection = object()

    async def get_message(self, timeout: float = 0.0) -> None:
        await asyncio.sleep(timeout)


def test_a_slow_first_connection_is_waited_for_not_replaced() -> None:
    opened: List[_NeverConnects] = []

    def opener() -> _NeverConnects:
        opened.append(_SlowToConnect(0.3))  # three of the reader's ticks
        return opened[-1]

    async def body() -> None:
        dispatcher = AsyncDispatcher(opener)
        waiter = await dispatcher.join("distlock:{reader}:wake:slow", 0.0)
        try:
            await asyncio.sleep(0.5)  # a hang would show as a second connection, not as time
            assert len(opened) == 1 and opened[0].subscribes == 1
            assert dispatcher.reconnects == 0
        finally:
            await _closed(dispatcher, waiter)

    asyncio.run(body())


def _dispatcher(swallow: bool = False) -> Tuple[AsyncDispatcher, List[_NeverConnects]]:
    """A dispatcher on connections that never connect, and the list of those it opened.
    ``swallow``: every connection after the first (the join's) swallows a cancellation."""
    opened: List[_NeverConnects] = []

    def opener() -> _NeverConnects:
        opened.append(_NeverConnects(swallow=swallow and bool(opened)))
        return opened[-1]

    return AsyncDispatcher(opener), opened


async def _started_over(opened: List[_NeverConnects]) -> None:
    """Until the reader has opened a second connection and sent SUBSCRIBE on it."""
    deadline = asyncio.get_running_loop().time() + BOUND
    while len(opened) < 2 or opened[1].subscribes == 0:
        assert asyncio.get_running_loop().time() < deadline, "the reader never started over"
        await asyncio.sleep(0.01)


def test_a_reader_that_never_connected_gives_up_when_nobody_waits() -> None:
    async def body() -> None:
        dispatcher, opened = _dispatcher()
        waiter = await dispatcher.join("distlock:{reader}:wake:x", 0.05)
        task = dispatcher.task
        assert task is not None and opened[0].subscribes == 1  # the join's SUBSCRIBE failed
        dispatcher.leave(waiter, False)  # nobody waits on the channel any more
        try:
            await asyncio.wait_for(asyncio.shield(task), BOUND)
        finally:
            dispatcher.close()
        assert dispatcher.task is None and not dispatcher.channels

    asyncio.run(body())


def test_a_reader_that_never_connected_starts_over_while_a_task_waits() -> None:
    async def body() -> None:
        dispatcher, opened = _dispatcher()
        waiter = await dispatcher.join("distlock:{reader}:wake:y", 0.05)
        try:
            # a new connection, subscribed again, instead of waiting for the first for ever
            await _started_over(opened)
        finally:
            await _closed(dispatcher, waiter)

    asyncio.run(body())


@pytest.mark.skipif(not _CANCELLING_IS_TRUSTED,
                    reason="Task.cancelling() is new in 3.11, and tells only where redis-py's "
                           "timeouts take back their own cancellations (see apubsub)")
def test_a_cancelled_reader_ends_even_if_the_cancellation_was_swallowed() -> None:
    async def body() -> None:
        # the join's connection fails at once; the reader's own SUBSCRIBE on the next one
        # hangs, and turns the cancellation into a TimeoutError
        dispatcher, opened = _dispatcher(swallow=True)
        waiter = await dispatcher.join("distlock:{reader}:wake:z", 0.05)
        task = dispatcher.task
        assert task is not None
        try:
            await _started_over(opened)
            task.cancel()  # as asyncio.run does to the tasks left when its main one ends
            done, _ = await asyncio.wait([task], timeout=BOUND)
            assert done, "the reader outlived its cancellation"
            assert task.cancelled()
        finally:
            dispatcher.leave(waiter, False)
            dispatcher.close()

    asyncio.run(body())


class _ClosedUnderTheWrite(_SlowToConnect):
    """The first SUBSCRIBE meets a transport closed under it (what asyncio's selector transport
    raises on 3.13 once closed); every later one connects at once."""

    def __init__(self) -> None:
        super().__init__(0.0)

    async def subscribe(self, *names: str) -> None:
        if self.subscribes == 0:
            self.subscribes += 1
            raise AttributeError("'NoneType' object has no attribute '_add_writer'")
        await super().subscribe(*names)


def test_a_join_whose_connection_was_closed_under_its_write_still_waits() -> None:
    opened: List[_NeverConnects] = []

    def opener() -> _NeverConnects:
        opened.append(_ClosedUnderTheWrite())
        return opened[-1]

    async def body() -> None:
        dispatcher = AsyncDispatcher(opener)
        waiter = await dispatcher.join("distlock:{reader}:wake:closed", 0.05)  # no error
        try:
            deadline = asyncio.get_running_loop().time() + BOUND
            while opened[-1].subscribes < 2 and len(opened) < 2:
                assert asyncio.get_running_loop().time() < deadline, "never subscribed again"
                await asyncio.sleep(0.01)
        finally:
            await _closed(dispatcher, waiter)

    asyncio.run(body())


def test_a_read_on_a_connection_closed_under_it_is_a_connection_error() -> None:
    """redis-py's asyncio cluster nodes share their connections between tasks; one task's
    failure closes a connection another is writing on, whose transport then answers
    AttributeError (3.10, 3.13) or TypeError (3.12). The nemesis met both in a cluster restart:
    a read (``AsyncPort.read``) turns them into the ConnectionError they are."""

    from distlock._redis.aport import AsyncPort

    for error in (AttributeError("'NoneType' object has no attribute 'writelines'"),
                  TypeError("'NoneType' object is not callable")):
        async def closed(*command: Any, error: Exception = error) -> Any:
            raise error
        port = SimpleNamespace(_client=SimpleNamespace(execute_command=closed), _io_bound=None,
                               _bounded=AsyncPort._bounded)
        with pytest.raises(redis.ConnectionError, match="closed under HMGET"):
            asyncio.run(AsyncPort.read(port, "HMGET", "k", "f"))  # type: ignore[arg-type]


class _ClosedUnderIt:
    """A connection that another task disconnects while this one writes on it: the reconnect's
    handshake then writes on no transport (redis-py's asyncio cluster, a slot map refresh)."""

    def __init__(self, connected_after: bool) -> None:
        self.is_connected = True
        self.connected_after = connected_after
        self.disconnects = 0

    async def send_packed_command(self, packed: Any) -> None:
        self.is_connected = self.connected_after
        raise AttributeError("'NoneType' object has no attribute 'writelines'")

    async def disconnect(self, nowait: bool = False) -> None:
        self.disconnects += 1
        self.is_connected = False


def test_a_script_on_a_connection_closed_under_it_is_a_connection_error() -> None:
    """The cluster restart phase of the nemesis saw an acquire end in that AttributeError: a
    script's exchange (``AsyncPort._exchange``) turns it into a ConnectionError, whose outcome
    the flows already treat as unknown, and leaves the connection closed. The same error on a
    connection still open is a bug of ours, and stays what it is."""

    from distlock._redis.aport import AsyncPort

    port = SimpleNamespace(_inflight={}, _io_bound=None)
    conn = _ClosedUnderIt(connected_after=False)
    with pytest.raises(redis.ConnectionError, match="closed under the script") as caught:
        asyncio.run(AsyncPort._exchange(port, conn, [b"EVALSHA"]))  # type: ignore[arg-type]
    assert isinstance(caught.value.__cause__, AttributeError)
    assert conn.disconnects == 1 and not port._inflight
    still_open = _ClosedUnderIt(connected_after=True)
    with pytest.raises(AttributeError):
        asyncio.run(AsyncPort._exchange(port, still_open, [b"EVALSHA"]))  # type: ignore[arg-type]
    assert still_open.disconnects == 1


class _Writer:
    """A stream writer stub: its transport closing or not, its drain failing or not."""

    def __init__(self, closing: bool = False, fails: bool = False) -> None:
        self.transport = SimpleNamespace(is_closing=lambda: closing)
        self.fails = fails
        self.written: List[Any] = []

    def writelines(self, packed: Any) -> None:
        self.written.extend(packed)

    async def drain(self) -> None:
        if self.fails:
            raise ConnectionResetError("reset by peer")


def test_a_script_is_written_on_the_stream_and_its_failures_are_connection_errors() -> None:
    """``aport.awrite`` writes where redis-py's send_packed_command would, without its
    wait_for: the packed command on the stream writer; a transport closing, or a write that
    fails, is a ConnectionError, as redis-py's is; a connection with no writer goes through
    send_packed_command."""
    from distlock._redis.aport import awrite

    ok = SimpleNamespace(_writer=_Writer())
    asyncio.run(awrite(ok, [b"EVALSHA"]))
    assert ok._writer.written == [b"EVALSHA"]
    with pytest.raises(redis.ConnectionError, match="closed before"):
        asyncio.run(awrite(SimpleNamespace(_writer=_Writer(closing=True)), [b"EVALSHA"]))
    with pytest.raises(redis.ConnectionError, match="reset by peer") as caught:
        asyncio.run(awrite(SimpleNamespace(_writer=_Writer(fails=True)), [b"EVALSHA"]))
    assert isinstance(caught.value.__cause__, ConnectionResetError)
    sent: List[Any] = []

    async def send_packed_command(packed: Any) -> None:
        sent.append(packed)

    asyncio.run(awrite(SimpleNamespace(_writer=None, send_packed_command=send_packed_command),
                       [b"EVALSHA"]))
    assert sent == [[b"EVALSHA"]]
