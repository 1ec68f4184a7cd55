"""Child processes of tests/primitives/test_shares.py (spawn start method: importable, top-level)."""

from __future__ import annotations

import time
from typing import Any, Optional

from _fair_workers import queue_threads

import distlock
from distlock._redis.urls import client_from_url

KINDS = {"DistLock": distlock.DistLock, "DistRLock": distlock.DistRLock}


def hog(url: str, name: str, kind: str, max_ops: int, max_s: float, conn: Any) -> None:
    """Take and release ``name`` back to back, at most ``max_ops`` times or ``max_s`` seconds,
    until told 'stop'; report how many times, and whether it was told to stop."""
    client = client_from_url(url)
    lock = KINDS[kind](name, client=client)
    conn.send("started")
    ops = 0
    stopped = False
    end = time.monotonic() + max_s
    while ops < max_ops and time.monotonic() < end:
        if conn.poll():
            stopped = conn.recv() == "stop"
            break
        assert lock.acquire(timeout=60)
        ops += 1
        lock.release()
    conn.send((ops, stopped))


def share(url: str, name: str, kind: str, counter: str, total: int, conn: Any) -> None:
    """Increment ``counter`` (GET, then SET: the lock must exclude) under ``name`` until it
    reaches ``total``; report how many increments this process made."""
    client = client_from_url(url)
    lock = KINDS[kind](name, client=client)
    conn.send("ready")
    assert conn.recv() == "go"
    mine = 0
    while True:
        assert lock.acquire(timeout=60)
        try:
            value = int(client.get(counter) or 0)
            if value >= total:
                break
            client.set(counter, value + 1)
            mine += 1
        finally:
            lock.release()
    conn.send(mine)


def take_once(url: str, name: str, kind: str, n: int, wait_cap: Optional[float], conn: Any) -> None:
    """``n`` threads each take the default lock ``name`` once (see _fair_workers.queue_threads)."""
    queue_threads(url, name, kind, n, "", wait_cap, conn, fair=False)
