"""A real master with two replicas for the tests: three server processes on free 127.0.0.1 ports.

``Replication.start()`` starts three server processes at once (``redis-server`` from PATH, or
the binary that ``$DISTLOCK_SERVER_BIN`` names: a ``valkey-server``, say) with no persistence,
each in a temporary directory of its own, makes the second and third replicas of the first
(``REPLICAOF``), and waits until both are linked: each replica says
``master_link_status:up`` and the master lists both as ``online`` (``INFO replication``).
``close()`` ends every process and removes the directories; so does an ``atexit`` hook for a
set still open when the interpreter exits, and on Linux each process is started under
``setpriv --pdeathsig KILL``, so that it dies with the test process even when that is killed.

Faults, for the tests of what they do to grants:

- ``stop(i)`` / ``resume(i)``: SIGSTOP / SIGCONT a node (a replica that stops acknowledging,
  whose link the master still counts);
- ``cut(i)``: replica ``i`` stops following the master, keeping the data it has (writes from
  then on never reach it, deterministically: a stopped replica would still read what the
  kernel buffered for it once resumed);
- ``kill(i)``: SIGKILL a node;
- ``promote(i)``: ``REPLICAOF NO ONE`` on a replica (a failover, as Sentinel would do it);
- ``heal()`` (the ``replication`` fixture, after each test): resumes what was stopped,
  restarts what was killed (empty), makes node 0 the master again and the others its replicas,
  flushes it and waits until both replicas are linked again.

Only processes this module started are ever signalled.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, List, Optional, Set

import redis

from distlock.testing.server import free_port, redis_server_binary

__all__ = ["Replication", "HOST"]

HOST = "127.0.0.1"
#: Polling interval of every wait here.
POLL = 0.02


class _Node:
    """One server process: its port, directory and process."""

    def __init__(self, binary: str, port: int) -> None:
        self.binary = binary
        self.port = port
        self.dir = tempfile.mkdtemp(prefix=f"distlock-repl-{port}-")
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.stopped = False

    def args(self) -> List[str]:
        return [
            self.binary, "--port", str(self.port), "--bind", HOST,
            "--save", "", "--appendonly", "no", "--dir", self.dir,
            # a replica's sync starts at once, diskless, and the master pings every second
            "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
            "--repl-ping-replica-period", "1",
            "--daemonize", "no", "--protected-mode", "yes",
            "--loglevel", "notice", "--logfile", os.path.join(self.dir, "server.log"),
        ]

    def spawn(self) -> None:
        """Start the process (not waiting for it); under ``setpriv --pdeathsig KILL`` from
        the main thread on Linux, as distlock/testing/cluster.py does."""
        args = self.args()
        setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
        if setpriv and threading.current_thread() is threading.main_thread():
            args = [setpriv, "--pdeathsig", "KILL", "--", *args]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, cwd=self.dir)
        self.stopped = False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.stopped:
            self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)
        self.stopped = False

    def stop(self) -> None:
        """End the process for good and remove the directory."""
        try:
            if self.proc is not None and self.proc.poll() is None:
                if self.stopped:
                    self.proc.send_signal(signal.SIGCONT)
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, chars: int = 1500) -> str:
        try:
            with open(os.path.join(self.dir, "server.log"), encoding="utf-8", errors="replace") as fh:
                return fh.read()[-chars:]
        except OSError:
            return ""


_OPEN: Set[Replication] = set()
_OPEN_LOCK = threading.Lock()


@atexit.register
def _close_all() -> None:
    with _OPEN_LOCK:
        sets = list(_OPEN)
    for made in sets:
        made.close()


class Replication:
    """A master (node 0) and two replicas (nodes 1 and 2) on 127.0.0.1 (see the module's
    docstring). Make one with ``Replication.start()``; it is a context manager."""

    REPLICAS = 2

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.nodes: List[_Node] = []
        self._closed = False
        with _OPEN_LOCK:
            _OPEN.add(self)

    @classmethod
    def start(cls, binary: Optional[str] = None, timeout: float = 30.0) -> Replication:
        found = binary or redis_server_binary()
        if found is None:
            raise FileNotFoundError("no redis-server on PATH (nor $DISTLOCK_SERVER_BIN)")
        made = cls(found)
        try:
            made.nodes = [_Node(found, free_port()) for _ in range(1 + cls.REPLICAS)]
            for node in made.nodes:
                node.spawn()
            made._link(timeout)
        except BaseException:
            made.close()
            raise
        return made

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for node in self.nodes:
            node.stop()
        with _OPEN_LOCK:
            _OPEN.discard(self)

    def __enter__(self) -> Replication:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- addresses and clients ---------------------------------------------------------------

    def port(self, i: int) -> int:
        return self.nodes[i].port

    def url(self, i: int = 0) -> str:
        return f"redis://{HOST}:{self.port(i)}/0"

    def client(self, i: int = 0, **kwargs: Any) -> redis.Redis:
        """A new client of node ``i`` (the master: 0); the caller closes it."""
        kwargs.setdefault("socket_timeout", 5)
        return redis.Redis(host=HOST, port=self.port(i), **kwargs)

    def _ask(self, i: int, *command: Any) -> Any:
        with self.client(i, socket_timeout=2) as conn:
            return conn.execute_command(*command)

    def info(self, i: int) -> dict:  # type: ignore[type-arg]
        with self.client(i, socket_timeout=2) as conn:
            return conn.info("replication")  # type: ignore[no-any-return]

    # --- faults -----------------------------------------------------------------------------

    def stop(self, i: int) -> None:
        """SIGSTOP node ``i``: it stops answering (and acknowledging) until ``resume(i)``."""
        self.nodes[i].signal(signal.SIGSTOP)
        self.nodes[i].stopped = True

    def resume(self, i: int) -> None:
        self.nodes[i].signal(signal.SIGCONT)
        self.nodes[i].stopped = False

    def kill(self, i: int) -> None:
        self.nodes[i].kill()

    def cut(self, i: int) -> None:
        """Cut replica ``i`` off its master for good: it follows a port where nothing listens
        (``REPLICAOF`` keeps the data it has until a sync succeeds, which never happens), so
        every write from now on misses it, however long the test takes."""
        self._ask(i, "REPLICAOF", HOST, str(free_port()))

    def promote(self, i: int) -> None:
        """``REPLICAOF NO ONE`` on node ``i``: it is a master now, with the data it had."""
        self._ask(i, "REPLICAOF", "NO", "ONE")

    def heal(self, timeout: float = 30.0) -> None:
        """Back to a healthy set, empty: every node running, node 0 the master, both replicas
        linked to it."""
        for node in self.nodes:
            if node.stopped:
                node.signal(signal.SIGCONT)
                node.stopped = False
            if not node.alive():
                node.spawn()
        self._link(timeout)

    def _link(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._wait_pings(deadline)
        self._ask(0, "REPLICAOF", "NO", "ONE")
        self._ask(0, "FLUSHALL")
        for i in range(1, len(self.nodes)):
            self._ask(i, "REPLICAOF", HOST, str(self.port(0)))
        while True:
            problem = self._problem()
            if problem is None:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"replicas not linked: {problem}\n"
                                   + "\n".join(n.log_tail() for n in self.nodes))
            time.sleep(POLL)

    def _wait_pings(self, deadline: float) -> None:
        for i, node in enumerate(self.nodes):
            while True:
                if not node.alive():
                    raise RuntimeError(f"node {i} exited: {node.log_tail()}")
                try:
                    self._ask(i, "PING")
                    break
                except redis.RedisError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(POLL)

    def _problem(self) -> Optional[str]:
        """What keeps the set from being healthy, or None."""
        try:
            master = self.info(0)
            if master.get("role") != "master":
                return "node 0 is not a master"
            online = {int(v["port"]) for k, v in master.items()
                      if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"}
            for i in range(1, len(self.nodes)):
                if self.port(i) not in online:
                    return f"node {i} is not online at the master"
                replica = self.info(i)
                if replica.get("master_link_status") != "up":
                    return f"node {i}'s link is {replica.get('master_link_status')}"
            # Linked is not yet acknowledging: right after a (diskless) sync, the first writes
            # wait for the replicas' periodic ACK. A write both acknowledge at once is.
            with self.client(0, socket_timeout=2) as conn:
                pipe = conn.pipeline(transaction=False)
                pipe.set("distlock-test:probe", "1")
                pipe.execute_command("WAIT", len(self.nodes) - 1, 50)
                pipe.delete("distlock-test:probe")
                acked = pipe.execute()[1]
            if int(acked) < len(self.nodes) - 1:
                return f"{acked} replicas acknowledge a write"
        except redis.RedisError as exc:
            return repr(exc)
        return None

    def __repr__(self) -> str:
        return f"<Replication master={self.port(0)} replicas={[self.port(i) for i in (1, 2)]}>"
