"""The direct path: how one script (or a script and the WAIT behind it) goes out on a redis-py
connection and its reply comes back, with no retry (a state change is never sent twice:
docs/design.rst, principle 13), bounded where the connection has no socket timeout of its own
(principle 14). Also the helpers the executors and the asyncio ports share for redis-py's
pools: ``taker`` (how this redis-py version lends a connection), ``packer`` (RESP for the
argument types the scripts pass), and the watchdog's look at its idle connections
(``closed_idle``, ``idle_sockets``).

The connections a script used are kept out of redis-py's pool between scripts (``HotLender``),
as the asyncio port keeps its own, and go back after an idle second: the pool's take and give
(a lock, a readiness poll, its observability hooks) cost as much as the server's work on a
small script."""

from __future__ import annotations

import functools
import inspect
import os
import select
import socket
import time
from typing import Any, Callable, Dict, List, Tuple

import redis

from .clients import DEFAULT_IO_TIMEOUT


def closed_idle(pool: Any, seen: Any) -> List[Any]:
    """The sockets of ``pool``'s idle connections that the server closed and that ``seen`` (a
    WeakSet) does not hold yet. The caller acts on them (suspends belief) and only then puts
    them in ``seen``: another thread that looks meanwhile finds them too, rather than nothing.
    A non-blocking peek at the sockets redis-py keeps idle, so it never touches one a request
    is using; a socket distlock closed itself (no descriptor) is no reset."""
    found = []
    for sock in idle_sockets(pool, seen):
        try:
            if readable_now(sock) and sock.recv(1, socket.MSG_PEEK) == b"":
                found.append(sock)
        except (OSError, ValueError):
            if sock.fileno() != -1:
                found.append(sock)
    return found


def readable_now(sock: Any) -> bool:
    """Whether ``sock`` has something to read, or its peer closed it; never waits."""
    return bool(readable([sock], 0.0))


def readable(socks: List[Any], timeout: float) -> List[Any]:
    """Those of ``socks`` that have something to read, or whose peer closed them, waiting at
    most ``timeout`` seconds. ``poll`` where there is one: ``select`` takes no descriptor above
    1023."""
    if not hasattr(select, "poll"):
        return list(select.select(socks, [], [], timeout)[0])
    poller = select.poll()
    for sock in socks:
        poller.register(sock, select.POLLIN)
    fds = {fd for fd, _ in poller.poll(timeout * 1000.0)}
    return [sock for sock in socks if sock.fileno() in fds]


def idle_sockets(pool: Any, seen: Any) -> List[Any]:
    """The sockets of ``pool``'s idle connections that ``seen`` does not hold (``closed_idle``'s
    candidates): what the watchdog thread waits on, so that a server that closes one wakes it
    at once (``_session.wakeup``)."""
    found = []
    for conn in list(getattr(pool, "_available_connections", ()) or ()):
        sock = getattr(conn, "_sock", None)
        if sock is not None and sock not in seen:
            found.append(sock)
    return found


def unbounded(client: Any) -> bool:
    """True for a client on redis-py's pool (or a single connection) whose connections have no
    socket timeout: ``read`` then takes the bounded direct path. Not for a subclass that
    overrides ``execute_command``: distlock's reads go through the user's override."""
    if _lender(client) is None or type(client).execute_command is not redis.Redis.execute_command:
        return False
    single = getattr(client, "connection", None)
    if single is not None:
        return getattr(single, "socket_timeout", 0) is None
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    return "socket_timeout" not in kwargs or kwargs["socket_timeout"] is None


def disconnect_quietly(client: Any) -> None:
    """Close every connection of ``client``'s pool, whatever state it is in."""
    try:
        client.connection_pool.disconnect()
    except Exception:  # noqa: BLE001 - it is being thrown away
        pass


#: How many used connections a ``HotLender`` keeps out of its pool (the executor's run slots).
HOT_KEPT = 4
#: ... and at most one in this many of the pool's ``max_connections`` (a user's limit).
HOT_SHARE = 25
#: How long a kept connection stays out of the pool unused (seconds), as the asyncio port's.
HOT_IDLE = 1.0
#: How long they stay out at most, used or not (seconds): then they pass through the pool's give
#: and take, where redis-py re-authenticates (a streaming credential provider) and reconnects
#: what it was told to.
HOT_REFRESH = 10.0


class HotLender:
    """redis-py's pool, lending as it does, but the connections given back are kept out of it
    (at most ``limit``), for the next command: the pool's take and give are skipped. A kept
    connection is looked at before it is lent again, as the pool looks at its own: one the
    server closed (a restart, an idle timeout) is connected afresh, before anything is sent on
    it; in a forked child the parent's are left alone. They go back to the pool once unused for
    ``HOT_IDLE`` seconds, or when the session's watchdog thread goes idle, whichever comes
    first, and every ``HOT_REFRESH`` seconds anyway (``due``, ``cool``; ``cool_with`` says who
    asks), and all of them on ``close``.

    Only for a pool of redis-py's own class (``lender``): a kept connection counts as in use
    there, so the limit is a small share of the pool's, and the give-back hands them to the
    process' own commands while distlock is not using them."""

    __slots__ = ("_pool", "_take", "_give", "_kept", "_pid", "closed", "limit", "used_at",
                 "_wake", "_cooling", "_since")

    def __init__(self, pool: Any, limit: int = HOT_KEPT) -> None:
        self._pool = pool
        self._take = taker(pool)
        self._give = pool.release
        self._kept: List[Any] = []
        self._pid = os.getpid()
        self.closed = False
        self.limit = limit
        #: when a connection was last kept (time.monotonic())
        self.used_at = 0.0
        self._wake: Any = None
        #: connections are kept and ``_wake`` was called: a ``cool`` is to come
        self._cooling = False
        #: when they were last all given back
        self._since = time.monotonic()

    def cool_with(self, wake: Callable[[], object]) -> None:
        """``wake()`` makes sure that ``cool`` is called from now on (the session's watchdog
        thread: each time it looks, and as it exits); without it, nothing is kept."""
        self._wake = wake

    def get_connection(self) -> Any:
        kept = self._kept
        try:
            conn = kept.pop()  # atomic under the GIL: threads share the list
        except IndexError:
            return self._take()
        if self._pid != os.getpid():  # a forked child: those are the parent's sockets
            self._pid, self._kept = os.getpid(), []
            return self._take()
        sock = conn._sock
        try:
            dead = sock is None or readable_now(sock)
        except (OSError, ValueError):  # closed under it by another thread
            dead = True
        if dead:
            try:
                conn.disconnect()  # closed by the server while kept, or disconnected: afresh
                conn.connect()
            except BaseException:
                self._give(conn)
                raise
        return conn

    def release(self, conn: Any) -> None:
        # not one that is closed, nor one whose socket is not its own (a caching proxy's)
        if (self.closed or self._wake is None or getattr(conn, "_sock", None) is None
                or len(self._kept) >= self.limit):
            self._give(conn)
            return
        self.used_at = time.monotonic()
        self._kept.append(conn)
        if self.closed:  # closed meanwhile: its give-back may have missed this one
            self._drain()
        elif not self._cooling:
            self._cooling = True  # two threads may both wake it: harmless
            try:
                self._wake()
            except Exception:  # noqa: BLE001 - no thread (can't start one): keep nothing
                self._cooling = False
                self._drain()

    def due(self, force: bool = False) -> bool:
        """Whether ``cool`` would give any back: some are kept and were unused for
        ``HOT_IDLE``, or have been out for ``HOT_REFRESH``, or ``force``. No I/O, no lock:
        what the watchdog thread asks (it hands the give-back, which takes the pool's lock and
        may re-authenticate, to another thread)."""
        if not self._kept:
            self._cooling = False
            if not self._kept:  # a keep before the reset saw True and woke nobody: look again
                return False
        if force:
            return True
        now = time.monotonic()
        return now - self.used_at >= HOT_IDLE or now - self._since >= HOT_REFRESH

    def cool(self, force: bool = False) -> None:
        """Give the kept connections back if ``due``."""
        if not self.due(force):
            return
        # False before the drain: a connection kept after it wakes the watchdog afresh
        self._cooling = False
        self._drain()

    def _drain(self) -> None:
        """Give back every kept connection, one pop at a time: another thread may keep or take
        one meanwhile (a swap of the list could lose the one it kept)."""
        kept = self._kept
        self._since = time.monotonic()
        while True:
            try:
                conn = kept.pop()
            except IndexError:
                return
            if self._pid == os.getpid():
                self._give(conn)

    def get_encoder(self) -> Any:
        return self._pool.get_encoder()

    def close(self) -> None:
        """Give every kept connection back to the pool (the session is retired)."""
        self.closed = True
        self._drain()


def lender(client: Any, own_pool: bool) -> Any:
    """Where the direct path takes its connections for ``client``: a ``HotLender`` over a pool
    of redis-py's own class, the session's own (``own_pool``) or a user's with room for one
    kept connection (``HOT_SHARE``); else the pool itself (a Sentinel's, a blocking one), the
    client's single connection lent out as a pool lends one, or None (no network: fakeredis)."""
    found = _lender(client)
    if type(found) is redis.ConnectionPool:
        limit = HOT_KEPT if own_pool else min(HOT_KEPT, found.max_connections // HOT_SHARE)
        if limit > 0:
            return HotLender(found, limit)
    return found


def sender(lent: Any, via: Any) -> Callable[..., Any]:
    """A function that sends one command and returns its reply, never retrying. ``lent`` is
    what ``lender`` gave for the client (``pair_sender`` shares it).

    For a client on a redis-py connection pool (or a single connection), whatever its class:
    it takes a connection (the client's single one under its lock, or one from its pool),
    sends, reads the raw reply and gives the connection back. That also skips
    ``execute_command``'s per-call wrapper (retry closure, telemetry hooks), which on a slow
    machine costs as much as the server's work on a small script. A connection that went stale
    while idle (a server restart) is still replaced when it is taken from the pool, as redis-py
    does. Anything else (fakeredis): ``via.execute_command``, looked up on every call.

    Keeps no reference to the client itself: ``via`` may be a weak proxy of it, so that a
    session does not keep its user's client alive.
    """
    if lent is None:
        def through(*args: Any) -> Any:
            return via.execute_command(*args)
        return through
    return _pooled(lent)


def _lender(client: Any) -> Any:
    """Where the direct path takes its connections for ``client``: its pool, its single
    connection lent out as a pool lends one, or None (no network: fakeredis)."""
    single = getattr(client, "connection", None)
    pool = getattr(client, "connection_pool", None)
    if not isinstance(client, redis.Redis) or type(client).__module__.startswith("fakeredis"):
        return None
    if single is not None:
        return _OneConnection(single, client.single_connection_lock)
    return pool if isinstance(pool, redis.ConnectionPool) else None


class _OneConnection:
    """A single-connection client's connection, lent out like a pool lends one: under the
    client's own lock, so that the pooled path below drives it too."""

    def __init__(self, conn: Any, lock: Any) -> None:
        self._conn = conn
        self._lock = lock

    def get_connection(self) -> Any:
        self._lock.acquire()
        return self._conn

    def release(self, conn: Any) -> None:
        self._lock.release()

    def get_encoder(self) -> Any:
        return self._conn.encoder


def _takes_no_command_name(pool: Any) -> bool:
    """redis-py 5.3+ takes ``get_connection()`` without arguments (and warns when given one);
    older versions require the command name."""
    try:
        params = inspect.signature(pool.get_connection).parameters
    except (TypeError, ValueError):
        return False
    first = next(iter(params.values()), None)
    return first is None or first.default is not inspect.Parameter.empty


def taker(pool: Any) -> Callable[[], Any]:
    """``pool.get_connection`` as this redis-py version wants it called (a coroutine function
    for an asyncio pool)."""
    if _takes_no_command_name(pool):
        return pool.get_connection  # type: ignore[no-any-return]
    return functools.partial(pool.get_connection, "EVALSHA")


#: How many packed arguments ``packer`` keeps (the names, keys, owners and SHAs a process
#: sends again and again); past that it starts afresh. And the longest it keeps (bytes).
PACK_CACHE = 1024
PACK_CACHE_LONGEST = 256


def packer(encoder: Any) -> Callable[[Tuple[Any, ...]], List[bytes]]:
    """A function that packs one command for ``encoder``'s connections (blocking or asyncio).

    A str argument's RESP is kept for the next command (up to ``PACK_CACHE`` of them): a lock's
    script sends the same SHA, keys, owner and lease each time, and encoding them afresh cost
    a few µs per script, as much as the rest of the call."""
    encoding, errors, encode = encoder.encoding, encoder.encoding_errors, encoder.encode
    cache: Dict[str, bytes] = {}

    def pack(args: Tuple[Any, ...]) -> List[bytes]:
        # RESP, as redis-py's own packer writes it, for the argument types the scripts pass
        # (str, int, bytes); anything else goes through the client's encoder (which also
        # raises redis-py's DataError for what it cannot send).
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            kind = type(arg)
            if kind is str:
                packed = cache.get(arg)
                if packed is None:
                    data = arg.encode(encoding, errors)
                    packed = b"$%d\r\n%s\r\n" % (len(data), data)
                    if len(data) <= PACK_CACHE_LONGEST:
                        if len(cache) >= PACK_CACHE:
                            cache.clear()  # (another thread's lookup meanwhile just misses)
                        cache[arg] = packed
                parts.append(packed)
                continue
            if kind is int:
                data = b"%d" % arg
            elif kind is bytes:
                data = arg
            else:
                data = encode(arg)
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        return [b"".join(parts)]

    return pack


def _reads_with_timeout() -> bool:
    """redis-py's ``Connection.read_response`` takes a ``timeout`` (8.0 does; 7.0 does not)."""
    try:
        return "timeout" in inspect.signature(redis.Connection.read_response).parameters
    except (TypeError, ValueError):
        return False


_READ_TIMEOUT = _reads_with_timeout()


def read_bounded(conn: Any) -> Any:
    """``conn.read_response()``, bounded by ``DEFAULT_IO_TIMEOUT`` where the connection has no
    socket timeout of its own (a user's client made with ``socket_timeout=None``): every round
    trip distlock makes is bounded (docs/design.rst, principle 14). A read that times out
    raises redis-py's TimeoutError and drops the connection, as redis-py's own timeout does."""
    if getattr(conn, "socket_timeout", 0) is not None:
        return conn.read_response()
    if _READ_TIMEOUT:
        return conn.read_response(timeout=DEFAULT_IO_TIMEOUT)
    # older redis-py (7.0, the newest for Python 3.9): the socket's own timeout, for this read
    sock: Any = getattr(conn, "_sock", None)
    if sock is None:
        return conn.read_response()
    sock.settimeout(DEFAULT_IO_TIMEOUT)
    try:
        return conn.read_response()
    finally:
        if conn._sock is sock:  # still connected: the client's own again
            sock.settimeout(conn.socket_timeout)


def protocol_error(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis' "Protocol error: ..." answer, after which the server closes
    the connection (a command too long for an unauthenticated client, among others)."""
    return str(exc).startswith("Protocol error")


def _pooled(pool: Any) -> Callable[..., Any]:
    take = taker(pool)
    give_back = pool.release
    pack = packer(pool.get_encoder())

    def execute(*args: Any) -> Any:
        packed = pack(args)
        conn = take()
        try:
            conn.send_packed_command(packed)
            return read_bounded(conn)
        except redis.exceptions.ResponseError as exc:
            if protocol_error(exc):
                conn.disconnect()  # the server closes it after such an answer
            raise  # else the whole reply was read: the connection is clean
        except BaseException:
            conn.disconnect()  # a reply may be left half-read on the socket
            raise
        finally:
            give_back(conn)

    return execute


def pair_sender(lent: Any, via: Any) -> Callable[[Tuple[Any, ...], Tuple[Any, ...]], Any]:
    """``sender``'s twin for a command with a second one behind it (a script and its WAIT):
    both packed in one write on one connection, never retried; returns both replies, or
    raises the first one's error once the second reply is read too. fakeredis (no network):
    a pipeline of the two through ``via``."""
    if lent is None:
        def through(command: Tuple[Any, ...], then: Tuple[Any, ...]) -> Any:
            pipe = via.pipeline(transaction=False)
            pipe.execute_command(*command)
            pipe.execute_command(*then)
            first, second = pipe.execute(raise_on_error=False)
            if isinstance(first, Exception):
                raise first
            return first, second
        return through
    return _pooled_pair(lent)


def read_pair(conn: Any) -> Tuple[Any, Any]:
    """Read the replies of a command and of the one sent behind it on ``conn`` (a blocking
    connection): the second is read even when the first is an error, which is then raised,
    so that the connection is left clean; the second's error is returned as its reply."""
    try:
        first: Any = read_bounded(conn)
    except redis.exceptions.ResponseError as exc:
        first = exc
    try:
        second: Any = read_bounded(conn)
    except redis.exceptions.ResponseError as exc:
        second = exc
    if isinstance(first, Exception):
        raise first
    return first, second


def _pooled_pair(pool: Any) -> Callable[[Tuple[Any, ...], Tuple[Any, ...]], Any]:
    take = taker(pool)
    give_back = pool.release
    pack = packer(pool.get_encoder())

    def execute(command: Tuple[Any, ...], then: Tuple[Any, ...]) -> Any:
        packed = [pack(command)[0] + pack(then)[0]]
        conn = take()
        try:
            conn.send_packed_command(packed)
            return read_pair(conn)
        except redis.exceptions.ResponseError as exc:
            if protocol_error(exc):
                conn.disconnect()  # the server closes it after such an answer
            raise  # else both replies were read: the connection is clean
        except BaseException:
            conn.disconnect()  # a reply may be left half-read on the socket
            raise
        finally:
            give_back(conn)

    return execute
