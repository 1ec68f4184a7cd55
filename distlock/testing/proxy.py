"""A fault proxy: a TCP proxy on loopback, between clients and one server, whose faults a test
switches on and off while the clients run.

Each direction (``"requests"``, client to server, and ``"replies"``, server to client) is in one
of three modes at a time:

- it passes (the default);
- it delays every chunk by N ms (``delay``);
- it is a blackhole (``blackhole``): connections are still accepted and kept open, and every
  byte in that direction is read and dropped. ``drop_replies()`` is a blackhole of the replies
  alone: requests reach the server and run there, and their answers are lost.

``reset()`` closes every open connection with an RST, as a crashed peer or a middlebox does.
``heal()`` puts both directions back to passing, and resets the connections that lost bytes: a
Redis connection whose request/reply stream lost part of itself is out of step for good, and a
client must not read one request's answer as another's.

Pub/sub connections (those whose client sent SUBSCRIBE) can be faulted on their own:
``drop_pubsub()`` drops their traffic both ways, ``reset_pubsub()`` resets them.

One thread moves every byte; the methods above hand their change to it and return once it
holds. Use it as a context manager, or ``close()`` it::

    with RedisServer() as server, FaultProxy("127.0.0.1", server.port) as proxy:
        lock = DistLock("orders:42", client=redis.Redis.from_url(proxy.url))
        proxy.blackhole()
        ...
        proxy.heal()
"""

from __future__ import annotations

import collections
import contextlib
import math
import queue
import selectors
import socket
import struct
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

__all__ = ["FaultProxy", "DIRECTIONS"]

#: The two directions of a proxied connection, as the fault methods name them.
DIRECTIONS = ("requests", "replies")

_PIPES = {"requests": "c2s", "replies": "s2c"}


def _pipes(direction: str) -> Tuple[str, ...]:
    if not isinstance(direction, str):
        raise TypeError(f"direction must be 'requests', 'replies' or 'both', "
                        f"not {type(direction).__name__}")
    if direction == "both":
        return ("c2s", "s2c")
    if direction not in _PIPES:
        raise ValueError(f"direction must be 'requests', 'replies' or 'both', not {direction!r}")
    return (_PIPES[direction],)


class _Pipe:
    """One direction of one proxied connection: chunks wait for their due time, then go out."""

    __slots__ = ("src", "dst", "due", "out")

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src = src
        self.dst = dst
        self.due: Deque[Tuple[float, bytes]] = collections.deque()
        self.out = bytearray()


class _Conn:
    __slots__ = ("client", "upstream", "c2s", "s2c", "pubsub", "tainted", "closed", "ending")

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.c2s = _Pipe(client, upstream)
        self.s2c = _Pipe(upstream, client)
        self.pubsub = False  # SUBSCRIBE seen in the client->server stream
        self.tainted = False  # some of its traffic was dropped: its protocol stream is broken
        self.closed = False
        self.ending = False  # one side ended: close once what is still due has gone out

    def pending(self) -> bool:
        return bool(self.c2s.due or self.c2s.out or self.s2c.due or self.s2c.out)


class FaultProxy:
    """A loopback TCP proxy to the server at ``host:port``, with faults switched at run time.

    It listens on 127.0.0.1, on a free port (``port``); ``url`` is a ``redis://`` URL for it.
    """

    def __init__(self, host: str, port: int) -> None:
        if not isinstance(host, str):
            raise TypeError(f"host must be a str, not {type(host).__name__}")
        if isinstance(port, bool) or not isinstance(port, int):
            raise TypeError(f"port must be an int, not {type(port).__name__}")
        if not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535, not {port}")
        self.target = (host, port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.listener.setblocking(False)
        #: the port the proxy listens on (on 127.0.0.1)
        self.port: int = self.listener.getsockname()[1]
        #: how many connections it has accepted
        self.accepted = 0
        self._delay: Dict[str, float] = {"c2s": 0.0, "s2c": 0.0}
        self._black: Dict[str, bool] = {"c2s": False, "s2c": False}
        self._drop_pubsub = False
        self._conns: List[_Conn] = []
        self._calls: queue.Queue[Tuple[Callable[[], None], threading.Event, List[BaseException]]] = \
            queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stopping = False
        self._closed = False
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name="distlock-faultproxy",
                                        daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return (f"<FaultProxy 127.0.0.1:{self.port} -> {self.target[0]}:{self.target[1]} "
                f"requests={self.mode('requests')} replies={self.mode('replies')}>")

    # --- where to connect ----------------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``: the proxy's address, for ``client_from_url`` or
        ``redis.Redis.from_url``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: Any) -> Any:
        """A ``redis.Redis`` that talks to the server through this proxy."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    # --- the faults ----------------------------------------------------------------------------

    def mode(self, direction: str) -> str:
        """``"pass"``, ``"delay N ms"`` or ``"blackhole"``: what ``direction`` does now."""
        pipes = _pipes(direction)
        if len(pipes) != 1:
            raise ValueError("mode() tells one direction: 'requests' or 'replies'")
        pipe = pipes[0]
        if self._black[pipe]:
            return "blackhole"
        if self._delay[pipe]:
            return f"delay {self._delay[pipe] * 1000:g} ms"
        return "pass"

    def pass_through(self, direction: str = "both") -> None:
        """Let ``direction`` pass again, undelayed (connections that lost bytes stay open;
        ``heal()`` also resets them)."""
        pipes = _pipes(direction)

        def do() -> None:
            for pipe in pipes:
                self._black[pipe] = False
                self._delay[pipe] = 0.0
        self._call(do)

    def delay(self, ms: float, direction: str = "both") -> None:
        """Deliver every chunk in ``direction`` ``ms`` milliseconds after it arrived (0: none).
        A blackhole in that direction ends."""
        if isinstance(ms, bool) or not isinstance(ms, (int, float)):
            raise TypeError(f"ms must be a number, not {type(ms).__name__}")
        if not math.isfinite(ms) or ms < 0:
            raise ValueError(f"ms must be a finite number >= 0, not {ms!r}")
        pipes = _pipes(direction)

        def do() -> None:
            for pipe in pipes:
                self._black[pipe] = False
                self._delay[pipe] = ms / 1000.0
        self._call(do)

    def blackhole(self, direction: str = "both") -> None:
        """Drop every byte in ``direction``, keeping every connection open and still accepting
        new ones: a partition (``"both"``), or lost answers (``"replies"``)."""
        pipes = _pipes(direction)

        def do() -> None:
            for pipe in pipes:
                self._black[pipe] = True
        self._call(do)

    def drop_replies(self) -> None:
        """Requests reach the server and run; their replies are lost."""
        self.blackhole("replies")

    def drop_pubsub(self, on: bool = True) -> None:
        """Drop the traffic of pub/sub connections both ways (or stop dropping it)."""
        self._call(lambda: setattr(self, "_drop_pubsub", bool(on)))

    def reset(self) -> int:
        """Close every open proxied connection with an RST; return how many."""
        return self._reset(lambda conn: True)

    def reset_pubsub(self) -> int:
        """Close every open pub/sub connection with an RST; return how many."""
        return self._reset(lambda conn: conn.pubsub)

    def heal(self, reset_broken: bool = True) -> None:
        """Both directions pass again, undelayed, and pub/sub traffic flows; with
        ``reset_broken`` (the default) the connections that lost bytes are reset, as after a
        long partition."""
        def do() -> None:
            for pipe in ("c2s", "s2c"):
                self._black[pipe] = False
                self._delay[pipe] = 0.0
            self._drop_pubsub = False
            if reset_broken:
                for conn in list(self._conns):
                    if conn.tainted:
                        self._close(conn, rst=True)
        self._call(do)

    def connections(self, pubsub: Optional[bool] = None) -> int:
        """How many proxied connections are open (only pub/sub ones, or only others)."""
        result: List[int] = []
        self._call(lambda: result.append(sum(
            1 for c in self._conns if not c.closed and (pubsub is None or c.pubsub == pubsub))))
        return result[0]

    # --- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close every connection and the listener, and end the proxy's thread. Idempotent."""
        if self._closed:
            return
        self._closed = True

        def do() -> None:
            self._stopping = True
            for conn in list(self._conns):
                self._close(conn, rst=False)
        with contextlib.suppress(RuntimeError):
            self._call(do)
        self._stopping = True
        self._thread.join(timeout=5.0)
        for conn in list(self._conns):  # the thread ended on its own: close what it left
            self._close(conn, rst=False)
        self._sel.close()
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the loop ------------------------------------------------------------------------------

    def _reset(self, which: Callable[[_Conn], bool]) -> int:
        count: List[int] = [0]

        def do() -> None:
            for conn in list(self._conns):
                if not conn.closed and which(conn):
                    count[0] += 1
                    self._close(conn, rst=True)
        self._call(do)
        return count[0]

    def _call(self, fn: Callable[[], None], timeout: float = 5.0) -> None:
        """Run ``fn`` in the proxy thread (which owns every socket) and wait for it."""
        if self._stopping or not self._thread.is_alive():
            raise RuntimeError("the fault proxy is closed")
        done = threading.Event()
        failed: List[BaseException] = []
        self._calls.put((fn, done, failed))
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if not done.wait(timeout):
            raise RuntimeError(f"the fault proxy's thread did not answer within {timeout:g} s")
        if failed:
            raise failed[0]

    def _loop(self) -> None:
        try:
            self._serve()
        finally:  # however it ends, no proxied socket stays open behind it
            for conn in list(self._conns):
                self._close(conn, rst=False)

    def _serve(self) -> None:
        while not self._stopping:
            timeout = 0.2
            now = time.monotonic()
            for conn in self._conns:
                for pipe in (conn.c2s, conn.s2c):
                    if pipe.due:
                        timeout = min(timeout, max(0.0, pipe.due[0][0] - now))
            for key, _events in self._sel.select(timeout):
                tag = key.data
                if tag == "accept":
                    self._accept()
                elif tag == "wake":
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)
                else:
                    conn, pipe_name = tag
                    if not conn.closed:
                        self._on_readable(conn, pipe_name)
            self._run_calls()
            self._flush_all()
        self._run_calls()

    def _run_calls(self) -> None:
        for _ in range(1000):
            try:
                fn, done, failed = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - the caller raises it, in its thread
                failed.append(exc)
            finally:
                done.set()

    def _accept(self) -> None:
        for _ in range(64):
            try:
                sock, _addr = self.listener.accept()
            except OSError:  # none waiting, or out of descriptors: the next round tries again
                return
            try:
                upstream = socket.create_connection(self.target, timeout=2.0)
            except OSError:
                sock.close()
                continue
            for s in (sock, upstream):
                s.setblocking(False)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock, upstream)
            self._conns.append(conn)
            self.accepted += 1
            self._sel.register(sock, selectors.EVENT_READ, (conn, "c2s"))
            self._sel.register(upstream, selectors.EVENT_READ, (conn, "s2c"))

    def _on_readable(self, conn: _Conn, pipe_name: str) -> None:
        pipe = conn.c2s if pipe_name == "c2s" else conn.s2c
        try:
            data = pipe.src.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn, rst=True)
            return
        if not data:
            if conn.pending():  # deliver what is still due (a delayed reply), then close
                conn.ending = True
                for sock in (conn.client, conn.upstream):
                    with contextlib.suppress(KeyError, ValueError):
                        self._sel.unregister(sock)
            else:
                self._close(conn, rst=False)
            return
        if pipe_name == "c2s" and b"SUBSCRIBE" in data.upper():
            conn.pubsub = True
        if self._black[pipe_name] or (self._drop_pubsub and conn.pubsub):
            conn.tainted = True
            return
        pipe.due.append((time.monotonic() + self._delay[pipe_name], data))

    def _flush_all(self) -> None:
        now = time.monotonic()
        for conn in list(self._conns):
            if conn.closed:
                continue
            for pipe in (conn.c2s, conn.s2c):
                while pipe.due and pipe.due[0][0] <= now:
                    pipe.out += pipe.due.popleft()[1]
                if pipe.out:
                    try:
                        sent = pipe.dst.send(pipe.out)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:
                        self._close(conn, rst=True)
                        break
                    del pipe.out[:sent]
            if conn.ending and not conn.closed and not conn.pending():
                self._close(conn, rst=False)

    def _close(self, conn: _Conn, rst: bool) -> None:
        if conn.closed:
            return
        conn.closed = True
        for sock in (conn.client, conn.upstream):
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(sock)
            if rst:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.close()
        with contextlib.suppress(ValueError):
            self._conns.remove(conn)
