"""Five independent masters for the Redlock tests (``client=[c1, ..., c5]``).

``Masters.start()`` starts five ``RedisServer``s (``distlock.testing.server``: ``redis-server`` from
PATH, or the binary ``$DISTLOCK_SERVER_BIN`` names, a ``valkey-server`` say) on free
127.0.0.1 ports, with no persistence, each in a temporary directory of its own and, on Linux,
under ``setpriv --pdeathsig KILL`` so that none outlives the test process however it ends.
``close()`` ends them and removes the directories; so does an ``atexit`` hook for masters still
open when the interpreter exits.

Faults, for the tests of what they do to holds (only processes this module started are ever
signalled):

- ``kill(i)`` SIGKILLs master ``i``; ``restart_empty(i)`` kills it and starts a new, empty one
  on the same port (what a crash of a server without persistence looks like);
- ``pause(i)`` / ``resume(i)`` send SIGSTOP / SIGCONT: a master that is slow, or cut off, and
  then back with everything it was sent meanwhile;
- ``heal()`` (the ``redlock`` fixture, after every test) resumes what was paused, starts what
  was killed, flushes every master and waits until each has been up for ``SETTLE`` seconds:
  a master that started less than one lease ago does not vote (docs/guides/redlock.rst), and
  the tests run with a lease of ``LEASE`` seconds.
"""

from __future__ import annotations

import atexit
import signal
import threading
import time
from typing import Any, List, Optional, Set

import redis

from .server import RedisServer

__all__ = ["Masters", "LEASE", "RENEW", "SETTLE", "COUNT"]

#: How many masters.
COUNT = 5
#: The watchdog lease and renew interval the Redlock tests run with (seconds): a restarted master
#: sits out one lease, so a short one keeps the tests short.
LEASE = 2.0
RENEW = 0.5
#: How long every master must have been up before a test starts (one lease, and the second
#: that ``uptime_in_seconds`` rounds away).
SETTLE = LEASE + 1.0

_OPEN: Set[Masters] = set()
_OPEN_LOCK = threading.Lock()


@atexit.register
def _close_all() -> None:
    with _OPEN_LOCK:
        left = list(_OPEN)
    for masters in left:
        masters.close()


class Masters:
    """Five independent redis-server processes (see the module's docstring)."""

    def __init__(self, servers: List[RedisServer]) -> None:
        self.servers = servers
        self.started = [time.monotonic()] * len(servers)
        self.killed: Set[int] = set()
        self.paused: Set[int] = set()
        self._admin: List[Optional[redis.Redis]] = [None] * len(servers)

    @classmethod
    def start(cls, count: int = COUNT) -> Masters:
        servers: List[RedisServer] = []
        try:
            for _ in range(count):
                servers.append(RedisServer(die_with_parent=True))
        except BaseException:
            for server in servers:
                server.stop()
            raise
        made = cls(servers)
        with _OPEN_LOCK:
            _OPEN.add(made)
        return made

    def __repr__(self) -> str:
        return f"<Masters ports={self.ports} killed={sorted(self.killed)} paused={sorted(self.paused)}>"

    @property
    def ports(self) -> List[int]:
        return [s.port for s in self.servers]

    @property
    def urls(self) -> List[str]:
        return [s.url for s in self.servers]

    def clients(self, **kwargs: Any) -> List[redis.Redis]:
        """A new ``redis.Redis`` per master (the caller closes them)."""
        return [redis.Redis.from_url(url, **kwargs) for url in self.urls]

    def admin(self, i: int) -> redis.Redis:
        """This module's own client of master ``i`` (for reading its keys)."""
        client = self._admin[i]
        if client is None:
            client = self._admin[i] = redis.Redis.from_url(self.urls[i], socket_timeout=5)
        return client

    def pid(self, i: int) -> int:
        proc = self.servers[i].proc
        assert proc is not None
        return proc.pid

    # --- faults -------------------------------------------------------------------------------

    def kill(self, i: int) -> None:
        self.resume(i)
        self.servers[i].kill()
        self.killed.add(i)

    def restart_empty(self, i: int) -> None:
        """Kill master ``i`` and start a new, empty one on its port."""
        self.resume(i)
        self.servers[i].restart()
        self.killed.discard(i)
        self.started[i] = time.monotonic()
        self._drop_admin(i)

    def pause(self, i: int) -> None:
        proc = self.servers[i].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGSTOP)
            self.paused.add(i)

    def resume(self, i: int) -> None:
        proc = self.servers[i].proc
        if i in self.paused and proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
        self.paused.discard(i)

    def heal(self, settle: float = SETTLE) -> None:
        """Every master up and empty, and up for ``settle`` seconds at least."""
        for i in list(self.paused):
            self.resume(i)
        for i in sorted(self.killed):
            self.servers[i].start()
            self.started[i] = time.monotonic()
            self._drop_admin(i)
        self.killed.clear()
        for i in range(len(self.servers)):
            self.admin(i).flushall()
        wait = max(self.started) + settle - time.monotonic()
        if wait > 0:
            time.sleep(wait)

    def _drop_admin(self, i: int) -> None:
        client, self._admin[i] = self._admin[i], None
        if client is not None:
            client.close()

    def close(self) -> None:
        with _OPEN_LOCK:
            _OPEN.discard(self)
        for i in range(len(self.servers)):
            self._drop_admin(i)
            self.resume(i)
        for server in self.servers:
            server.stop()
