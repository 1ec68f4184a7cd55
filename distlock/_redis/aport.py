"""The asyncio shell's port: what a flow's ops (``_core.flow``) do on an event loop.

One ``AsyncPort`` per ``redis.asyncio`` client and event loop (a client's connections belong
to the loop that opened them). It has:

- ``session``: the blocking ``Session`` of the same server (``_session.session.session_for`` of a blocking
  twin of the client, made from its connection settings, handed in by ``_session.ports``,
  which keeps the ports). Holds live there, with their ids,
  and its watchdog *thread* renews them: renewals go on while user code blocks the event loop
  (a CPU-bound handler, a blocking call), which a renewal task in the loop could not promise.
  A hold that could not be renewed is reported lost from that thread; an asyncio primitive
  then runs its ``on_lost`` callbacks in its own loop. Interpreter exit gives holds back
  through it, as for the blocking classes, and a blocking and an asyncio primitive of one server in
  one process share its session id.
- an executor: scripts sent as EVALSHA on the client's own asyncio connection pool, on the
  direct path (packed RESP, no retries: a state change is never sent twice, docs/design.rst, principle
  13), at most ``SCRIPT_CONCURRENCY`` at once; reads through the client, retries and all;
- an ``AsyncDispatcher``: one pub/sub connection and one reader task for every waiting task of
  the loop.

Nothing here outlives its client or its loop: ports are kept in weak maps
(``_session.ports``), the reader task exits when idle, and the twin (and with it the session's
claim on the server) goes with the port.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import time
import weakref
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import redis
from redis.asyncio import connection as aconnection
from redis.asyncio import sentinel as asentinel

from .apubsub import AsyncDispatcher
from .clients import DEFAULT_IO_TIMEOUT
from .direct import packer, protocol_error, taker
from .executor import NOSCRIPT_TRIES, SCRIPT_CONCURRENCY, demoted, located
from .failpoints import FailPoints
from .pubsub import Waiter

__all__ = ["AsyncPort", "blocking_twin", "aread_pair"]

#: ``asyncio.timeout`` (Python 3.11+)
_timeout: Any = getattr(asyncio, "timeout", None)

#: How long the hot connection stays out of the pool unused (seconds).
HOT_IDLE = 1.0

#: short tasks that give connections back (the loop keeps only weak references to tasks)
_giving: set[asyncio.Future[Any]] = set()


def _spawn(coro: Any) -> None:
    task = asyncio.ensure_future(coro)
    _giving.add(task)
    task.add_done_callback(_giving.discard)


#: asyncio connection classes and their blocking twins
_TWINS = {
    aconnection.Connection: redis.Connection,
    aconnection.SSLConnection: redis.SSLConnection,
    aconnection.UnixDomainSocketConnection: redis.UnixDomainSocketConnection,
}

#: connection settings that are asyncio objects, or that the twin sets for itself
_SKIP = {"retry", "redis_connect_func", "parser_class", "event_dispatcher", "connection_pool"}


def blocking_twin(client: Any) -> redis.Redis:
    """A blocking client with ``client``'s connection settings (it connects only when used).
    For a ``redis.asyncio.sentinel`` master client: a blocking Sentinel master client of the
    same sentinels, service and settings (``sentinel_twin``)."""
    pool = client.connection_pool
    if isinstance(pool, asentinel.SentinelConnectionPool):
        return sentinel_twin(pool)
    kind = _TWINS.get(pool.connection_class)
    if kind is None:
        raise TypeError(f"distlock.asyncio needs a redis.asyncio client on redis-py's own "
                        f"connection classes, not {pool.connection_class.__name__}")
    accepted = _parameters(kind)
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in accepted and k not in _SKIP}
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=kind, **kwargs))


def sentinel_twin(pool: Any) -> redis.Redis:
    """A blocking twin of an asyncio ``SentinelConnectionPool``'s client: a
    ``redis.sentinel.Sentinel`` of the same sentinel addresses and settings, and its
    ``master_for`` of the same service with the pool's connection settings. Its watchdog
    and its pub/sub connections look the master up as the asyncio client's do."""
    from redis import sentinel

    if not pool.is_master:
        raise TypeError("distlock.asyncio needs a Sentinel master client (master_for), "
                        "not a replica client (slave_for)")
    manager = pool.sentinel_manager
    accepted = _parameters(redis.Connection)
    addrs = []
    for node in manager.sentinels:
        node_kwargs = node.connection_pool.connection_kwargs
        addrs.append((node_kwargs["host"], node_kwargs["port"]))
    sentinel_kwargs = {k: v for k, v in manager.sentinel_kwargs.items() if k in accepted and k not in _SKIP}
    twin_manager = sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        addrs, min_other_sentinels=manager.min_other_sentinels, sentinel_kwargs=sentinel_kwargs,
        force_master_ip=getattr(manager, "_force_master_ip", None))
    ssl = issubclass(pool.connection_class, aconnection.SSLConnection)
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k in accepted and k not in _SKIP}
    return twin_manager.master_for(  # type: ignore[no-any-return,no-untyped-call,unused-ignore]
        pool.service_name, check_connection=pool.check_connection,
        connection_class=sentinel.SentinelManagedSSLConnection if ssl else sentinel.SentinelManagedConnection,
        **kwargs)


def _parameters(kind: type) -> set:  # type: ignore[type-arg]
    names: set = set()  # type: ignore[type-arg]
    for klass in kind.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            names.update(inspect.signature(init).parameters)
    return names


class AsyncPort:
    """The ops of a flow, as coroutines, for one asyncio client in one loop."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop,
                 session_for: Callable[[Any], Any]) -> None:
        """``session_for``: the blocking session of a client (``_session.session.session_for``),
        asked once, for the port's blocking twin of ``client``."""
        self.loop_ref = weakref.ref(loop)
        self.twin = self._make_twin(client)
        self.session: Any = session_for(self.twin)
        self.id = self.session.id
        #: reads in flight (connection -> when it began, monotonic) and whether the overdue
        #: check is scheduled (see ``_exchange``)
        self._inflight: Dict[Any, float] = {}
        self._checking = False
        #: the bound of every wait for the server, when the client sets none (see ``_bounded``)
        kwargs = self._connection_kwargs(client)
        #: ... for an answer (the client has no ``socket_timeout``)
        self._io_bound: Optional[float] = None
        if kwargs.get("socket_timeout") is None:
            self._io_bound = DEFAULT_IO_TIMEOUT
        #: ... for a connection: the same (redis-py bounds a connect by ``socket_timeout``
        #: when there is no ``socket_connect_timeout``)
        self._connect_bound = self._io_bound
        self._scripts = self.session.executor.scripts
        #: run slots (see ``run``): how many are free, and the tasks waiting for one
        self._free = SCRIPT_CONCURRENCY
        self._gate_waiters: Deque[asyncio.Future[None]] = collections.deque()
        #: scripts loaded before their first run with ``acks`` (see ``Executor.run``)
        self._preloaded: set[str] = set()
        #: the tests' seam (``_redis.failpoints``): None unless a test installs one
        self.failpoints: Optional[FailPoints] = None
        self._client = weakref.proxy(client)
        self._attach(client)

    def _make_twin(self, client: Any) -> Any:
        return blocking_twin(client)

    def _connection_kwargs(self, client: Any) -> Dict[str, Any]:
        return client.connection_pool.connection_kwargs  # type: ignore[no-any-return]

    def _attach(self, client: Any) -> None:
        """The pool, the packer and the dispatcher of a client of one server."""
        pool = client.connection_pool
        self._take = taker(pool)
        self._give = pool.release
        #: connections kept out of the pool between scripts (see ``_send``): at most one per
        #: run slot, so the port never holds more than ``SCRIPT_CONCURRENCY`` of them; when
        #: one was last used (loop time), and whether the timer that gives them back is set
        self._idle: List[Any] = []
        self._hot_used = 0.0
        self._cooling = False
        self._pack = packer(pool.get_encoder())
        proxy = self._client  # never a bound method of the client: that would keep it alive
        #: an ``AsyncDispatcher`` (on a cluster, an ``AsyncClusterDispatcher``: the same methods)
        self.dispatcher: AsyncDispatcher = AsyncDispatcher(lambda: proxy.pubsub())

    # --- the ops --------------------------------------------------------------------------------

    async def run(self, name: str, keys: Tuple[str, ...], args: Tuple[Any, ...],
                  acks: Optional[Tuple[int, int]] = None) -> Any:
        """One script as EVALSHA (``Executor.run``'s rules: never sent twice; NOSCRIPT means
        it did not run, so it is loaded and sent again). With ``acks`` (k, ms), ``WAIT k ms``
        goes behind it in the same write on the same connection, and the reply is
        ``(reply, how many replicas acknowledged)``."""
        script = self._scripts[name]
        self.session.watchdog.look_for_reset(always=True)  # (``Session.run``)
        if self._free > 0:
            self._free -= 1  # no await between the look and the take: nobody else runs here
        else:
            await self._gate_wait()
        try:
            failpoints = self.failpoints
            if failpoints is not None:
                return await failpoints.around_async(
                    name, keys, args, lambda: self._sent(name, script, keys, args, acks))
            if acks is None:
                return await self._script(script, keys, args)
            return await self._sent(name, script, keys, args, acks)
        except redis.exceptions.ResponseError as exc:
            raise located(name, exc) from None
        except redis.ConnectionError as exc:
            self.session.connection_failed(exc)  # its holds are suspended (``Watchdog.suspend``)
            raise
        finally:
            self._free += 1
            if self._gate_waiters:
                self._wake_next()

    async def _sent(self, name: str, script: Any, keys: Tuple[str, ...], args: Tuple[Any, ...],
                    acks: Optional[Tuple[int, int]]) -> Any:
        """``run``'s send (``acks``: with a WAIT behind it)."""
        if acks is None:
            return await self._script(script, keys, args)
        if name not in self._preloaded:  # see Executor.run: a NOSCRIPT would cost a timeout
            await self._bounded(self._client.script_load(script.script), self._io_bound)
            self._preloaded.add(name)
        return await self._script(script, keys, args, ("WAIT", *acks))

    async def _script(self, script: Any, keys: Tuple[str, ...], args: Tuple[Any, ...],
                      then: Optional[Tuple[Any, ...]] = None) -> Any:
        """Send one script once (a topology's port routes it); ``then``: a command sent
        behind it in the same write (``run``'s WAIT); once more after a demoted Sentinel
        master's READONLY (``Executor._send``)."""
        followed = False
        for _ in range(NOSCRIPT_TRIES):
            try:
                return await self._send("EVALSHA", script.sha, len(keys), *keys, *args, then=then)
            except redis.exceptions.NoScriptError:
                await self._send("SCRIPT", "LOAD", script.script)
            except redis.exceptions.ConnectionError as exc:
                if followed or not demoted(exc):
                    raise
                followed = True
                await self._forget_master()
        # a SCRIPT FLUSH came between every load and its run: the body cannot answer NOSCRIPT
        return await self._send("EVAL", script.script, len(keys), *keys, *args, then=then)

    async def _forget_master(self) -> None:
        """A Sentinel master was demoted: close the hot connections (they talk to it) and ask
        the sentinels now (a new master drops the pool's idle connections)."""
        hot, self._idle = self._idle, []
        for conn in hot:
            await conn.disconnect(nowait=True)
            await self._give(conn)
        await self._client.connection_pool.get_master_address()

    async def _gate_wait(self) -> None:
        """Wait for one of the ``SCRIPT_CONCURRENCY`` run slots (all are in flight), in turn."""
        loop = asyncio.get_running_loop()
        while self._free <= 0:
            fut = loop.create_future()
            self._gate_waiters.append(fut)
            try:
                await fut
            except BaseException:
                if fut.done() and not fut.cancelled() and self._free > 0:
                    self._wake_next()  # handed a slot it will not use: pass the turn on
                raise
        self._free -= 1

    def _wake_next(self) -> None:
        waiting = self._gate_waiters
        while waiting:
            fut = waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def _send(self, *args: Any, then: Optional[Tuple[Any, ...]] = None) -> Any:
        """Send one command on the direct path; never retried.

        The connections come from the client's pool, but those used are kept out of it between
        scripts (the *hot* ones, at most one per run slot) while scripts keep coming: redis-py's
        pool does a readiness check, a lock and its event hooks on every take and give, which
        cost about as much as the server's work on a small script. They go back to the pool
        after ``HOT_IDLE`` seconds unused, and each is checked (the server closed it: a
        restart) before use, as the pool checks its own."""
        packed = self._pack(args)
        if then is not None:
            packed = [packed[0] + self._pack(then)[0]]
        idle = self._idle
        conn = idle.pop() if idle else None
        try:
            if conn is None:
                conn = await self._bounded(self._take(), self._connect_bound)
            reader = getattr(conn, "_reader", None)
            if reader is None or reader.at_eof():
                # closed by the server (a restart) while idle: nothing was sent on it yet, so
                # connect afresh (redis-py 8's pool may hand a dead connection back as it is)
                await conn.disconnect(nowait=True)
                await self._bounded(conn.connect(), self._connect_bound)
        except BaseException:
            if conn is not None:
                await self._give(conn)
            raise
        try:
            reply = await self._exchange(conn, packed, then is not None)
        except redis.exceptions.ResponseError as exc:
            if protocol_error(exc):  # the server closes the connection after this answer
                await conn.disconnect(nowait=True)
                await self._give(conn)
            else:
                self._keep(conn)  # the whole reply was read: the connection is clean
            raise
        except BaseException:
            await self._give(conn)
            raise
        self._keep(conn)
        return reply

    async def _exchange(self, conn: Any, packed: Any, pair: bool = False) -> Any:
        """Send ``packed`` on ``conn`` and read the reply, bounded (see ``_bounded``); with
        ``pair``, the replies of two commands (``aread_pair``). Any failure but a Redis error
        reply leaves ``conn`` disconnected: a reply may be left half-read (a cancellation, a
        timeout), so it is never reused as it is."""
        inflight = self._inflight
        try:
            if self._io_bound is not None:
                # A read the client would let wait for ever: the overdue check bounds it
                # (one timer for every read in flight, not one per read).
                inflight[conn] = time.monotonic()
                if not self._checking:
                    self._checking = True
                    asyncio.get_running_loop().call_later(self._io_bound / 4, _overdue, weakref.ref(self))
            await awrite(conn, packed)
            if pair:
                return await aread_pair(conn)
            return await conn.read_response()
        except redis.exceptions.ResponseError:
            raise
        except BaseException as exc:
            overdue = self._io_bound is not None and conn not in inflight
            closed = isinstance(exc, (AttributeError, TypeError)) and not conn.is_connected
            await conn.disconnect(nowait=True)
            if overdue and isinstance(exc, redis.exceptions.ConnectionError):
                raise redis.exceptions.TimeoutError(
                    f"no answer from the server within {self._io_bound} s") from None
            if closed:
                # another task closed it under this one (redis-py's asyncio cluster refreshes
                # its slot map by disconnecting every node; the reconnect's handshake then
                # writes on a transport that is gone): the ConnectionError it is, as ``read``
                raise redis.exceptions.ConnectionError(
                    f"the connection was closed under the script: {exc!r}") from exc
            raise
        finally:
            inflight.pop(conn, None)

    def _check_overdue(self) -> None:
        """The overdue check: close the connection of every read that has waited longer than
        the bound (its ``_send`` then raises TimeoutError); look again while reads are in
        flight."""
        bound = self._io_bound
        assert bound is not None
        now = time.monotonic()
        for conn, since in list(self._inflight.items()):
            if now - since > bound:
                del self._inflight[conn]
                _spawn(conn.disconnect(nowait=True))
        loop = self.loop_ref()
        if self._inflight and loop is not None and not loop.is_closed():
            loop.call_later(bound / 4, _overdue, weakref.ref(self))
        else:
            self._checking = False

    def _keep(self, conn: Any) -> None:
        """After a script: keep ``conn`` out of the pool, for the next script."""
        loop = asyncio.get_running_loop()
        self._hot_used = loop.time()
        self._idle.append(conn)
        if not self._cooling:
            self._cooling = True
            loop.call_later(HOT_IDLE, _cool, weakref.ref(self))

    def _cool(self) -> None:
        """Give the hot connections back once they have been idle ``HOT_IDLE`` seconds."""
        loop = self.loop_ref()
        if loop is None or loop.is_closed():
            return
        idle = loop.time() - self._hot_used
        if self._idle and idle < HOT_IDLE:
            loop.call_later(HOT_IDLE - idle, _cool, weakref.ref(self))
            return
        self._cooling = False
        conns, self._idle = self._idle, []
        for conn in conns:
            _spawn(self._give(conn))

    async def read(self, *command: Any) -> Any:
        """One command that is safe to repeat, through the client (retries and all). A
        connection another task closed under it (redis-py's asyncio cluster nodes share
        theirs; a closed transport answers AttributeError or TypeError) is a ConnectionError."""
        try:
            return await self._bounded(self._client.execute_command(*command), self._io_bound)
        except (AttributeError, TypeError) as exc:
            raise redis.ConnectionError(f"the connection was closed under {command[0]}: "
                                        f"{exc!r}") from exc

    @staticmethod
    async def _bounded(coro: Any, bound: Optional[float]) -> Any:
        """Await ``coro``, at most ``bound`` seconds: ``DEFAULT_IO_TIMEOUT`` where the client
        sets no timeout of its own (then a server that stops answering would block it for
        ever), else None (no bound but the client's); a redis TimeoutError when it runs out."""
        if bound is None:
            return await coro
        try:
            if _timeout is None:  # Python < 3.11: a task per call, but bounded all the same
                return await asyncio.wait_for(coro, bound)
            async with _timeout(bound):  # no task: a timer that cancels this one
                return await coro
        except asyncio.TimeoutError:
            raise redis.exceptions.TimeoutError(
                f"no answer from the server within {bound} s") from None

    async def join(self, channel: str, bound: Optional[float], ident: Optional[str] = None) -> Waiter:
        return await self.dispatcher.join(channel, bound, ident)

    async def sleep(self, waiter: Waiter, head_bound: float, limit: Optional[float] = None) -> bool:
        return await self.dispatcher.sleep(waiter, head_bound, limit)

    async def leave(self, waiter: Waiter, acquired: bool) -> bool:
        return self.dispatcher.leave(waiter, acquired)

    async def slot(self, enter: bool) -> None:
        """Nothing to take: ``run``'s gate already bounds the connections of a woken crowd."""

    async def pick(self, channel: str) -> Any:
        return self.dispatcher.pick(channel)

    async def hand(self, waiter: Any, handed: Tuple[int, float]) -> bool:
        return self.dispatcher.hand(waiter, handed)

    @property
    def live(self) -> bool:
        return not self.session.closed


async def aread_pair(conn: Any) -> Tuple[Any, Any]:
    """``_redis.direct.read_pair`` on an asyncio connection: both replies read, the first's error
    raised after the second's is read, the second's error returned as its reply."""
    try:
        first: Any = await conn.read_response()
    except redis.exceptions.ResponseError as exc:
        first = exc
    try:
        second: Any = await conn.read_response()
    except redis.exceptions.ResponseError as exc:
        second = exc
    if isinstance(first, Exception):
        raise first
    return first, second


async def awrite(conn: Any, packed: List[bytes]) -> None:
    """Write ``packed`` on ``conn`` as redis-py's ``send_packed_command`` does, without its
    ``asyncio.wait_for``: with a socket timeout (redis-py 8's default), that runs each write in
    a task of its own, one more loop turn and a timer per script, where the port bounds the
    whole exchange already (``_check_overdue``). A connection with no stream writer (not
    connected, or not redis-py's kind) goes through ``send_packed_command``."""
    writer = getattr(conn, "_writer", None)
    if writer is None or not hasattr(writer, "writelines"):
        await conn.send_packed_command(packed)
        return
    if writer.transport.is_closing():
        raise redis.exceptions.ConnectionError("the connection was closed before the script was written")
    try:
        writer.writelines(packed)
        await writer.drain()
    except OSError as exc:
        raise redis.exceptions.ConnectionError(f"error while writing the script: {exc!r}") from exc


def _overdue(ref: weakref.ref[AsyncPort]) -> None:
    port = ref()
    if port is not None:
        port._check_overdue()


def _cool(ref: weakref.ref[AsyncPort]) -> None:
    """A timer's callback that does not keep its port alive."""
    port = ref()
    if port is not None:
        port._cool()
