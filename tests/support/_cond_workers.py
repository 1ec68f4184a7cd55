"""DistCondition code that runs in child processes (spawn: importable, top-level) or threads.

Each worker talks to the test through one end of a ``multiprocessing.Pipe``; every receive is
bounded, so a worker whose test has gone away exits by itself.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

import distlock
from distlock import DistCondition
from distlock._redis.urls import client_from_url

IDLE_LIMIT = 60.0


def _configure(settings: Optional[Dict[str, float]]) -> None:
    if settings:
        distlock.configure(**settings)


def waiter(client: Any, cond_name: str, label: str, conn: Any,
           settings: Optional[Dict[str, float]] = None) -> None:
    """Wait for ("go", waits, timeout); then, holding the condition's lock all along, wait on
    the condition ``waits`` times in a row. Before each wait send ("waiting", label, k) (the
    lock is held then, so a test that takes the lock after this message knows the wait has
    joined the queue); after it send ("woke", label, k, result). Finally ("done", label).

    ``client`` is a redis.Redis (threads share the test's) or a URL (processes)."""
    _configure(settings)
    cond = DistCondition(cond_name, client=client)
    try:
        conn.send(("ready", label, os.getpid()))
        if not conn.poll(IDLE_LIMIT):
            return
        order = conn.recv()
        if order[0] != "go":
            return
        _go, waits, timeout = order
        with cond:
            for k in range(waits):
                conn.send(("waiting", label, k))
                ok = cond.wait(timeout)
                conn.send(("woke", label, k, ok))
        conn.send(("done", label))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return


def producer(url: str, cond_name: str, counter: str, times: int, pause: float) -> int:
    """``times`` times: under the condition's lock, INCR ``counter`` and notify_all."""
    client = client_from_url(url)
    cond = DistCondition(cond_name, client=client)
    for _ in range(times):
        with cond:
            client.incr(counter)
            cond.notify_all()
        time.sleep(pause)
    client.close()
    return times
