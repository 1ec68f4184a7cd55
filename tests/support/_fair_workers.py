"""Child processes of tests/primitives/test_fair.py (spawn start method: importable, top-level)."""

from __future__ import annotations

import threading
import time
from typing import Any, List, Optional

import distlock
from distlock._redis.urls import client_from_url


def queue_threads(url: str, name: str, kind: str, n: int, grants: str,
                  wait_cap: Optional[float], conn: Any, fair: bool = True) -> None:
    """Start ``n`` threads that each take the lock ``name`` (fair, unless ``fair`` is False)
    once: inside, they push the nonce of the wait the lock was granted to (the hash's ':n') on
    the list ``grants`` (when one is named), then release. Report how many got it, once all
    are done; linger a moment, as a service would (a default lock's release in its quantum
    has its watchdog wake the next waiter a moment later)."""
    if wait_cap is not None:
        distlock.configure(wait_cap=wait_cap)
    cls = {"DistLock": distlock.DistLock, "DistRLock": distlock.DistRLock}[kind]
    client = client_from_url(url)
    lock_key = f"distlock:{{{name}}}"
    got: List[bool] = []

    def one() -> None:
        lock = cls(name, client=client, fair=fair)
        if lock.acquire(timeout=300):
            if grants:
                client.rpush(grants, client.hget(lock_key, ":n") or b"?")
            lock.release()
            got.append(True)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for thread in threads:
        thread.start()
    conn.send("started")
    for thread in threads:
        thread.join()
    conn.send(len(got))
    time.sleep(0.2)


def wait_and_hold(url: str, name: str, conn: Any) -> None:
    """Wait for the fair lock; report (token, nonce); hold it until told 'release'."""
    client = client_from_url(url)
    lock = distlock.DistLock(name, client=client, fair=True)
    assert lock.acquire(timeout=120)
    conn.send((lock.token, client.hget(f"distlock:{{{name}}}", ":n").decode()))
    try:
        order = conn.recv() if conn.poll(120) else None
    except EOFError:  # the test ended first
        order = None
    if order == "release":
        lock.release()
        conn.send("released")
    time.sleep(0.05)
