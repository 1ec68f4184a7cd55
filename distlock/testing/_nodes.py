"""What the topologies of ``distlock.testing`` share: a node's address, free ports, a PING, and
one server process in a directory of its own (``Node``; each topology says how it starts).

On Linux a node started from the main thread runs under ``setpriv --pdeathsig KILL`` and dies
with this process, however that ends. Only processes started here are ever signalled.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, List, Optional, Tuple

__all__ = ["Addr", "HOST", "POLL", "Node", "free_ports", "ping", "stop_all", "text",
           "wait_settled"]

#: A node's address: (host, port).
Addr = Tuple[str, int]

HOST = "127.0.0.1"
#: Polling interval of every wait of the topologies (readiness, agreement, failover).
POLL = 0.02


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def free_ports(count: int) -> List[int]:
    """``count`` distinct free loopback ports (all bound at once while they are picked)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((HOST, 0))
            socks.append(sock)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def ping(addr: Addr) -> bool:
    try:
        with socket.create_connection(addr, timeout=0.2) as sock:
            sock.settimeout(0.5)
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class Node:
    """One server process: its ports, directory and process. ``args()`` says how it starts."""

    def __init__(self, binary: str, port: int, bus_port: int = 0, prefix: str = "distlock-node") -> None:
        self.binary = binary
        self.port = port
        self.bus_port = bus_port
        self.dir = tempfile.mkdtemp(prefix=f"{prefix}-{port}-")
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.id = ""

    @property
    def addr(self) -> Addr:
        return (HOST, self.port)

    @property
    def logfile(self) -> str:
        return os.path.join(self.dir, "server.log")

    def args(self) -> List[str]:
        """The command line that starts the node."""
        raise NotImplementedError

    def spawn(self) -> None:
        """Start the process (not waiting for it). From the main thread on Linux it runs
        under ``setpriv --pdeathsig KILL``: it dies with this process, however that ends.
        (The signal follows the thread that started it, hence the main thread only.)"""
        args = self.args()
        setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
        if setpriv and threading.current_thread() is threading.main_thread():
            args = [setpriv, "--pdeathsig", "KILL", "--", *args]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, cwd=self.dir)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def stop(self, grace: float = 5.0) -> None:
        """Terminate, wait ``grace`` seconds, kill if needed; remove the directory."""
        try:
            if self.proc is not None:
                self.terminate()
                try:
                    self.proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, chars: int = 1500) -> str:
        try:
            with open(self.logfile, encoding="utf-8", errors="replace") as fh:
                return fh.read()[-chars:]
        except OSError:
            return ""


def stop_all(nodes: List[Node]) -> None:
    """End every node: all are asked to terminate at once (they shut down in parallel), then
    each is waited for, killed if it lingers, and its directory removed."""
    for node in nodes:
        node.terminate()
    for node in nodes:
        try:
            node.stop()
        except Exception:  # noqa: BLE001 - stop the others all the same
            if node.proc is not None and node.proc.poll() is None:
                node.proc.kill()


def wait_settled(logs: Callable[[], str], what: str, timeout: float,
                 problem: Callable[[], Optional[str]]) -> None:
    """Poll ``problem()`` (None once all is well, else why not) every ``POLL`` seconds until it
    is None; after ``timeout`` seconds raise TimeoutError with the last reason and ``logs()``."""
    deadline = time.monotonic() + timeout
    while True:
        reason = problem()
        if reason is None:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s: {reason}\n{logs()}")
        time.sleep(POLL)
