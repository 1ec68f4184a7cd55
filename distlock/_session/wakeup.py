"""``Wakeup``: the watchdog thread's ``threading.Event``, whose wait also ends when a socket turns
readable.

The watchdog thread keeps time and does no I/O (docs/design.rst, principle 14), but it must
stop believing the session's holds as soon as their server closes the watchdog's idle
connection: a restart without persistence, or a failover, ends every hold on that server, and
the server (or its successor) may grant them again a few milliseconds later. So the thread waits
in ``select`` (or ``poll``) on that connection's socket and on one end of a socket pair that ``set`` writes
to: the kernel wakes it on the server's FIN, and ``Watchdog`` then peeks (still no I/O: a
non-blocking ``MSG_PEEK``) and suspends belief.

The pair is made by the waiting thread on its first wait and closed with ``close`` when the
thread ends; ``set`` from any thread before that only raises the flag, which the next wait sees
first. ``set``, ``clear`` and ``wait`` keep ``threading.Event``'s meaning: a ``set`` between
a wait's return and the ``clear`` after it is lost, so the waiting thread looks at its state
after each ``clear``, as the watchdog does.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any, List, Optional, Sequence, Tuple

__all__ = ["Wakeup"]


class Wakeup:
    """``set``/``clear``/``wait`` for one waiting thread (see the module's docstring)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._flag = False
        self._pair: Optional[Tuple[socket.socket, socket.socket]] = None

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        with self._mutex:
            if self._flag:
                return
            self._flag = True
            pair = self._pair
            if pair is not None:
                try:
                    pair[1].send(b"\0")
                except OSError:
                    pass  # full (a byte is already there) or closed: the wait ends anyway

    def clear(self) -> None:
        with self._mutex:
            self._flag = False
            pair = self._pair
            if pair is not None:
                try:
                    while pair[0].recv(64):
                        pass
                except OSError:
                    pass  # drained (non-blocking: BlockingIOError)

    def wait(self, timeout: float, sockets: Sequence[Any] = ()) -> bool:
        """Wait until ``set``, until one of ``sockets`` is readable, or for ``timeout`` seconds.
        True when a socket ended the wait. A socket that cannot be waited on (closed by
        another thread meanwhile) makes it a plain wait."""
        with self._mutex:
            if self._flag:
                return False
            pair = self._pair
            if pair is None:
                pair = self._pair = socket.socketpair()
                for end in pair:
                    end.setblocking(False)
        try:
            readable = _readable([pair[0], *sockets], max(0.0, timeout))
        except (OSError, ValueError):  # a socket closed under us: wait without them
            if sockets:
                return self.wait(timeout, ())
            time.sleep(min(max(0.0, timeout), 0.01))  # never a hot loop
            return False
        return any(s is not pair[0] for s in readable)

    def close(self) -> None:
        """Close the pair (the waiting thread ends); the next wait makes a new one."""
        with self._mutex:
            pair, self._pair = self._pair, None
        if pair is not None:
            for end in pair:
                end.close()


def _readable(sockets: Sequence[Any], timeout: float) -> List[Any]:
    """Those of ``sockets`` readable within ``timeout`` seconds (or closed by their peer); a
    socket closed under the wait (no descriptor) is left out. ``select`` while every
    descriptor is below 1024: it waits to the microsecond, and the thread's wait ends at a
    hold's deadline, where ``on_lost`` is due. Above, where ``select`` takes none, ``poll``,
    which counts whole milliseconds: it waits the milliseconds, then sleeps what is left."""
    live = [sock for sock in sockets if sock.fileno() >= 0]
    if all(sock.fileno() < 1024 for sock in live) or not hasattr(select, "poll"):
        return list(select.select(live, [], [], timeout)[0])
    poller = select.poll()
    by_fd = {}
    for sock in live:
        poller.register(sock.fileno(), select.POLLIN)
        by_fd[sock.fileno()] = sock
    until = time.monotonic() + timeout
    found = [by_fd[fd] for fd, _ in poller.poll(int(timeout * 1000))]
    left = until - time.monotonic()
    if not found and left > 0:
        time.sleep(left)
    return found
