"""A private redis-server on a free loopback port, for the demo, the tests and the benchmarks.

``RedisServer()`` starts ``redis-server`` from PATH (or the server binary that
``$DISTLOCK_SERVER_BIN`` names: a ``valkey-server``, say, which is how the tests also run on
Valkey) with no persistence in a temporary directory, bound to 127.0.0.1 only, and waits
until it answers PING. ``stop()`` ends it and
removes the directory; ``restart()`` stops and starts it again on the same port, empty, which
is what a crash of a server without persistence looks like to its clients.
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
from typing import List, Optional

__all__ = ["RedisServer", "redis_server_binary", "free_port"]


def redis_server_binary() -> Optional[str]:
    """``$DISTLOCK_SERVER_BIN`` (a path or a command name; it must exist), else
    ``redis-server`` from PATH, else None."""
    chosen = os.environ.get("DISTLOCK_SERVER_BIN")
    if chosen:
        found = shutil.which(chosen)
        if found is None:
            raise FileNotFoundError(f"DISTLOCK_SERVER_BIN={chosen!r}: no such executable")
        return found
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server process; a context manager."""

    def __init__(self, port: Optional[int] = None, extra_args: Optional[List[str]] = None,
                 binary: Optional[str] = None, die_with_parent: bool = False) -> None:
        """``die_with_parent``: on Linux, started from the main thread, the server runs under
        ``setpriv --pdeathsig KILL`` and dies with this process, however that ends."""
        found = binary or redis_server_binary()
        if found is None:
            raise FileNotFoundError("redis-server is not on PATH")
        self.binary = found
        self.port = port or free_port()
        self.extra_args = list(extra_args or [])
        self.die_with_parent = die_with_parent
        self.dir = tempfile.mkdtemp(prefix="distlock-redis-")
        self.proc: Optional[subprocess.Popen[bytes]] = None
        try:
            self.start()
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)  # nothing else will: there is no server
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", self.dir,
            "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning",
            "--logfile", os.path.join(self.dir, "redis.log"),
            *self.extra_args,
        ]
        linux = sys.platform.startswith("linux")
        setpriv = shutil.which("setpriv") if linux and self.die_with_parent else None
        if setpriv and threading.current_thread() is threading.main_thread():
            args = [setpriv, "--pdeathsig", "KILL", "--", *args]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {self.log()}")
            if self._ping():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"redis-server on port {self.port} did not answer in {timeout}s")
            time.sleep(0.02)

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "redis.log"), encoding="utf-8", errors="replace") as fh:
                return fh.read()[-2000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the server (nothing is saved: it had no persistence)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        """Kill the server and start a new, empty one on the same port."""
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
