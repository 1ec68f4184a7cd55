"""An opt-in pytest plugin: ``distlock_server`` and ``fault_proxy``, fixtures a user's tests take
by name.

Enable it with ``-p distlock.testing.pytest_plugin`` on the command line, or with
``pytest_plugins = ["distlock.testing.pytest_plugin"]`` in the top-level ``conftest.py``.
Importing ``distlock.testing`` does not import this module, nor pytest.

- ``distlock_server``: a ``RedisServer`` (a private ``redis-server``, or
  ``$DISTLOCK_SERVER_BIN``, on a free loopback port), started once per session and emptied
  (``FLUSHALL``) before each test that takes it. Without a server binary the test is skipped,
  with the reason.
- ``fault_proxy``: a ``FaultProxy`` in front of ``distlock_server``, new for each test and closed
  after it, so that one test's faults never reach the next. Connect through ``fault_proxy.url``.
"""

from __future__ import annotations

import os
import socket
from typing import Iterator

import pytest

from .proxy import FaultProxy
from .server import RedisServer, redis_server_binary

__all__ = ["distlock_server", "fault_proxy"]


def _flushall(server: RedisServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5.0) as sock:
        sock.sendall(b"FLUSHALL\r\n")
        reply = sock.recv(64)
    if not reply.startswith(b"+OK"):
        raise RuntimeError(f"FLUSHALL on the test server answered {reply!r}")


@pytest.fixture(scope="session")
def _distlock_session_server() -> Iterator[RedisServer]:
    if redis_server_binary() is None:
        pytest.skip("distlock_server needs redis-server on PATH (or $DISTLOCK_SERVER_BIN)")
    with RedisServer(die_with_parent=True) as server:
        yield server


@pytest.fixture
def distlock_server(_distlock_session_server: RedisServer) -> RedisServer:
    """A private server, empty at the start of the test (``.url``, ``.port``, ``.restart()``)."""
    server = _distlock_session_server
    if server.proc is None or server.proc.poll() is not None:
        # a test killed or stopped it: the next one gets a live, empty one (stop() removed
        # its directory)
        os.makedirs(server.dir, exist_ok=True)
        server.start()
    _flushall(server)
    return server


@pytest.fixture
def fault_proxy(distlock_server: RedisServer) -> Iterator[FaultProxy]:
    """A fault proxy in front of ``distlock_server``, passing everything at the start."""
    with FaultProxy("127.0.0.1", distlock_server.port) as proxy:
        yield proxy
